"""The atlas transport's measured cost per transfer (testbed_core/program/transport.py):
its fit, its place in the program's replay (a floor and an overhead on each of atlas's
WAN transfers), and every refusal of a calibration that does not fit the profile (none
where one is needed, another format, another version of the transport)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed_core.program.predict import predict, retarget
from testbed_core.program.profile import (
    PROFILE_FILE,
    GroupRecord,
    OpRecord,
    ProfileError,
    ProgramProfile,
    RankProfile,
    StepRecord,
    program_identity,
)
from testbed_core.program.transport import (
    CALIBRATION_FILE,
    CalibrationPoint,
    PatternCost,
    TransportCalibration,
    fit_calibration,
    fit_pattern,
    needs_calibration,
    read_calibration,
)
from testbed_core.topology import parse_topology

MB4 = 4 << 20


def _topology():
    return parse_topology({
        "name": "t", "tcp": {"rmem_max": "1MB", "wmem_max": "1MB", "slow_start_after_idle": False},
        "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
        "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}]}, "t.yaml")


def _profile(tmp_path: Path, backend: str = "atlas", fingerprint: str | None = None, wait: float = 0.5
             ) -> ProgramProfile:
    """Rank 0 sends one 4 MiB tensor a step to rank 1 (4 steps of 1 s), which waits for it
    `wait` s; each rank's step starts 0.04 s before the send and ends 0.01 s after the wait."""
    script = tmp_path / "prog.py"
    script.write_text("print('hi')\n")
    ops0, ops1, lines0, lines1 = [], [], [], []
    for k in range(4):
        t = 1.0 + k
        for ops, kind, peer in ((ops0, "send", 1), (ops1, "recv", 0)):
            ops.append(OpRecord(id=k + 1, kind=kind, op="i" + kind, bytes=MB4, peer=peer, group=0, blocking=False,
                                t_issue=t, t_issue_end=t, waits=[(t, t + wait)]))
        lines0.append(StepRecord(step=k, step_s=wait + 0.05, t_line=t + wait + 0.01))
        lines1.append(StepRecord(step=k, step_s=wait + 0.05, t_line=t + wait + 0.01))
    group = [GroupRecord(index=0, ranks=[0, 1], backend=backend)]
    ranks = [RankProfile(rank=0, host="dc1-h1", dc="dc1", groups=group, ops=ops0, steps=lines0, t_start=0.5),
             RankProfile(rank=1, host="dc2-h1", dc="dc2", groups=group, ops=ops1, steps=lines1, t_start=0.5)]
    return ProgramProfile(program=program_identity([sys.executable, str(script)], str(tmp_path)),
                          topology=_topology().model_dump(mode="json"), topology_file="t.yaml", world_size=2,
                          started=1000.0, wall_s=6.0, ranks=ranks, transport_fingerprint=fingerprint)


def _calibration(overhead_s: float = 0.01, rate_Bps: float = 1e12, fingerprint: str = "f" * 64
                 ) -> TransportCalibration:
    costs = [PatternCost(pattern=p, overhead_s=overhead_s, rate_Bps=rate_Bps) for p in ("send", "exchange")]
    points = [CalibrationPoint(pattern="send", bytes=MB4, median_s=overhead_s + MB4 / rate_Bps)]
    return TransportCalibration(streams=8, fingerprint=fingerprint, measured_utc="2026-12-05 08:00:00",
                                load_average=1.0, points=points, costs=costs)


def test_the_fit_gives_the_overhead_and_the_rate():
    pts = [CalibrationPoint(pattern="send", bytes=b, median_s=0.001 + b / 1e9) for b in (1 << 16, 1 << 20, 4 << 20)]
    cost = fit_pattern(pts, "send")
    assert cost.overhead_s == pytest.approx(0.001) and cost.rate_Bps == pytest.approx(1e9)
    # a negative intercept is no overhead: the line through the origin
    pts = [CalibrationPoint(pattern="send", bytes=b, median_s=s) for b, s in ((1 << 20, 0.0005), (4 << 20, 0.004))]
    cost = fit_pattern(pts, "send")
    assert cost.overhead_s == 0.0 and cost.seconds(4 << 20) == pytest.approx(0.004, rel=0.1)
    cal = fit_calibration(pts, streams=8, measured_utc="now", load_average=0.5, fingerprint="x")
    assert [c.pattern for c in cal.costs] == ["send"]
    with pytest.raises(ProfileError, match="has no 'exchange' cost"):
        cal.cost("exchange")


def test_each_atlas_wan_transfer_pays_the_overhead_and_the_floor(tmp_path):
    """The overhead adds to every atlas transfer across the WAN (here one a step, on
    rank 1's step); a rate below the link's is a floor under the transfer's time."""
    prof = _profile(tmp_path)
    topo = retarget(prof.network, 0.01)
    base = predict(prof, topo, extra_rtts=0.0, windows={})
    slower = predict(prof, topo, extra_rtts=0.0, windows={}, transport=_calibration(0.01))
    assert slower.ranks[1].steps[1] == pytest.approx(base.ranks[1].steps[1] + 0.01, abs=1e-6)
    assert slower.transport_costs and slower.transport_costs[0].overhead_s == 0.01
    floor = predict(prof, topo, extra_rtts=0.0, windows={}, transport=_calibration(0.0, 1e7))
    assert floor.ranks[1].steps[1] > MB4 / 1e7  # 4 MiB at 10 MB/s: 0.42 s, more than the link's 35 ms
    assert base.ranks[1].steps[1] < 0.1


def test_the_overhead_leaves_the_fitted_round_trips_and_stays_at_a_shorter_rtt(tmp_path):
    """Transfers waited for 0.2 s at 50 ms RTT: without a calibration the fit puts what the
    network model lacks into round trips, which shrink at 10 ms; a measured overhead per
    transfer takes its share out of them and keeps it at 10 ms."""
    from testbed_core.program.predict import algorithms_for, fit_extra_rtts

    prof = _profile(tmp_path, wait=0.2)
    cal = _calibration(0.02)
    algos = algorithms_for(prof.atlas_all_reduce)
    alone = fit_extra_rtts(prof, {}, None, algos, 1)
    with_cost = fit_extra_rtts(prof, {}, None, algos, 1, cal)
    assert 0 < with_cost < alone and alone - with_cost == pytest.approx(0.02 / 0.05, abs=0.02)
    at10 = retarget(prof.network, 0.01)
    gap = (predict(prof, at10, windows={}, transport=cal).ranks_mean_s_per_step
           - predict(prof, at10, windows={}).ranks_mean_s_per_step)
    assert gap == pytest.approx(0.02 - 0.02 / 0.05 * 0.01, abs=0.002)  # the overhead, less the round trips it took


def test_gloo_needs_no_calibration_and_ignores_one(tmp_path):
    prof = _profile(tmp_path, backend="gloo")
    assert not needs_calibration(prof) and needs_calibration(_profile(tmp_path))
    topo = retarget(prof.network, 0.01)
    with_cost = predict(prof, topo, extra_rtts=0.0, windows={}, transport=_calibration(0.05))
    assert with_cost.ranks[1].steps == predict(prof, topo, extra_rtts=0.0, windows={}).ranks[1].steps


def test_read_calibration_refuses_another_format_or_transport_version(tmp_path):
    prof = _profile(tmp_path, fingerprint="a" * 64)
    assert read_calibration(tmp_path, prof) is None  # none there
    path = tmp_path / CALIBRATION_FILE
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        read_calibration(tmp_path, prof)
    path.write_text(json.dumps({**_calibration().model_dump(), "format": 2}))
    with pytest.raises(ProfileError, match=r"format 2, this version reads format 1.*--transport-cost measure"):
        read_calibration(tmp_path, prof)
    path.write_text(json.dumps({**_calibration().model_dump(), "costs": "fast"}))
    with pytest.raises(ProfileError, match="not a transport calibration this version reads"):
        read_calibration(tmp_path, prof)
    path.write_text(_calibration(fingerprint="b" * 64).model_dump_json())
    with pytest.raises(ProfileError, match=r"another version of atlas_transport.*bbbbbbbbbbbb there, aaaaaaaaaaaa"):
        read_calibration(tmp_path, prof)
    path.write_text(_calibration(fingerprint="a" * 64).model_dump_json())
    assert read_calibration(tmp_path / PROFILE_FILE, prof).fingerprint == "a" * 64


def test_whatif_program_asks_for_the_calibration_of_an_atlas_profile(tmp_path):
    out = tmp_path / "launch"
    out.mkdir()
    (out / PROFILE_FILE).write_text(_profile(tmp_path).model_dump_json())
    run = CliRunner().invoke
    result = run(main, ["whatif", "--program", str(out), "--rtt", "10ms"])
    assert result.exit_code != 0 and f"no {CALIBRATION_FILE} there" in result.output
    assert "--transport-cost measure" in result.output and "--transport-cost none" in result.output
    result = run(main, ["whatif", "--program", str(out), "--rtt", "10ms", "--transport-cost", "none"])
    assert result.exit_code == 0, result.output
    (out / CALIBRATION_FILE).write_text(_calibration(0.002).model_dump_json())
    result = run(main, ["whatif", "--program", str(out), "--rtt", "10ms"])
    assert result.exit_code == 0, result.output
    assert "atlas transport's own cost per WAN transfer" in result.output and "send 2.00 ms" in result.output
