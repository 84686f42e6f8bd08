"""Job files of the scenario runner (testbed/run/jobs.py `build_jobs`, the models of
testbed_core/contracts/worker_job.py), read back by the worker
(testbed/training/worker/job.py `parse_job`): one worker per (pipeline, rank) on its
placed host, one channel per (pipeline, boundary) with the right ends, ports, streams
and WAN links, the temporal plan handed to the senders, BubbleTea's slot feed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.run.common import RunnerError
from testbed.run.jobs import build_jobs
from testbed.run.ports import RANGE_SIZE, PortPlan
from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant, variant_names
from testbed.training.worker.job import WorkerError, parse_job
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.worker_job import ProbeJob, TrainJob, TransportJob
from testbed_core.planning.streams import choose_streams
from testbed_core.planning.wan_paths import pipeline_crossings
from testbed_core.variants import get_variant

ROOT = Path(__file__).resolve().parents[3]
TRANSPORT = TransportJob(chunk_bytes=4 << 20, congestion=None, pacing_rate_mbps=None, connect_timeout_s=10.0)


def scenario_file(tmp_path: Path, topology: str = "2dc.yaml", **workload_changes) -> Path:
    wl = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    for dotted, value in workload_changes.items():
        section, key = dotted.split("__")
        wl[section][key] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "jobs-test", "topology": str(ROOT / "topologies" / topology), "workload": wl,
        "variants": ["baseline", "multi-tcp", "atlas"],
    }))
    return path


def jobs_for(tmp_path: Path, variant: str, topology: str = "2dc.yaml", **changes):
    scenario, _ = load_scenario(scenario_file(tmp_path, topology, **changes))
    workload = scenario.workload
    setup = plan_variant(variant, scenario, workload, None, None, None)
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j}" for i, dc in enumerate(scenario.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    jobs = build_jobs(setup=setup, workload=workload, topology=scenario.topology, host_ips=ips,
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=3,
                      transport=TRANSPORT)
    return setup, jobs, ips


def test_atlas_on_2dc_one_worker_per_pipeline_and_rank(tmp_path: Path) -> None:
    setup, jobs, ips = jobs_for(tmp_path, "atlas")
    assert sorted(jobs) == ["p0r0", "p0r1", "p1r0", "p1r1"]
    hosts = {w: j.host for w, j in jobs.items()}
    assert hosts == {"p0r0": "dc1-h1", "p1r0": "dc1-h2", "p0r1": "dc2-h1", "p1r1": "dc2-h2"}
    for w, j in jobs.items():
        parsed = parse_job(j.model_dump_json(), w)  # what the worker reads is what the runner built
        assert isinstance(parsed, TrainJob) and parsed == j
        assert parsed.device.name.startswith(j.host)
        assert parsed.wire_bytes == setup.prediction.effective.wire_activation_bytes
    up, down = jobs["p0r0"].channels, jobs["p0r1"].channels
    assert len(up) == len(down) == 1
    assert up[0].role == "connect" and down[0].role == "listen"
    assert up[0].port == down[0].port
    assert up[0].peer_ip == ips["dc2-h1"] and down[0].peer_ip == ips["dc1-h1"]
    assert up[0].links == ["dc1->dc2"] and up[0].recv_links == ["dc2->dc1"]
    assert down[0].links == ["dc2->dc1"] and down[0].recv_links == ["dc1->dc2"]
    assert up[0].streams == setup.streams > 1
    assert up[0].latency_s == pytest.approx(0.025)
    ports = {j.channels[0].port for j in jobs.values()}
    assert ports == {30000, 30001}  # one per (pipeline, boundary) channel


def test_atlas_plan_goes_to_the_senders(tmp_path: Path) -> None:
    setup, jobs, ips = jobs_for(tmp_path, "atlas")
    plan = setup.prediction.plan
    assert plan is not None
    m = 8
    for d in range(2):
        fwd = jobs[f"p{d}r0"].temporal.sends
        bwd = jobs[f"p{d}r1"].temporal.sends
        assert {p.direction for p in fwd} == {"fwd"} and {p.direction for p in bwd} == {"bwd"}
        assert sorted(p.mb for p in fwd) == list(range(m)) == sorted(p.mb for p in bwd)
        assert [p.start_s for p in fwd] == sorted(p.start_s for p in fwd)
        assert jobs[f"p{d}r0"].offset_s == plan.offsets[d] == jobs[f"p{d}r1"].offset_s
        assert all(p.duration_s > 0 for p in fwd + bwd)
    # each link direction's token order: positions 0..31, each pointing at the next holder
    for link, senders in (("dc1->dc2", ("p0r0", "p1r0")), ("dc2->dc1", ("p0r1", "p1r1"))):
        entries = [(t[1], w, p) for w in senders for p in jobs[w].temporal.sends for t in p.tokens if t[0] == link]
        assert sorted(i for i, _, _ in entries) == list(range(2 * m))
        by_pos = {i: (w, p) for i, w, p in entries}
        for i in range(2 * m - 1):
            (_, p), (next_worker, _) = by_pos[i], by_pos[i + 1]
            assert p.next == [(link, i + 1, next_worker)]
        assert by_pos[2 * m - 1][1].next == []
    for w in ("p0r0", "p1r0", "p0r1", "p1r1"):
        t = jobs[w].temporal
        assert t.mode == "token" and t.token_bus.port >= 30000 + RANGE_SIZE
        assert set(t.token_bus.peers) == {"p0r0", "p1r0", "p0r1", "p1r1"}
        assert t.token_bus.peers["p1r0"][0] == ips["dc1-h2"]
        assert parse_job(jobs[w].model_dump_json(), w) == jobs[w]


def test_token_margin_lengthens_the_planned_hold(tmp_path: Path) -> None:
    from testbed.run.calibration import Calibration

    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.025, rates_bps={1: 1.2e8, 8: 7e8})  # atlas: 8 streams
    holds = {}
    for margin in (0.0, 0.5):
        scenario, _ = load_scenario(scenario_file(tmp_path), {"runner.token_margin": margin,
                                                              "runner.atlas_sharing": "temporal"})
        workload = scenario.workload
        setup = plan_variant("atlas", scenario, workload, None, cal, None)
        plan = setup.prediction.plan
        holds[margin] = [e - s for s, e in plan.slots.values()]
        assert setup.rate_bps == pytest.approx(7e8 / (1 + margin))
    assert sum(holds[0.5]) == pytest.approx(1.5 * sum(holds[0.0]))


def test_atlas_keeps_the_stream_count_the_calibration_measured_faster(tmp_path: Path) -> None:
    from testbed.run.calibration import Calibration

    scenario, _ = load_scenario(scenario_file(tmp_path))
    workload = scenario.workload
    # a long path: one flow 28 Mbit/s, so filling the link by formula asks for 31 streams,
    # but 31 streams collapsed to half of what 8 carried
    slow = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.1, rates_bps={1: 2.8e7, 8: 2.76e8, 31: 1.4e8})
    assert plan_variant("atlas", scenario, workload, None, slow, None).streams == 8
    fast = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.1, rates_bps={1: 2.8e7, 8: 2.76e8, 31: 8.5e8})
    assert plan_variant("atlas", scenario, workload, None, fast, None).streams == 31
    # a short path (10 ms RTT): one flow nearly fills the link, 8 overflow its queue
    short = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.005, rates_bps={1: 5.15e8, 8: 4.0e8})
    assert plan_variant("atlas", scenario, workload, None, short, None).streams == 1
    # within the margin of the fastest, the fewest streams: one stream as fast as eight has no tail
    close = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.005, rates_bps={1: 5.0e8, 8: 5.15e8})
    assert plan_variant("atlas", scenario, workload, None, close, None).streams == 1
    apart = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.005, rates_bps={1: 4.8e8, 8: 5.15e8})
    setup = plan_variant("atlas", scenario, workload, None, apart, None)
    # the stream policy's count is 8 (Atlas's own configuration); what runs is the
    # configuration predicted fastest (test_atlas_configuration_choice.py)
    own = next(c for c in setup.configurations if c.own)
    assert own.streams == 8
    fastest = min(c.predicted_iteration_time_s for c in setup.configurations)
    assert setup.prediction.iteration_time_s <= fastest * 1.01


def test_atlas_sharing_follows_the_calibrated_prediction(tmp_path: Path) -> None:
    """When holding the link for one transfer at a time is predicted slower than
    sharing it (here: a token margin of 200% triples every planned hold), "auto" runs
    atlas with shared links and keeps both predictions; with the default margin the
    plan wins; "temporal" and "shared" force the choice."""
    from testbed.run.calibration import Calibration

    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.025, rates_bps={1: 1.1e8, 8: 6.9e8},
                      colliding_bps={8: 6.0e8})
    picked = {}
    for margin in (0.2, 2.0):
        for mode in ("auto", "temporal", "shared"):
            scenario, _ = load_scenario(scenario_file(tmp_path), {"runner.atlas_sharing": mode,
                                                                  "runner.token_margin": margin})
            workload = scenario.workload
            setup = plan_variant("atlas", scenario, workload, None, cal, None)
            assert (setup.prediction.plan is not None) == (setup.sharing == "temporal")
            assert setup.variant.sharing == setup.sharing
            picked[margin, mode] = setup
    slow = picked[2.0, "auto"]
    assert slow.sharing == "shared"
    assert slow.sharing_alternatives["shared"] < slow.sharing_alternatives["temporal"] * 0.97
    assert slow.prediction.iteration_time_s == pytest.approx(slow.sharing_alternatives["shared"])
    assert slow.rate_bps == pytest.approx(6.9e8)  # no token margin when shared
    fast = picked[0.2, "auto"]
    assert fast.sharing == "temporal" and fast.rate_bps == pytest.approx(6.9e8 / 1.2)
    assert fast.prediction.iteration_time_s == pytest.approx(fast.sharing_alternatives["temporal"])
    for margin in (0.2, 2.0):
        forced = picked[margin, "temporal"]
        assert forced.sharing == "temporal" and forced.sharing_alternatives is None
        assert picked[margin, "shared"].sharing == "shared" and picked[margin, "shared"].prediction.plan is None
    _, jobs, _ = jobs_for(tmp_path, "baseline")
    assert all(j.temporal is None for j in jobs.values())


def test_atlas_sharing_setting_is_validated(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="atlas_sharing"):
        load_scenario(scenario_file(tmp_path), {"runner.atlas_sharing": "sometimes"})


def test_baseline_has_one_stream_and_no_plan(tmp_path: Path) -> None:
    setup, jobs, _ = jobs_for(tmp_path, "baseline")
    assert setup.streams == 1
    assert all(j.temporal is None and j.offset_s == 0 for j in jobs.values())
    assert all(c.streams == 1 for j in jobs.values() for c in j.channels)


def test_lan_boundary_has_no_links_and_one_stream(tmp_path: Path) -> None:
    setup, jobs, _ = jobs_for(tmp_path, "atlas", parallelism__pp=3, parallelism__dp=1)
    # atlas places 2 stages in dc1 (2 free GPUs) and 1 in dc2
    assert [jobs[f"p0r{r}"].host[:3] for r in range(3)] == ["dc1", "dc1", "dc2"]
    lan = next(c for c in jobs["p0r0"].channels if c.boundary == 0)
    wan = next(c for c in jobs["p0r1"].channels if c.boundary == 1)
    assert lan.links == [] and lan.streams == 1 and lan.latency_s == 0
    assert wan.links == ["dc1->dc2"] and wan.streams == setup.streams
    assert {p.boundary for p in jobs["p0r1"].temporal.sends} == {1}
    assert jobs["p0r0"].temporal is None  # its only send stays in the DC: nothing planned


def test_multi_hop_route_lists_every_link(tmp_path: Path) -> None:
    topo = yaml.safe_load((ROOT / "topologies/3dc-triangle.yaml").read_text())
    topo["dcs"][1]["hosts"] = 1  # dc2 too small for a stage of 4 replicas: stages go to dc1 and dc3
    (tmp_path / "tri.yaml").write_text(yaml.safe_dump(topo))
    _, jobs, _ = jobs_for(tmp_path, "atlas", str(tmp_path / "tri.yaml"), parallelism__dp=4)
    assert [jobs[f"p0r{r}"].host[:3] for r in range(2)] == ["dc1", "dc3"]
    up = jobs["p0r0"].channels[0]
    assert up.links == ["dc1->dc2", "dc2->dc3"]  # lowest latency: 10 + 15 ms, not the direct 40 ms
    assert up.recv_links == ["dc3->dc2", "dc2->dc1"]
    assert up.latency_s == pytest.approx(0.025)


def test_interleaved_schedule_channels_wrap_around(tmp_path: Path) -> None:
    _, jobs, _ = jobs_for(tmp_path, "baseline", parallelism__schedule="interleaved-1f1b",
                          parallelism__chunks=2)
    roles = sorted((c.boundary, c.role) for c in jobs["p0r0"].channels)
    # virtual stages 0..3: rank 0 holds 0 and 2, rank 1 holds 1 and 3
    assert roles == [(0, "connect"), (1, "listen"), (2, "connect")]


def test_bubbletea_variant_publishes_planned_idle_slots(tmp_path: Path) -> None:
    _, jobs, _ = jobs_for(tmp_path, "atlas+bubbletea")
    for j in jobs.values():
        assert j.slots_path.endswith(f"{j.device.name}.jsonl")
        assert j.idle_slots and all(e > s for s, e in j.idle_slots)
    _, plain, _ = jobs_for(tmp_path, "atlas")
    assert all(j.slots_path is None and j.idle_slots == [] and j.live is None for j in plain.values())


def test_stream_choice_per_variant(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path))
    assert choose_streams(get_variant("baseline"), scenario.transport.streams, 1e8, 1e9, None) == 1
    assert choose_streams(get_variant("multi-tcp"), scenario.transport.streams, 1e8, 1e9, None) == 8
    # enough streams to fill the goodput of the link (85% of 1 Gbit/s at 80 Mbit/s per flow)
    assert choose_streams(get_variant("atlas"), scenario.transport.streams, 8e7, 1e9, None) == 11
    assert choose_streams(get_variant("atlas"), scenario.transport.streams, 1.1e8, 1e9, None) == 8
    assert choose_streams(get_variant("atlas"), scenario.transport.streams, 5e8, 1e9, None) == 8  # never fewer than configured
    scenario, _ = load_scenario(scenario_file(tmp_path), {"transport.streams": "auto"})
    assert choose_streams(get_variant("multi-tcp"), scenario.transport.streams, 1e8, 1e9, 4) == 4  # the calibrated best


def test_variant_names_add_bubbletea_runs(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path), {"bubbletea.enabled": True})
    assert variant_names(scenario) == ["baseline", "baseline+bubbletea", "multi-tcp", "multi-tcp+bubbletea",
                                       "atlas", "atlas+bubbletea"]
    scenario, _ = load_scenario(scenario_file(tmp_path))
    assert variant_names(scenario, ["atlas", "baseline"]) == ["atlas", "baseline"]
    with pytest.raises(RunnerError, match="unknown variant.*atlass.*allowed: baseline"):
        variant_names(scenario, ["atlass"])


def test_the_crossings_follow_each_pipelines_first_boundary_across(tmp_path: Path) -> None:
    setup, _, _ = jobs_for(tmp_path, "atlas")
    assert pipeline_crossings(setup.placement) == {("dc1", "dc2"): [("dc1-h1", "dc2-h1"), ("dc1-h2", "dc2-h2")]}


def test_an_interleaved_schedule_also_crosses_from_its_last_stage_back_to_its_first(tmp_path: Path) -> None:
    """With chunks, the last stage hands each chunk back to the first: on three DCs in a
    row (stages mid, big, small) that is a third WAN path, small -> mid, which the
    calibration probes and the planner's rates cover like the others; 1F1B crosses two."""
    changes = {"parallelism__pp": 3, "parallelism__num_micro_batches": 6}
    setup, _, _ = jobs_for(tmp_path, "baseline", "3dc-unequal.yaml", parallelism__schedule="interleaved-1f1b",
                           parallelism__chunks=2, **changes)
    placement = setup.placement
    assert placement.stage_dc[0] == ("mid", "big", "small")
    assert placement.wrap and placement.next_stage(2) == 0
    assert [(c.boundary, c.src, c.dst) for c in placement.crossings()] == [
        (0, "mid", "big"), (1, "big", "small"), (2, "small", "mid")]
    assert list(pipeline_crossings(placement)) == [("mid", "big"), ("big", "small"), ("small", "mid")]
    plain, _, _ = jobs_for(tmp_path, "baseline", "3dc-unequal.yaml", **changes)
    assert not plain.placement.wrap
    assert list(pipeline_crossings(plain.placement)) == [("mid", "big"), ("big", "small")]


def test_pp1_has_no_boundary_and_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match="same rank"):
        jobs_for(tmp_path, "baseline", parallelism__pp=1, parallelism__schedule="interleaved-1f1b",
                 parallelism__chunks=2)


def test_job_errors_name_the_field(tmp_path: Path) -> None:
    import json

    from testbed.training.worker.job import load_job

    transport = TRANSPORT.model_dump()
    with pytest.raises(WorkerError, match="job.json: role 'trian' is not one of train, probe-send, probe-recv"):
        parse_job('{"role": "trian"}', "job.json")
    with pytest.raises(WorkerError, match="job.json: the job has no 'role'"):
        parse_job("{}", "job.json")
    with pytest.raises(WorkerError, match="j.json: port: Input should be less than or equal to 65535"):
        parse_job(json.dumps({"role": "probe-send", "name": "x", "port": 70000, "streams": 1, "nbytes": 1,
                              "count": 1, "out": "o", "transport": transport}), "j.json")
    with pytest.raises(WorkerError, match="a job is a JSON object"):
        parse_job("[1, 2]", "j.json")
    with pytest.raises(WorkerError, match="j.json: not JSON"):
        parse_job("{nope", "j.json")
    with pytest.raises(WorkerError, match="no such job file"):
        load_job(tmp_path / "missing.json")
    probe = parse_job(json.dumps({"role": "probe-recv", "name": "x", "port": 7000, "streams": 2, "nbytes": 10,
                                  "count": 3, "out": "o", "transport": transport}))
    assert isinstance(probe, ProbeJob)
    # a training job states every setting: a missing one is an error, not a default of the worker's
    _, jobs, _ = jobs_for(tmp_path, "baseline")
    data = json.loads(jobs["p0r0"].model_dump_json())
    del data["timeout_s"]
    with pytest.raises(WorkerError, match="p0r0.json: timeout_s: Field required"):
        parse_job(json.dumps(data), "p0r0.json")


def test_dp_across_dc_keeps_pipelines_in_a_dc_and_all_reduces_across_the_wan(tmp_path: Path) -> None:
    """Each pipeline wholly in one DC: no boundary channel crosses the WAN, while every
    worker's DP channel does, one stream per flow; the gradients on the wire are
    the stage's parameters x bf16 bytes x scale."""
    setup, jobs, ips = jobs_for(tmp_path, "dp-across-dc")
    eff = setup.prediction.effective
    scale = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())["scale"]
    for job in jobs.values():
        assert all(not c.links for c in job.channels)  # boundary channels stay in the DC
        assert job.dp is not None and job.dp.dp == 2 and job.dp.dp_rank == job.pipeline
        (peer,) = job.dp.peers
        assert peer.streams == setup.streams == 1 and peer.peer_ip == ips[jobs[peer.peer].host]
        assert dc_of_host(job.host) != dc_of_host(jobs[peer.peer].host)
        assert job.dp.grad_bytes == int(eff.stage_params[job.rank] * 2 * scale)
    assert setup.prediction.allreduce_s > 0


def test_dp_across_dc_is_refused_when_the_allreduce_is_off(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path), {"runner.dp_allreduce": False})
    with pytest.raises(RunnerError, match=r"dp-across-dc puts each pipeline in one DC, .*runner.dp_allreduce is "
                                          r"false: the result would be compute alone. Set runner.dp_allreduce: true"):
        plan_variant("dp-across-dc", scenario, scenario.workload, None, None, None)


def test_agent_jobs_share_the_device_and_split_the_request_rate(tmp_path: Path) -> None:
    from testbed.run.bubbletea import Endpoint, build_agent_jobs

    _, jobs, _ = jobs_for(tmp_path, "atlas+bubbletea")
    scenario, _ = load_scenario(scenario_file(tmp_path), {"bubbletea.enabled": True})
    workload = scenario.workload
    # each agent ships to a decode server on its own host's DC (same host here: LAN)
    decode = {wid: Endpoint(host=j.host, ip="10.0.1.10", port=32500) for wid, j in jobs.items()}
    agents = build_agent_jobs(jobs, tmp_path / "v", scenario, workload, None, decode, 120.0)
    assert sorted(agents) == sorted(jobs)
    assert sorted(a.agent_index for a in agents.values()) == [0, 1, 2, 3]
    for wid, a in agents.items():
        assert a.device.name == jobs[wid].device.name and str(a.slots_path) == jobs[wid].slots_path
        assert a.host == jobs[wid].host and a.agent_count == 4
        assert (a.decode.host, a.decode.port) == ("10.0.1.10", 32500)
        assert a.gpu.type == "A100" and a.wire_scale == scenario.bubbletea.kv_wire_scale


def test_transport_pacing_reaches_the_workers_sockets(tmp_path: Path) -> None:
    """`transport.pacing: true` gives every stream a SO_MAX_PACING_RATE (Linux's internal
    TCP pacing), through the job file to the worker's TransportConfig; off by default."""
    from testbed.run.common import PACING_CAP_MBPS, transport_job
    from testbed.training.worker.channels import transport_config

    off, _ = load_scenario(scenario_file(tmp_path))
    on, _ = load_scenario(scenario_file(tmp_path), {"transport.pacing": True})
    assert transport_job(off.transport).pacing_rate_mbps is None
    assert transport_job(on.transport) == TRANSPORT.model_copy(update={"pacing_rate_mbps": PACING_CAP_MBPS})
    assert PACING_CAP_MBPS * 1e6 / 8 < 2**31  # setsockopt takes a C int of bytes/s
    workload = on.workload
    setup = plan_variant("multi-tcp", on, workload, None, None, None)
    jobs = build_jobs(setup=setup, workload=workload, topology=on.topology,
                      host_ips={f"{dc.name}-{h}": "10.0.0.1" for dc in on.topology.dcs for h in dc.hosts},
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=1,
                      transport=transport_job(on.transport))
    job = parse_job(jobs["p0r0"].model_dump_json(), "p0r0")
    assert transport_config(job.transport, 8).pacing_rate_mbps == PACING_CAP_MBPS
    with pytest.raises(Exception, match="pacing"):
        load_scenario(scenario_file(tmp_path), {"transport.pacing": "sometimes"})


def test_torch_gloo_jobs_join_one_group_with_the_baselines_placement(tmp_path: Path) -> None:
    """torch-gloo: one gloo rank per worker (pipeline x pp + rank), the store on rank 0's
    host at the run's store port, the rank across each boundary, each stage's DP group;
    its placement and single streams are the baseline's; no atlas channel is opened."""
    base, _, _ = jobs_for(tmp_path, "baseline")
    setup, jobs, ips = jobs_for(tmp_path, "torch-gloo")
    assert setup.placement.stage_dc == base.placement.stage_dc and setup.streams == 1
    ranks = {w: j.gloo.rank for w, j in jobs.items()}
    assert ranks == {"p0r0": 0, "p0r1": 1, "p1r0": 2, "p1r1": 3}
    for w, job in jobs.items():
        g = job.gloo
        assert g.world_size == 4 and g.store_ip == ips[jobs["p0r0"].host] and g.port == PortPlan(30000).store.first
        assert g.own_ip == ips[job.host] and g.dp_groups == [[0, 2], [1, 3]] and g.dp_group == job.rank
        assert g.peers == {0: ranks[f"p{job.pipeline}r{1 - job.rank}"]}
        assert parse_job(job.model_dump_json(), w) == job
    from testbed.training.worker.channels import _ends

    assert all(_ends(job) == [] for job in jobs.values())



def test_verified_workers_hold_their_devices_for_the_compute_alone(tmp_path: Path) -> None:
    # runner.verify_tensors: the prediction's stage times carry the tensor checks, but the
    # workers fill and check their tensors for real, so their modelled holds are the compute
    # model's (holding the checks too paid each one twice: faults-2dc ran 6-10% over its plan)
    from testbed.run.variants import predict_variant
    from testbed_core.planning.host_cpu import HostCost

    scenario, _ = load_scenario(scenario_file(tmp_path))
    workload = scenario.workload
    setup = plan_variant("atlas", scenario, workload, None, None, None)
    setup.host_cost = HostCost(fill_s=0.004, check_s=0.015)
    setup.prediction = predict_variant(setup, scenario, workload, None, None, None, False)
    compute = workload.effective()
    assert setup.prediction.effective.stage_forward_s[1] == pytest.approx(compute.stage_forward_s[1] + 0.015)
    jobs = build_jobs(setup=setup, workload=workload, topology=scenario.topology,
                      host_ips={h: "10.0.0.1" for dc in scenario.topology.dcs for h in (f"{dc.name}-{x}" for x in dc.hosts)},
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=3,
                      transport=TRANSPORT)
    for job in jobs.values():
        assert job.forward_s == pytest.approx(compute.stage_forward_s, abs=1e-12)
        assert job.backward_s == pytest.approx(compute.stage_backward_s, abs=1e-12)
