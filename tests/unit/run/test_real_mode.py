"""Real-device runs of `testbed run` (``workload.gpu.mode: real``; the workers' side in
testbed/training/real_mode.py, the runner's check in testbed/run/real_check.py): the
switch and its error messages, the job files of a real variant, the equivalence
check against the one-process reference, and `testbed run --local` of
scenarios/real-tiny-2dc.yaml end to end (every variant's parameters equal the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from click.testing import CliRunner

from testbed.run import real_check
from testbed.run.common import RUN_PRELOAD, RunnerError, run_preload
from testbed.run.jobs import build_jobs, dp_sync_jobs
from testbed.run.ports import PortPlan
from testbed.run.real_check import RealModeError, equivalence, model_params, resolve_device
from testbed.run.scenario import ScenarioError, load_scenario
from testbed.run.variants import plan_variant
from testbed.training.worker.job import WorkerError, parse_job
from testbed.training.worker.real import end_real_iteration, real_work_of
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.summary import RealCheckSkipped
from testbed_core.contracts.worker_job import TrainJob, TransportJob
from testbed_core.workload import WorkloadError, load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "real-tiny-2dc.yaml"


def real_tiny(**changes) -> dict:
    wl = yaml.safe_load((ROOT / "scenarios/workloads/tiny.yaml").read_text())
    wl["gpu"]["mode"] = "real"
    wl["real"] = {"optimizer": {"kind": "sgd", "lr": 0.5}}
    for dotted, value in changes.items():
        node = wl
        *path, last = dotted.split("__")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return wl


def scenario_file(tmp_path: Path, workload: dict, topology: Path = ROOT / "topologies/2dc.yaml", **extra) -> Path:
    doc = {"name": "real-test", "topology": str(topology), "workload": workload,
           "variants": ["baseline", "multi-tcp", "atlas"], **extra}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(real_check, "cuda_available", lambda: False)


# ------------------------------------------------------------------ the switch and its messages


def test_the_shipped_scenario_is_real_and_loads(no_cuda) -> None:
    scenario, _ = load_scenario(SCENARIO)
    wl = scenario.workload
    assert wl.gpu.mode == "real" and wl.scale == 1 and wl.real.device == "auto"
    assert scenario.variants == ["baseline", "multi-tcp", "atlas"]
    assert resolve_device(wl) == "cpu"
    assert model_params(wl) == 234_880  # what testbed/training/model.py builds (untied head)
    # a modelled GPU stays the default
    assert load_workload(ROOT / "scenarios/workloads/tiny.yaml").gpu.mode == "modelled"


def test_a_real_runs_fork_server_imports_what_the_optimizers_import(tmp_path) -> None:
    """torch's optimizers import torch._dynamo on first use (about a CPU second): a real
    run's fork server imports it once for all its workers; a modelled run's has no use for it."""
    real, _ = load_scenario(SCENARIO)
    assert run_preload(real) == (*RUN_PRELOAD, "torch._dynamo")
    modelled, _ = load_scenario(scenario_file(tmp_path, real_tiny(gpu__mode="modelled")))
    assert run_preload(modelled) == RUN_PRELOAD


def test_a_model_too_big_for_the_cpu_is_refused_with_its_size_and_what_to_do(tmp_path, no_cuda) -> None:
    big = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    big["gpu"]["mode"] = "real"
    big["scale"] = 1.0
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario_file(tmp_path, big))
    msg = str(err.value)
    n = model_params(parse_workload(big))
    assert f"has {n:,} parameters, too many to train on the CPU" in msg
    assert "real.cpu_max_params is 25,000,000" in msg and "no CUDA device is present" in msg
    assert "use gpu.mode: modelled" in msg and "a machine with CUDA" in msg and "s.yaml" in msg
    # the same through the CLI, before anything is built (no root needed to be told)
    res = CliRunner().invoke(_cli(), ["run", str(tmp_path / "s.yaml"), "--local", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "too many to train on the CPU" in res.output
    assert not (tmp_path / "o").exists()
    # raising the limit lets it through (the user's explicit choice)
    big["real"] = {"cpu_max_params": 2_000_000_000}
    scenario, _ = load_scenario(scenario_file(tmp_path, big))
    assert scenario.workload.real.cpu_max_params == 2_000_000_000


def _cli():
    from testbed.cli import main

    return main


def test_cuda_asked_for_without_cuda_is_refused(tmp_path, no_cuda) -> None:
    with pytest.raises(ScenarioError, match=r"real.device is cuda, but torch sees no CUDA device on this machine; "
                                            r"use real.device: auto \(or cpu\)"):
        load_scenario(scenario_file(tmp_path, real_tiny(real__device="cuda")))


def test_with_cuda_the_device_is_cuda_unless_memory_is_short() -> None:
    wl = parse_workload(real_tiny())
    assert resolve_device(wl, cuda=True, free_bytes=lambda: 80 << 30) == "cuda"
    assert resolve_device(parse_workload(real_tiny(real__device="cpu")), cuda=True) == "cpu"
    with pytest.raises(RealModeError, match=r"needs about .* GB of GPU memory for 2 replicas and the one-process "
                                            r"reference, and 0.0 GB are free"):
        resolve_device(wl, cuda=True, free_bytes=lambda: 1000)
    big = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    big["gpu"]["mode"], big["scale"] = "real", 1.0
    assert resolve_device(parse_workload(big), cuda=True, free_bytes=lambda: 140 << 30) == "cuda"
    big["real"] = {"device": "cpu"}
    with pytest.raises(RealModeError, match="too many to train on the CPU .* and real.device is cpu"):
        resolve_device(parse_workload(big), cuda=True)


def test_real_mode_needs_scale_one_and_a_known_mode() -> None:
    with pytest.raises(WorkloadError, match=r"gpu.mode real sends the real activations and gradients, so scale must "
                                            r"be 1 \(got 0.1\); set scale: 1, or use gpu.mode: modelled"):
        parse_workload(real_tiny(scale=0.1), "w.yaml")
    with pytest.raises(WorkloadError, match=r"gpu.mode: Input should be 'modelled' or 'real' \(got 'fast'\)"):
        parse_workload(real_tiny(gpu__mode="fast"), "w.yaml")
    with pytest.raises(WorkloadError, match=r"real.optimizer.kind: Input should be 'sgd' or 'adam'"):
        parse_workload(real_tiny(real__optimizer={"kind": "lamb"}), "w.yaml")
    with pytest.raises(WorkloadError, match=r"real.colour: unknown field"):
        parse_workload(real_tiny(real__colour=1), "w.yaml")


# ------------------------------------------------------------------ job building


def jobs_for(tmp_path: Path, variant: str, workload: dict, **extra):
    scenario, _ = load_scenario(scenario_file(tmp_path, workload, **extra))
    return jobs_of(tmp_path, variant, scenario)


def jobs_of(tmp_path: Path, variant: str, scenario):
    wl = scenario.workload
    setup = plan_variant(variant, scenario, wl, None, None, None)
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j}" for i, dc in enumerate(scenario.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    run_dir = tmp_path / variant / "run"
    jobs = build_jobs(setup=setup, workload=wl, topology=scenario.topology, host_ips=ips, run_dir=run_dir,
                      control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=4,
                      transport=TransportJob(chunk_bytes=4 << 20, congestion=None, pacing_rate_mbps=None,
                                             connect_timeout_s=10.0))
    return setup, wl, jobs, ips


@pytest.mark.parametrize("variant", ["baseline", "atlas"])
def test_real_jobs_train_their_stages_and_pair_the_dp_replicas(tmp_path, no_cuda, variant) -> None:
    setup, wl, jobs, ips = jobs_for(tmp_path, variant, real_tiny())
    assert sorted(jobs) == ["p0r0", "p0r1", "p1r0", "p1r1"]
    for wid, job in jobs.items():
        parsed = parse_job(job.model_dump_json(), wid)
        assert isinstance(parsed, TrainJob) and parsed.real is not None and parsed == job
        assert parsed.device.mode == "real" and parsed.device.torch_device == "cpu"
        assert parsed.real.stages == [parsed.rank] and parsed.real.dp_rank == parsed.pipeline
        assert parsed.real.seed == 0 and parsed.real.optimizer.lr == 0.5 and parsed.real.threads == 1
        assert parsed.real.out == str(tmp_path / variant / "params" / f"{wid}.pt")
        assert parsed.real.workload == wl
        # boundary channels are those of a modelled run: the real tensors use them
        assert [c.boundary for c in parsed.channels] == [0]
        (peer,) = parsed.dp.peers
        assert peer.dp_rank == 1 - parsed.pipeline and peer.peer == f"p{1 - parsed.pipeline}r{parsed.rank}"
        assert peer.role == ("listen" if parsed.pipeline == 0 else "connect")
        assert peer.peer_ip == ips[jobs[peer.peer].host]
        # Atlas and even placements keep a stage's replicas in one DC: one stream on the LAN
        assert dc_of_host(job.host) == dc_of_host(jobs[peer.peer].host) and peer.streams == 1
    ports = {j.dp.peers[0].port for j in jobs.values()}
    first = PortPlan(30000).dp_gradients.first
    assert ports == {first, first + 1}  # one per rank
    if variant == "atlas":
        assert any(j.temporal for j in jobs.values())  # the temporal plan still goes to the senders


def test_modelled_jobs_stay_modelled(tmp_path) -> None:
    wl = real_tiny(gpu__mode="modelled")
    _, _, jobs, _ = jobs_for(tmp_path, "atlas", wl)
    for wid, job in jobs.items():
        assert job.device.mode == "modelled" and job.device.torch_device is None and job.real is None
        # ... and all-reduce placeholder gradients of their stage's size with the other replica
        assert job.dp is not None and job.dp.dp == 2 and job.dp.grad_bytes > 0
        assert parse_job(job.model_dump_json(), wid).real is None


def test_interleaved_dp3_and_dp_across_dcs(tmp_path, no_cuda) -> None:
    wl = real_tiny(parallelism={"dp": 3, "pp": 2, "micro_batch": 1, "num_micro_batches": 4,
                                "schedule": "interleaved-1f1b", "chunks": 2})
    topo = yaml.safe_load((ROOT / "topologies/2dc.yaml").read_text())
    topo["dcs"][0]["hosts"], topo["dcs"][1]["hosts"] = 3, 3
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(topo))
    _, _, jobs, _ = jobs_for(tmp_path, "atlas", wl, topology=tmp_path / "t.yaml")
    assert jobs["p2r1"].real.stages == [1, 3]
    peers = {w: sorted(p.dp_rank for p in j.dp.peers) for w, j in jobs.items()}
    assert peers["p0r0"] == [1, 2] and peers["p1r0"] == [0, 2] and peers["p2r1"] == [0, 1]
    ports = [p.port for j in jobs.values() for p in j.dp.peers]
    assert len(set(ports)) == 6 and len(ports) == 12  # 3 pairs x 2 ranks, both ends
    for wid, job in jobs.items():
        assert parse_job(job.model_dump_json(), wid) == job

    # a placement that puts a stage's replicas in different DCs: the DP channel crosses the WAN
    class Split:
        def dc_of(self, d: int, r: int) -> str:
            return "dc1" if d == 0 else "dc2"

    scenario, _ = load_scenario(scenario_file(tmp_path, real_tiny()))
    split = SimpleNamespace(placement=Split(), streams=6)
    workload = parse_workload(real_tiny())
    two = dp_sync_jobs(split, workload, workload.effective(), scenario.topology,
                       {w: "h" for w in ["p0r0", "p0r1", "p1r0", "p1r1"]}, {"h": "10.9.9.9"}, PortPlan(30000), 1 << 20)
    assert sorted(two) == ["p0r0", "p0r1", "p1r0", "p1r1"]
    assert {p.streams for j in two.values() for p in j.peers} == {6}
    first = PortPlan(30000).dp_gradients.first
    assert sorted(p.port for j in two.values() for p in j.peers) == [first, first, first + 1, first + 1]


def test_build_jobs_refuses_a_real_run_this_machine_cannot_do(tmp_path, monkeypatch) -> None:
    # validated on a machine with CUDA, run on one without
    monkeypatch.setattr(real_check, "cuda_available", lambda: True)
    monkeypatch.setattr(real_check, "cuda_free_bytes", lambda: 80 << 30)
    scenario, _ = load_scenario(scenario_file(tmp_path, real_tiny(real__cpu_max_params=1000)))
    monkeypatch.setattr(real_check, "cuda_available", lambda: False)
    with pytest.raises(RunnerError, match="234,880 parameters, too many to train on the CPU"):
        jobs_of(tmp_path, "atlas", scenario)


# ------------------------------------------------------------------ worker pieces


def test_worker_real_work_errors_name_the_worker(tmp_path, no_cuda) -> None:
    _, _, jobs, _ = jobs_for(tmp_path, "atlas", real_tiny())
    job = jobs["p0r0"]

    def with_real(**changes) -> TrainJob:  # unvalidated: what RealWork itself refuses
        return job.model_copy(update={"real": job.real.model_copy(update=changes)})

    with pytest.raises(WorkerError, match=r"p0r0: real-mode training cannot start: stages \[7\]: give distinct"):
        real_work_of(with_real(stages=[7]), {1: object()})
    bad_lr = job.real.optimizer.model_copy(update={"lr": -1})
    with pytest.raises(WorkerError, match="real-mode training cannot start: optimizer lr=-1"):
        real_work_of(with_real(optimizer=bad_lr), {1: object()})
    # the job file itself refuses such an optimizer, naming the field
    data = json.loads(job.model_dump_json())
    data["real"]["optimizer"]["lr"] = -1
    with pytest.raises(WorkerError, match=r"p0r0.json: real.optimizer.lr: Input should be greater than 0"):
        parse_job(json.dumps(data), "p0r0.json")

    class Work:
        iteration = 2

    with pytest.raises(WorkerError, match="the runner started iteration 1, but the model has trained 2"):
        end_real_iteration(Work(), None, "train:p0r0", 1)


# ------------------------------------------------------------------ the equivalence check


def _save_like_workers(folder: Path, result, wl, iterations: int) -> None:
    """What real_mode.save_params writes, from a threads-only run of the same training."""
    par = wl.parallelism
    (folder / "params").mkdir(parents=True)
    for d in range(par.dp):
        for r in range(par.pp):
            first = ("wte.", "wpe.", "blocks.0.", "blocks.1.")  # stage 0 of the tiny model; stage 1 the rest
            names = [n for n in result.params[d] if n.startswith(first) == (r == 0)]
            torch.save({"worker": f"p{d}r{r}", "pipeline": d, "rank": r, "dp_rank": d, "stages": [r],
                        "iterations": iterations, "losses": result.losses[d] if r == par.pp - 1 else [],
                        "params": {n: result.params[d][n] for n in names}, "seed": 0, "optimizer": {},
                        "torch_device": "cpu", "threads": 1}, folder / "params" / f"p{d}r{r}.pt")


def test_equivalence_says_identical_then_different(tmp_path) -> None:
    from testbed.training.real_work import OptimConfig, train_in_process
    from testbed.training.reference import train_reference

    wl = parse_workload(real_tiny())
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train_in_process(wl, str(tmp_path / "run"), iterations=3, optim=OptimConfig("sgd", 0.5))
    finally:
        torch.set_num_threads(before)
    good = tmp_path / "atlas"
    _save_like_workers(good, result, wl, 3)
    eq = equivalence(good, wl)
    assert eq.identical and eq.max_abs_param_diff == 0.0 and eq.within_tolerance and eq.equivalent
    assert eq.iterations_trained == 3 and eq.device == "cpu"
    acc = train_reference(wl, iterations=3, optim=OptimConfig("sgd", 0.5), mode="accumulate", threads=1)
    assert eq.losses == acc.losses and eq.losses_identical
    assert eq.reference.model_extra["global_batch"]["atol"] == 1e-6 and eq.params_files[0] == "atlas/params/p0r0.pt"
    assert "compute model of gpu.type A100" in eq.note
    line = real_check.describe(eq)
    assert "parameters bit-identical to the one-process reference" in line and "cpu, 3 iterations" in line
    # one replica's parameter off by a little: no longer identical, nor within tolerance
    bad = tmp_path / "bad"
    _save_like_workers(bad, result, wl, 3)
    saved = torch.load(bad / "params" / "p1r1.pt")
    saved["params"]["head.weight"] = saved["params"]["head.weight"] + 1e-3
    torch.save(saved, bad / "params" / "p1r1.pt")
    eq = equivalence(bad, wl)
    assert not eq.identical and not eq.within_tolerance and not eq.equivalent
    assert eq.max_abs_param_diff == pytest.approx(1e-3, rel=1e-3)
    assert "head.weight" in eq.replicas["1"]["micro_batched"]
    assert "parameters DIFFERENT from the one-process reference" in real_check.describe(eq)
    # a replica that saved nothing is named
    (bad / "params" / "p1r0.pt").unlink()
    (bad / "params" / "p1r1.pt").unlink()
    with pytest.raises(RealModeError, match=r"no parameters of DP replica\(s\) \[1\]"):
        equivalence(bad, wl)
    entry = real_check.summary_entry(bad, wl)
    assert isinstance(entry, RealCheckSkipped) and "no parameters of DP replica(s) [1]" in entry.error
    assert real_check.summary_entry(bad, parse_workload(real_tiny(gpu__mode="modelled"))) is None
    with pytest.raises(RealModeError, match="no saved parameters"):
        equivalence(tmp_path / "nothing", wl)


# ------------------------------------------------------------------ testbed run --local, end to end


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_local_real_run_equals_the_reference_for_every_variant(tmp_path, no_cuda) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(_cli(), [
        "run", str(SCENARIO), "--local", "--out", str(out),
        "--set", "runner.calibrate=false", "--set", "workload.iterations=1",  # 2 warm-up + 1 measured
    ])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["variants"]) == ["baseline", "multi-tcp", "atlas"]
    for name, v in summary["variants"].items():
        assert "error" not in v, (name, v)
        real = v["real"]
        assert v["device_mode"] == "real" and real["device"] == "cpu", name
        assert real["identical"] and real["max_abs_param_diff"] == 0.0 and real["within_tolerance"], (name, real)
        assert real["iterations_trained"] == 3 and real["losses"][-1] < real["losses"][0], real["losses"]
        assert len(real["params_files"]) == 4 and all((out / f).exists() for f in real["params_files"])
        # the real tensors crossed the (loopback) WAN channels: activations and gradients of 2 x 4 micro-batches
        assert v["wan_links"]["dc1-dc2"]["transfers"] == 1 * 2 * 2 * 4
        kinds = {row.split(",")[1] for row in (out / v["timeline_csv"]).read_text().splitlines()[1:]}
        assert kinds == {"forward", "backward", "optimizer"}
        assert f"{name}: real training on cpu, 3 iterations: parameters bit-identical" in res.output
    assert summary["variants"]["atlas"]["temporal_plan"] is not None


def test_torch_gloo_refuses_real_devices(tmp_path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path, real_tiny()))
    with pytest.raises(RunnerError, match=r"torch-gloo runs modelled devices only \(gpu.mode: modelled\)"):
        plan_variant("torch-gloo", scenario, scenario.workload, None, None, None)
