"""testbed/run/handoffs.py: a run's hand-offs split in three, and the chain that set
an iteration's end, on small run folders written by hand (times in ms after 100 s)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.run.handoffs import (
    HandoffError,
    Op,
    Transfer,
    critical_path,
    handoffs,
    load_run,
    main,
    report,
)

T0 = 100.0
TIMELINE = ["device", "kind", "owner", "label", "start", "end", "modelled_s"]
TRANSFERS = ["iteration", "pipeline", "boundary", "mb", "direction", "src", "dst", "nbytes", "links", "streams",
             "latency_s", "posted", "not_before", "sent", "arrived", "confirmed"]


def ms(x: float) -> float:
    return T0 + x / 1e3


def write_run(folder: Path, ops: list[tuple[int, str, int, float, float]],
              transfers: list[tuple[str, int, int, bool, float, float, float]], end_ms: float,
              allreduce_s: float | None = None) -> Path:
    """ops: (stage, kind, mb, start ms, end ms), one device per stage, modelled 0.5 ms
    less than they took; transfers: (direction, boundary, mb, wan, sent, arrived,
    confirmed ms), WAN ones 5 ms one way."""
    v = folder / "atlas"
    v.mkdir(parents=True)
    with (v / "timeline.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TIMELINE)
        w.writerow(["d0-p0r0", "prefill", "agent:d0", "prefill", ms(0), ms(0.1), ""])  # not pipeline work
        for stage, kind, mb, a, z in ops:
            w.writerow([f"d{stage}-p0r{stage}", "forward" if kind == "F" else "backward", f"train:p0r{stage}",
                        f"{kind}{mb}@s{stage}", ms(a), ms(z), (z - a - 0.5) / 1e3])
    with (v / "transfers.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRANSFERS)
        for direction, b, mb, wan, sent, arrived, confirmed in transfers:
            w.writerow([0, 0, b, mb, direction, "", "", 1024, "x->y" if wan else "", 1, 0.005 if wan else 0.0,
                        ms(sent), "", ms(sent), ms(arrived), ms(confirmed)])
    (v / "iterations.json").write_text(json.dumps({"starts": [T0], "ends": [ms(end_ms)], "warmup": 0}))
    if allreduce_s is not None:
        (v / "prediction.json").write_text(json.dumps({"allreduce_s": allreduce_s}))
    return folder


@pytest.fixture
def three_stages(tmp_path: Path) -> Path:
    """s0 -WAN- s1 -LAN- s2, one micro-batch; micro-batch 1's backward reaches s1 while
    it is still busy with micro-batch 0 (its recv posted late: arrived late, confirmed early)."""
    ops = [(0, "F", 0, 0, 10), (1, "F", 0, 31, 41), (2, "F", 0, 45, 50), (2, "B", 0, 50, 60),
           (1, "B", 0, 64.5, 75), (0, "B", 0, 96, 106),
           (2, "B", 1, 60, 61), (1, "B", 1, 75, 76)]
    transfers = [("fwd", 0, 0, True, 11, 30, 40), ("fwd", 1, 0, False, 41.5, 44.5, 44.7),
                 ("bwd", 1, 0, False, 60.5, 64, 64.2), ("bwd", 0, 0, True, 75.2, 95, 100),
                 ("bwd", 1, 1, False, 61.2, 75, 64.0)]
    return write_run(tmp_path / "run", ops, transfers, end_ms=110, allreduce_s=0.003)


def test_handoffs_split_only_where_the_receiver_waited(three_stages: Path) -> None:
    rec = load_run(three_stages, "atlas")
    got = {(h.transfer.direction, h.transfer.boundary, h.transfer.mb): h for h in handoffs(rec)}
    assert set(got) == {("fwd", 0, 0), ("fwd", 1, 0), ("bwd", 1, 0), ("bwd", 0, 0)}  # mb 1: s1 was busy
    first = got[("fwd", 0, 0)]
    assert first.transfer.wan
    assert (first.posting_s, first.wire_s, first.wake_s) == pytest.approx((1e-3, 19e-3, 1e-3))
    assert first.total_s == pytest.approx(21e-3)
    lan = got[("fwd", 1, 0)]
    assert not lan.transfer.wan
    assert (lan.posting_s, lan.wire_s, lan.wake_s) == pytest.approx((0.5e-3, 3e-3, 0.5e-3))


def test_a_late_recv_lands_when_its_done_came_back(three_stages: Path) -> None:
    rec = load_run(three_stages, "atlas")
    late = next(t for t in rec.transfers if t.mb == 1)
    assert late.arrived == pytest.approx(ms(75))
    assert late.landed == pytest.approx(ms(64.0))  # LAN: no one-way delay to take off
    wan = next(t for t in rec.transfers if t.wan and t.direction == "bwd")
    assert wan.landed == pytest.approx(ms(95))  # confirmed 100 less 5 ms is not earlier than arrived


def test_the_critical_path_names_each_wait(three_stages: Path) -> None:
    rec = load_run(three_stages, "atlas")
    chain = critical_path(rec, 0)
    ops = [(n.stage, n.kind, n.mb, why) for n, why in chain if isinstance(n, Op)]
    assert ops == [(0, "B", 0, "WAN"), (1, "B", 0, "LAN"), (2, "B", 0, "device"), (2, "F", 0, "LAN"),
                   (1, "F", 0, "WAN"), (0, "F", 0, "start")]
    assert all(why == "sender" for n, why in chain if isinstance(n, Transfer))
    text = report(rec)
    assert "waited 2 times on a WAN and 2 on a LAN hand-off, 1 on the device's previous work, 0 tensor(s) queued" \
        in text
    assert "after the last pipeline work (the DP all-reduce's tail): 4 ms (predicted 3 ms)" in text
    assert "compute beyond its modelled time: median 0.50 ms" in text


def test_a_tensor_behind_another_on_its_channel_is_queued(tmp_path: Path) -> None:
    ops = [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (1, "F", 0, 20.5, 21.5), (1, "F", 1, 39.5, 40.5)]
    transfers = [("fwd", 0, 0, True, 1.1, 20, 25), ("fwd", 0, 1, True, 2.1, 39, 44)]
    rec = load_run(write_run(tmp_path / "run", ops, transfers, end_ms=40.5), "atlas")
    chain = critical_path(rec, 0)
    assert [why for _, why in chain] == ["WAN", "queued", "sender", "start"]
    assert [t.mb for t, _ in chain if isinstance(t, Transfer)] == [1, 0]
    assert "after the last pipeline work" not in report(rec)  # no DP all-reduce: nothing after


def test_what_is_missing_is_named(tmp_path: Path, three_stages: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HandoffError, match=r"no variant 'baseline' \(variants with records here: atlas\)"):
        load_run(three_stages, "baseline")
    (three_stages / "atlas" / "timeline.csv").unlink()
    with pytest.raises(HandoffError, match=r"timeline.csv: missing; give the folder of a `testbed run`"):
        load_run(three_stages, "atlas")
    (tmp_path / "empty" / "atlas").mkdir(parents=True)
    with pytest.raises(HandoffError, match=r"iterations.json: missing; the variant did not finish"):
        load_run(tmp_path / "empty", "atlas")
    assert main([str(tmp_path / "empty"), "atlas"]) == 2
    assert "error: " in capsys.readouterr().err
    with pytest.raises(HandoffError, match=r"nowhere: no such folder; give the folder of a `testbed run`"):
        load_run(tmp_path / "nowhere", "atlas")
    (tmp_path / "empty" / "atlas" / "iterations.json").write_text('{"ends": []}')
    with pytest.raises(HandoffError, match=r"iterations.json: not a run's iterations record \(KeyError: 'starts'\)"):
        load_run(tmp_path / "empty", "atlas")
    (tmp_path / "empty" / "atlas" / "iterations.json").write_text("{not json")
    with pytest.raises(HandoffError, match=r"not a run's iterations record \(JSONDecodeError"):
        load_run(tmp_path / "empty", "atlas")


def test_an_iteration_without_work_is_refused(three_stages: Path) -> None:
    rec = load_run(three_stages, "atlas")
    with pytest.raises(HandoffError, match=r"iteration 5 has no pipeline work in the records \(iterations \[0\]\)"):
        critical_path(rec, 5)


def test_main_prints_each_variant(three_stages: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(three_stages), "atlas"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"== {three_stages} atlas\nLAN hand-offs to an idle receiver: 2")
