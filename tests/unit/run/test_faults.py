"""Faults on purpose (testbed/run/faults.py): a scenario's `faults:` refused with the
file, the field and what is allowed; the injector's scheduling, link changes, worker
kill and the records it writes, with a fake emulation and clock (no root)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.emulation.delayline.stats import RelaySnapshot
from testbed.run.faults import DelaySpike, FaultInjector, KillWorker, LinkDown, Partition
from testbed.run.scenario import ScenarioError, load_scenario
from testbed_core.contracts.summary import Summary
from testbed_core.topology import parse_topology

REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, faults: list[Any], **runner: Any) -> Path:
    data = yaml.safe_load((REPO / "scenarios" / "faults-2dc.yaml").read_text())
    data["topology"] = str(REPO / "topologies" / "2dc.yaml")
    data["faults"] = faults
    data["runner"].update(runner)
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_scenario_loads_with_its_outage() -> None:
    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    (fault,) = scenario.faults
    assert isinstance(fault, LinkDown) and fault.duration == 1.4 and fault.link == "dc1-dc2"
    assert scenario.runner.verify_tensors and not scenario.runner.dp_allreduce


@pytest.mark.parametrize(("fault", "message"), [
    ({"kind": "link-up", "link": "dc1-dc2"}, "faults.0: kind must be one of link-down, delay-spike, partition, kill-worker"),
    ({"kind": "partition", "dc": "dc7", "duration": "1s"}, "faults.0.dc: no DC 'dc7' in topology 2dc \\(DCs: dc1, dc2\\)"),
    ({"kind": "link-down", "link": "dc1-dc9", "duration": "2s"},
     "faults.0.link: no WAN link 'dc1-dc9' in topology 2dc \\(links: dc1-dc2\\)"),
    ({"kind": "link-down", "link": "dc1-dc2"}, "faults.0.link-down.duration: required field is missing"),
    ({"kind": "link-down", "link": "dc1-dc2", "duration": "7200s"},
     "duration 7200s is out of range: allowed 1ms to 3600s"),
    ({"kind": "link-down", "link": "dc1-dc2", "duration": "2s", "at": "2h"}, "faults.0.link-down.at: .*unknown time unit"),
    ({"kind": "link-down", "link": "dc1-dc2", "duration": "2s", "iteration": 4},
     "faults.0.iteration: 4 is past the run's last iteration \\(3: warm-ups count from 0, 1 warm-up \\+ 3 measured\\)"),
    ({"kind": "delay-spike", "link": "dc1-dc2", "delay": "50s", "duration": "1s"},
     "faults.0.delay-spike.delay: delay 50s is out of range: allowed 0s to 10s"),
    ({"kind": "kill-worker", "worker": "w1"}, "a worker is named p<pipeline>r<rank> \\(e.g. p0r1"),
    ({"kind": "kill-worker", "worker": "p2r0"},
     "faults.0.worker: no worker 'p2r0': workers are p<pipeline>r<rank> with pipeline 0 to 1 \\(dp=2\\)"),
    ({"kind": "kill-worker", "worker": "p0r1", "colour": "red"}, "faults.0.kill-worker.colour"),
])
def test_bad_faults_are_refused_before_building(tmp_path: Path, fault: dict[str, Any], message: str) -> None:
    path = _write(tmp_path, [fault])
    with pytest.raises(ScenarioError, match=message) as info:
        load_scenario(path)
    assert str(path) in str(info.value)


def test_link_faults_need_the_emulated_network(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"kind": "link-down", "link": "dc2-dc1", "duration": "1s"}], local=True)
    with pytest.raises(ScenarioError, match="faults.0: a link-down needs the emulated network"):
        load_scenario(path)
    load_scenario(_write(tmp_path, [{"kind": "kill-worker", "worker": "p1r1"}], local=True))  # fine locally


class FakeEmulation:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.drops = 0
        self.lock = threading.Lock()

    def change_link(self, name: str, **kw: Any) -> None:
        with self.lock:
            self.calls.append((name, kw))
            if kw.get("down") is False:
                self.drops += 7  # frames dropped during the outage

    def link_state(self, name: str) -> tuple[float, float, float, float, bool]:
        return (1e9, 0.025, 0.0, 0.0, False)

    def delay_line_stats(self) -> dict[str, RelaySnapshot]:
        return {"dc1-dc2": RelaySnapshot.model_validate({"a2b": {"down_drops": self.drops}, "b2a": {"down_drops": 0}})}


class FakeProc:
    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def _topology() -> Any:
    return parse_topology(yaml.safe_load((REPO / "topologies" / "2dc.yaml").read_text()), "2dc.yaml")


def _wait(cond: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert cond()


def test_link_down_is_applied_from_its_iteration_restored_and_recorded() -> None:
    emu = FakeEmulation()
    fault = LinkDown(kind="link-down", link="dc2-dc1", iteration=1, at=0.02, duration=0.05)
    inj = FaultInjector([fault], "atlas", 1, emu, topology=_topology())
    t = time.time()
    inj.iteration_started(0, t)
    inj.iteration_ended(0, t + 0.01)
    assert emu.calls == []  # armed from iteration 1 only
    t1 = time.time()
    inj.iteration_started(1, t1)
    _wait(lambda: len(emu.calls) == 2)
    assert emu.calls == [("dc1-dc2", {"down": True}), ("dc1-dc2", {"down": False})]
    inj.iteration_ended(1, time.time())
    t2 = time.time()
    inj.iteration_started(2, t2)
    inj.iteration_ended(2, t2 + 0.1)
    inj.close()
    (rec,) = inj.records()
    assert rec.outcome == "survived" and rec.target == "dc1-dc2" and rec.iterations == [1]
    assert rec.started is not None and rec.ended is not None
    assert rec.started - t1 >= 0.02 and rec.ended - rec.started >= 0.05
    assert [(a.iteration, a.overlapped) for a in rec.around] == [(0, False), (1, True), (2, False)]
    assert rec.recovery_s == pytest.approx(t2 + 0.1 - rec.ended)
    assert rec.dropped_frames == 7
    # the summary carries it
    summary = Summary.model_validate({**_summary_base(), "faults": [rec.model_dump()]})
    assert '"recovery_s"' in summary.to_json()


class SlowStats(FakeEmulation):
    """A delay line whose counters take 0.3 s to read (a loaded host)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[float] = []

    def delay_line_stats(self) -> dict[str, RelaySnapshot]:
        time.sleep(0.3)
        self.reads.append(time.time())
        return super().delay_line_stats()


def test_the_cut_lands_on_time_however_slow_the_drop_counters_are() -> None:
    emu = SlowStats()
    emu.drops = 5  # from an earlier fault
    cut_at: list[float] = []
    change = emu.change_link

    def timed(name: str, **kw: Any) -> None:
        if kw.get("down"):
            cut_at.append(time.time())
        change(name, **kw)

    emu.change_link = timed  # type: ignore[method-assign]
    inj = FaultInjector([LinkDown(kind="link-down", link="dc1-dc2", iteration=1, at=0.4, duration=0.05)],
                        "atlas", 1, emu, topology=_topology())
    t1 = time.time()
    inj.iteration_started(1, t1)
    _wait(lambda: len(emu.calls) == 2 and len(emu.reads) == 2)
    # the counters were read as the iteration was armed, not at the cut: the cut is not 0.3 s late
    assert emu.reads[0] < cut_at[0] and 0.4 <= cut_at[0] - t1 < 0.6
    inj.iteration_ended(1, time.time())
    inj.close()
    (rec,) = inj.records()
    assert rec.dropped_frames == 7  # 12 after, 5 before


def test_a_drop_reading_that_comes_back_after_the_cut_is_not_used() -> None:
    emu = SlowStats()
    inj = FaultInjector([LinkDown(kind="link-down", link="dc1-dc2", iteration=1, at=0.0, duration=0.3)],
                        "atlas", 1, emu, topology=_topology())
    inj._cut.add(0)  # the cut began before the early reading came back
    inj._count_drops_before(0)
    assert 0 not in inj._drops_before


def test_delay_spike_restores_the_delay_it_found() -> None:
    emu = FakeEmulation()
    inj = FaultInjector([DelaySpike(kind="delay-spike", link="dc1-dc2", delay=0.3, duration=0.03)], "atlas", 0, emu,
                        topology=_topology())
    inj.iteration_started(0, time.time())
    _wait(lambda: len(emu.calls) == 2)
    assert emu.calls == [("dc1-dc2", {"delay": 0.3}), ("dc1-dc2", {"delay": 0.025})]


def test_close_restores_a_link_still_down_and_cancels_unfired() -> None:
    emu = FakeEmulation()
    faults = [LinkDown(kind="link-down", link="dc1-dc2", at=0.0, duration=60),
              LinkDown(kind="link-down", link="dc1-dc2", iteration=3, duration=1)]
    inj = FaultInjector(faults, "atlas", 0, emu, topology=_topology())
    inj.iteration_started(0, time.time())
    _wait(lambda: len(emu.calls) == 1)
    inj.close()
    assert emu.calls[-1] == ("dc1-dc2", {"down": False})
    recs = inj.records(error="iteration 0: no answer")
    assert [r.outcome for r in recs] == ["failed", "not-reached"]
    assert recs[0].error == "iteration 0: no answer" and recs[0].recovery_s is None


def test_kill_worker_kills_at_its_iteration_and_names_itself_in_the_error() -> None:
    proc = FakeProc()
    inj = FaultInjector([KillWorker(kind="kill-worker", worker="p0r1", iteration=1)], "atlas", 1, None)
    inj.procs = {"p0r1": proc}
    inj.iteration_started(0, time.time())
    time.sleep(0.02)
    inj.iteration_ended(0, time.time())
    assert not proc.killed
    inj.iteration_started(1, time.time())
    _wait(lambda: proc.killed)
    error = inj.explain("worker p0r1 exited with status -9")
    assert error == ("worker p0r1 exited with status -9 (after the fault injected on purpose: kill-worker p0r1 at "
                     "iteration 1 + 0s)")
    (rec,) = inj.records(error)
    assert rec.outcome == "failed" and rec.iterations == [1] and "kill-worker p0r1" in (rec.error or "")


def test_a_fault_that_cannot_be_applied_is_recorded_not_raised() -> None:
    inj = FaultInjector([KillWorker(kind="kill-worker", worker="p1r1")], "atlas", 0, None)
    inj.iteration_started(0, time.time())
    _wait(lambda: bool(inj.errors))
    (rec,) = inj.records()
    assert rec.outcome == "failed" and "no worker process p1r1" in (rec.error or "")


def _summary_base() -> dict[str, Any]:
    return {"scenario": "s", "topology": "t", "workload": "w", "scale": 1.0, "scale_note": "", "seed": 1,
            "schedule": "1f1b", "parallelism": {"dp": 1, "pp": 2, "tp": 1, "micro_batch": 1, "num_micro_batches": 1},
            "iterations": 1, "warmup": 0, "wire_activation_bytes": 1, "stage_forward_s": [0.1],
            "stage_backward_s": [0.1], "runner": {}}


def test_summary_without_faults_keeps_its_keys() -> None:
    assert "faults" not in Summary.model_validate(_summary_base()).to_json()


def test_link_fault_records_the_transfers_it_caught_and_when_they_resumed() -> None:
    from testbed.run.metrics import TransferRecord

    emu = FakeEmulation()
    inj = FaultInjector([LinkDown(kind="link-down", link="dc1-dc2", at=0.0, duration=0.05)], "atlas", 0, emu,
                        topology=_topology())
    t = time.time()
    inj.iteration_started(0, t)
    _wait(lambda: len(emu.calls) == 2)
    inj.iteration_ended(0, time.time())
    inj.iteration_started(1, time.time())
    inj.iteration_ended(1, time.time() + 0.5)
    rec0 = inj.records()[0]
    assert rec0.started is not None and rec0.ended is not None
    a, b = rec0.started, rec0.ended

    def tr(links: tuple[str, ...], sent: float, arrived: float) -> TransferRecord:
        return TransferRecord(iteration=0, pipeline=0, boundary=0, mb=0, direction="fwd", src="p0r0", dst="p0r1",
                              nbytes=1, links=links, sent=sent, arrived=arrived)

    inj.transfers = [tr(("dc1->dc2",), a - 0.01, b + 0.3), tr(("dc2->dc1",), b + 0.1, b + 0.2),
                     tr((), a, b + 0.01), tr(("dc1->dc2",), a - 1, a - 0.5)]
    (rec,) = inj.records()
    assert rec.transfers_caught == 1
    assert rec.transport_resumed_s == pytest.approx(0.2)
    assert rec.caught_done_s == pytest.approx(0.3)


def test_gantt_shades_each_fault_and_labels_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    from testbed.run.gantt import gantt_png
    from testbed_core.contracts.summary import FaultRecord
    from testbed_core.device_records import WorkRecord

    spans: list[tuple[float, float]] = []
    texts: list[str] = []
    real_span, real_text = matplotlib.axes.Axes.axvspan, matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan", lambda self, a, b, **kw: spans.append((a, b))
                        or real_span(self, a, b, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, **kw: texts.append(s)
                        or real_text(self, x, y, s, **kw))
    rec = FaultRecord(variant="atlas", kind="link-down", target="dc1-dc2", planned_iteration=1, outcome="survived",
                      description="link-down dc1-dc2 for 2s at iteration 1 + 0.3s", started=101.3, ended=103.3,
                      iterations=[1], recovery_s=1.5, transport_resumed_s=0.8, caught_done_s=1.2)
    work = [WorkRecord(device="d0", kind="forward", owner="w", label="F0", requested=100.0, start=100.0, end=100.5,
                       mode="modelled")]
    gantt_png({"d0": work}, [], [100.0, 101.0, 103.5], [100.9, 103.4, 104.8], 1, tmp_path / "g.png", faults=[rec])
    assert (tmp_path / "g.png").stat().st_size > 0
    assert spans == [(pytest.approx(0.3), pytest.approx(2.3))]
    assert ("link-down dc1-dc2 for 2s; transfers resumed 0.80 s after, those caught done 1.20 s after; next "
            "iteration done 1.50 s after") in texts


def test_partition_cuts_every_link_of_its_dc_and_restores_them() -> None:
    emu = FakeEmulation()
    topo = parse_topology(yaml.safe_load((REPO / "topologies" / "3dc-triangle.yaml").read_text()), "3dc.yaml")
    inj = FaultInjector([Partition(kind="partition", dc="dc2", duration=0.03)], "atlas", 0, emu, topology=topo)
    inj.iteration_started(0, time.time())
    _wait(lambda: len(emu.calls) == 4)
    touching = sorted(link.name for link in topo.wan if "dc2" in link.between)
    assert len(touching) == 2
    assert sorted(n for n, kw in emu.calls[:2]) == touching and all(kw == {"down": True} for _, kw in emu.calls[:2])
    assert all(kw == {"down": False} for _, kw in emu.calls[2:])
    inj.close()
    (rec,) = inj.records()
    assert rec.kind == "partition" and rec.target == "dc2" and rec.description.startswith("partition dc2 for 30ms")


# ------------------------------------------------------------ the a-priori forecast of an outage

def test_retransmissions_back_off_until_the_link_is_back() -> None:
    from testbed.run.faults import resume_after_outage, slow_start_extra_s

    # RTT 50 ms: the tail-loss probe at 0.1 s, then RTO 250 ms doubling: 0.35, 0.85, 1.85, 3.85 s
    assert resume_after_outage(0.0, 2.0, 0.05) == pytest.approx(3.85)
    assert resume_after_outage(0.0, 1.7, 0.05) == pytest.approx(1.85)
    assert resume_after_outage(0.0, 0.05, 0.05) == pytest.approx(0.1)  # the probe itself gets through
    # a stream that first sent half a second into the outage: 0.6, 0.85, 1.35, 2.35
    assert resume_after_outage(0.5, 2.0, 0.05) == pytest.approx(2.35)
    # a smoothed RTT of 100 ms (the link's queue full): probe 0.2 s, RTO 300 ms: 0.5, 1.1, 2.3
    assert resume_after_outage(0.0, 2.0, 0.05, 0.1) == pytest.approx(2.3)
    # a 512 KB window (363 packets) from one packet: 9 round trips, 8 more than with it open
    assert slow_start_extra_s(524288, 0.05) == pytest.approx(0.4)
    assert slow_start_extra_s(1000, 0.05) == 0.0


def _planned(scenario: Any) -> Any:
    from testbed_core.planning.prediction import Variant, predict

    return predict(scenario.topology, scenario.workload, Variant("atlas", 8, "shared", "atlas"),
                   base_dir=str(scenario.workload_dir))


def test_the_shipped_outage_is_forecast_in_its_iteration() -> None:
    from testbed.run.faults import forecast, with_forecasts

    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    (fc,) = forecast(scenario.faults, scenario.workload.warmup, pred, scenario.topology)
    # down as the iteration starts, 1.4 s: the first tensors leave 19 ms later into the dead link
    # and their streams resume on their third retry, 9 srtt + 1.75 s after it (1.85 s at 50 ms,
    # 2.3 s at 100 ms: the queue full), then 0.4 s (8 MB tensors over 8 streams: 1 MB stripes,
    # 512 KB windows sent again from one packet); no stream is caught mid-flight
    assert fc.iteration == 2 and fc.delay_s == pytest.approx(2.475)
    assert "+2.48 s in iteration 2" in fc.why and "2.25-2.70 s" in fc.why and "by chance" not in fc.why
    mean = with_forecasts(pred.iteration_time_s, [fc], scenario.workload.warmup, scenario.workload.iterations)
    assert mean == pytest.approx(pred.iteration_time_s + 2.475 / 3)
    # in a warm-up it leaves the measured mean alone
    assert with_forecasts(1.0, [fc], 3, 3) == 1.0


@pytest.mark.parametrize("duration", [0.7, 2.0])
def test_an_outage_ending_within_a_retrys_span_says_it_is_a_toss_up(duration: float) -> None:
    from testbed.run.faults import forecast

    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    # 0.7 s: a stream whose oldest packet left 150 ms before the cut retries 0.7 s after it, just
    # before the link is back (the third retry then, 1.6-1.85 s later); 2 s: the third retry lands
    # 1.85-2.3 s after the cut, before the link is back below a smoothed RTT of 67 ms
    (fc,) = forecast([LinkDown(kind="link-down", link="dc1-dc2", iteration=2, at=0.3, duration=duration)],
                     1, pred, scenario.topology)
    assert "the link comes back while some streams retry" in fc.why
    (lo, hi) = {0.7: (1.30, 2.12), 2.0: (2.61, 4.69)}[duration]
    assert f"{lo:.2f}-{hi:.2f} s" in fc.why and lo < fc.delay_s < hi


def test_a_retry_judged_spurious_waits_for_a_probe_at_the_inflated_rtt() -> None:
    from testbed.run.faults import undo_extra_s

    # silent 2 s: one RTT sample of 2.05 s takes the smoothed RTT from 50 to 300 ms, the probe
    # 0.6 s later; then the 512 KB window again from one packet (0.4 s)
    assert undo_extra_s(2.0, 0.05, 524288, 0.05) == pytest.approx(0.6 + 0.4)
    # a short silence inflates it less
    assert undo_extra_s(0.4, 0.05, 524288, 0.05) == pytest.approx(2 * (0.05 + 0.4 / 8) + 0.4)


@pytest.mark.parametrize(("at", "mid_flight"), [(0.009, False), (0.1, True), (0.3, True)])
def test_an_outage_says_when_a_stream_is_caught_mid_flight(at: float, mid_flight: bool) -> None:
    from testbed.run.faults import forecast

    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    first = min(t.start for t in pred.sim.transfers)
    # the first tensors leave at 19 ms: 10 ms before the cut (less than the 25 ms one-way delay)
    # all they sent is lost on the wire; earlier, some of it arrived and only the acknowledgements
    # were lost
    assert first == pytest.approx(0.019, abs=0.002)
    (fc,) = forecast([LinkDown(kind="link-down", link="dc1-dc2", iteration=2, at=at, duration=1.4)],
                     1, pred, scenario.topology)
    assert ("judged spurious" in fc.why) is mid_flight
    if mid_flight:
        # the mean leaves it out; the bound adds the probe at the inflated RTT and the window again
        upto = float(fc.why.split("; up to ")[1].split(" s ")[0])
        assert upto > fc.delay_s + 0.9 and "cut the link between transfers" in fc.why


def test_an_outage_forecast_without_the_topology_takes_the_paths_rtt() -> None:
    from testbed.run.faults import forecast

    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    # no queue known: the smoothed RTT is the path's; the latest head's third retry at 1.85 s
    (bare,) = forecast(scenario.faults, 1, pred)
    assert bare.delay_s == pytest.approx(1.85 + 0.4) and "as the streams' smoothed RTT" not in bare.why


def test_faults_without_a_model_or_without_traffic_say_so(tmp_path: Path) -> None:
    from testbed.run.faults import forecast

    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    faults = [DelaySpike(kind="delay-spike", link="dc1-dc2", iteration=2, delay=0.2, duration=1.0),
              KillWorker(kind="kill-worker", worker="p0r1", iteration=2),
              LinkDown(kind="link-down", link="dc1-dc2", iteration=1, at=0.0, duration=0.001),
              Partition(kind="partition", dc="dc2", iteration=1, at=0.3, duration=2.0)]
    spike, kill, blink, part = forecast(faults, 1, pred, scenario.topology)
    assert spike.delay_s is None and "not forecast" in spike.why
    assert kill.delay_s is None and "fails the variant" in kill.why
    # the first tensor leaves after stage 0's first forward: nothing on the link in its first millisecond
    assert blink.delay_s == 0.0 and "no WAN transfer" in blink.why
    (down,) = forecast([LinkDown(kind="link-down", link="dc1-dc2", iteration=1, at=0.3, duration=2.0)], 1, pred,
                       scenario.topology)
    assert part.delay_s == pytest.approx(down.delay_s)  # dc2's only link: as the link-down
    # timed past the healthy iteration's end: a later iteration
    (late,) = forecast([LinkDown(kind="link-down", link="dc1-dc2", iteration=1,
                                 at=pred.iteration_time_s + 0.3, duration=2.0)], 1, pred, scenario.topology)
    assert late.iteration == 2


def test_the_injector_keeps_its_forecast_in_the_record() -> None:
    scenario, _ = load_scenario(REPO / "scenarios" / "faults-2dc.yaml")
    pred = _planned(scenario)
    inj = FaultInjector(scenario.faults, "atlas", 1, FakeEmulation(), topology=_topology())
    mean, note = inj.predict(pred, 3)
    assert mean == pytest.approx(pred.iteration_time_s + 2.475 / 3)
    assert note.startswith("faults forecast: link-down dc1-dc2 for 1.4s at iteration 2 + 0s: +2.48 s")
    (rec,) = inj.records()
    assert rec.outcome == "not-reached" and rec.predicted_delay_s == pytest.approx(2.475)
    assert rec.forecast is not None and "retransmission back-off" in rec.forecast
