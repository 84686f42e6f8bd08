"""BubbleTea's tail figures (issue 30): training's waits on prefills named by request and
device, lease events from the device files, stalled iterations with a verdict that names
the network only when the transfer records show it, and the tail with and without
BubbleTea (also over every repeat)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubbletea_agent.metrics import guard_violations, training_waits
from testbed.run.bubbletea import guard_overruns, iteration_stalls
from testbed.run.metrics import bubbletea_tail, decompose_slowdown, repeat_stats
from testbed_core.contracts.summary import RepeatRun
from testbed_core.device_records import LeaseEvent, WorkRecord


def rec(kind: str, start: float, end: float, requested: float | None = None, label: str = "",
        revoked: str = "") -> WorkRecord:
    return WorkRecord("dc1-h1-gpu0", kind, "o", label, start if requested is None else requested, start, end,
                      "modelled", revoked_lease=revoked)


def test_a_wait_cut_short_by_revoking_the_lease_still_counts() -> None:
    prefill = rec("prefill", 0.0, 10.0, label="r1601:hold")
    waited = rec("forward", 2.055, 2.1, requested=2.0, label="F3@s0", revoked="lease-1")
    unrelated = rec("forward", 10.5, 10.6, requested=10.4)
    waits = training_waits([prefill, waited, unrelated])
    assert [(p.label, t.label, round(w, 3)) for p, t, w in waits] == [("r1601:hold", "F3@s0", 0.055)]
    assert guard_violations([prefill, waited, unrelated]) == (1, pytest.approx(0.055))
    # without the revocation, a piece that started before the prefill ended did not wait for it
    assert training_waits([prefill, rec("forward", 2.055, 2.1, requested=2.0)]) == []


def _folder(tmp_path: Path) -> Path:
    devices = tmp_path / "run" / "devices"
    devices.mkdir(parents=True)
    events = [LeaseEvent("revoked", "dc1-h1-gpu0", "L1", "bubbletea:p0r0", "r1614:hold", 42, 100.0, 0.005,
                         100.004, 0.004, "holder stopped (SIGSTOP) while holding the device", True, "train:p0r0")]
    (devices / "dc1-h1-gpu0.overruns.jsonl").write_text("".join(json.dumps(e.to_json()) + "\n" for e in events))
    transfers = tmp_path / "run" / "transfers"
    transfers.mkdir(parents=True)
    lines = []
    for it in range(5):  # iteration 0 is a warm-up; 1..4 measured
        slow = it == 4
        lines.append({"side": "send", "iteration": it, "links": ["dc1->dc2"], "posted": 10.0 * it,
                      "confirmed": 10.0 * it + (4.5 if slow else 0.1), "token_timeout": slow})
    (transfers / "p0r0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_guard_overruns_name_the_request_device_and_cause(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    windows = [(0.0, 2.0), (2.0, 4.0)]
    timelines = {"dc1-h1-gpu0": [rec("prefill", 1.0, 1.5, label="r1601:0:512"),
                                 rec("forward", 1.5, 1.6, requested=1.45, label="F1@s0")]}
    g = guard_overruns(folder, timelines, windows)
    assert g.worst_training_wait_s == pytest.approx(0.05)
    (w,) = g.worst
    assert (w.device, w.request, w.training, w.iteration) == ("dc1-h1-gpu0", "r1601", "F1@s0", 0)
    assert g.lease_revocations == 1 and g.lease_overruns[0].request == "r1614"
    assert "SIGSTOP" in g.lease_overruns[0].cause and g.worst_lease_overrun_s == pytest.approx(0.004)


def test_a_stall_caused_by_a_prefill_names_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    windows = [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 9.0)]  # the last one is 1 s over the median
    timelines = {"dc2-h1-gpu0": [rec("prefill", 6.0, 7.0, label="r1601:hold"),
                                 rec("backward", 7.0, 7.2, requested=6.1, label="B2@s1")]}
    stalls = iteration_stalls(folder, timelines, windows)
    assert [s.iteration for s in stalls] == [3]
    s = stalls[0]
    assert s.held_by[0].request == "r1601" and s.held_by[0].device == "dc2-h1-gpu0"
    assert "prefill r1601 on dc2-h1-gpu0 held the device 1000 ms" in s.verdict
    # the same iteration also had a token timeout in the transfer records: said, with its length
    assert s.token_timeouts == 1 and "token until its timeout" in s.verdict


def test_a_stall_without_records_does_not_blame_the_network(tmp_path: Path) -> None:
    windows = [(0.0, 2.0), (2.0, 4.0), (4.0, 7.0)]
    (s,) = iteration_stalls(tmp_path, {"d": []}, windows)
    assert "cause not recorded" in s.verdict and "network" not in s.verdict
    assert s.token_timeouts == 0 and s.longest_wan_transfer_s is None


def test_a_stall_of_trainings_own_work_names_the_piece_first(tmp_path: Path) -> None:
    # a prefill made training wait 2 ms, but a training piece ran 280 ms past its modelled
    # time (its worker held up between taking the device and the work's end): that leads
    windows = [(0.0, 2.0), (2.0, 4.0), (4.0, 6.3)]
    prefill = rec("prefill", 4.0, 4.5, label="r1915:hold")
    waited = rec("forward", 4.5, 4.8, requested=4.497, label="F1@s1")
    late = WorkRecord("dc2-h2-gpu0", "forward", "train:p1r1", "F2@s1", 5.0, 5.0, 5.3, "modelled",
                      modelled_s=0.02, overrun_s=0.28)
    (s,) = iteration_stalls(tmp_path, {"dc1-h1-gpu0": [prefill, waited], "dc2-h2-gpu0": [late]}, windows)
    assert s.training_overrun_s == pytest.approx(0.28) and s.training_overrun_at == "dc2-h2-gpu0 F2@s1"
    assert s.verdict.startswith("training's own dc2-h2-gpu0 F2@s1 ran 280 ms past its modelled time")
    assert "prefill r1915" in s.verdict and "explain 1% of the 300 ms excess" in s.verdict
    # a prefill's own overrun is not training's
    late_prefill = WorkRecord("d", "prefill", "a", "r1:hold", 5.0, 5.0, 5.3, "modelled", overrun_s=0.28)
    (s,) = iteration_stalls(tmp_path, {"d": [late_prefill]}, windows)
    assert s.training_overrun_s == 0.0 and "cause not recorded" in s.verdict


def test_tail_with_and_without_bubbletea() -> None:
    plain = [2.0, 2.1, 2.2, 2.4]
    with_bt = [2.0, 2.1, 2.3, 12.13]
    t = bubbletea_tail(plain, with_bt)
    assert t is not None and t.with_bubbletea.max == 12.13 and t.without.max == 2.4
    assert t.max_ratio == pytest.approx(12.13 / 2.4) and t.slowed_over_5pct == 2  # 2.3 and 12.13 > 1.05 x 2.15
    d = decompose_slowdown(plain, with_bt, None, 0.0)
    assert d.tail == t


def test_repeats_report_the_tail_over_every_repeat() -> None:
    runs = [RepeatRun(repeat=k + 1, folder=f"r{k}", iteration_time_s=2.0, device_utilization=0.95 - k / 100,
                      device_utilization_training=0.2, iteration_times_s=times, max_iteration_time_s=max(times))
            for k, times in enumerate([[2.0, 2.0], [2.0, 12.0], [2.0, 2.1]])]
    r = repeat_stats(runs)
    assert r.tail is not None and r.tail.n == 6 and r.tail.max == 12.0
    assert r.median.max_iteration_time_s == 2.1  # the median hides it ...
    assert r.worst is not None and r.worst.max_iteration_time_s == 12.0  # ... the worst does not
    assert r.worst.device_utilization == pytest.approx(0.93)


def test_the_demo_row_shows_the_worst_iteration() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "front"))
    import summary_builders as b

    from testbed import demo as d

    atlas = b.variant("atlas", 2.2, device_utilization=0.22, streams=8)
    bt = b.with_bubbletea(atlas, "atlas+bubbletea", iteration_time_s=3.34, device_utilization=0.95,
                          training_slowdown=0.53)
    bt.slowdown_decomposition = decompose_slowdown([2.1, 2.2, 2.46], [2.3, 2.3, 12.13], None, 10.0)
    rows = {r.measure: r for r in d.bubbletea_rows(b.summary({"atlas": atlas, "atlas+bubbletea": bt}))}
    worst = rows["worst iteration with BubbleTea"]
    assert worst.value == pytest.approx(12.13 / 2.46) and worst.ok is False
    assert "12.130 s vs 2.460 s" in worst.note and "1 of 3 iterations slowed by more than 5%" in worst.note
    # repeated: the slowest over every repeat, not a median
    atlas.repeats = repeat_stats([RepeatRun(repeat=1, folder="a", iteration_time_s=2.2, device_utilization=0.2,
                                            device_utilization_training=0.2, iteration_times_s=[2.2, 2.4])])
    bt.repeats = repeat_stats([RepeatRun(repeat=k + 1, folder="b", iteration_time_s=2.2, device_utilization=0.9,
                                         device_utilization_training=0.2, iteration_times_s=t)
                               for k, t in enumerate([[2.2, 2.3], [2.2, 2.6]])])
    rows = {r.measure: r for r in d.bubbletea_rows(b.summary({"atlas": atlas, "atlas+bubbletea": bt}))}
    worst = rows["worst iteration with BubbleTea"]
    assert worst.value == pytest.approx(2.6 / 2.4) and worst.ok is True and "over 2 repeats" in worst.note


def test_the_gantt_marks_a_revoked_hold(tmp_path: Path) -> None:
    from testbed.run.gantt import gantt_png

    recs = [rec("forward", 0.0, 0.1, label="F0"),
            WorkRecord("d", "prefill", "a", "r1:hold", 0.1, 0.1, 0.25, "modelled", deadline=0.2, revoked_at=0.25)]
    out = gantt_png({"d": recs}, [], [0.0], [0.4], 0, tmp_path / "g.png")
    assert out.stat().st_size > 1000
