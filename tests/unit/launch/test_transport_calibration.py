"""The atlas transport's cost measured on this machine (testbed/launch/transport_calibration.py)
and its place in `testbed launch --profile` (testbed/launch/profile.py: calibrate_transport)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import testbed.launch.transport_calibration as tc
from testbed.launch.profile import calibrate_transport
from testbed_core.program.profile import GroupRecord, ProgramProfile, RankProfile, program_identity
from testbed_core.program.transport import CALIBRATION_FILE, TransportCalibration
from testbed_core.topology import parse_topology

ROOT = Path(__file__).resolve().parents[3]


def _profile(backend: str, env: dict[str, str] | None = None) -> ProgramProfile:
    topo = parse_topology({"name": "t", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
                           "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}]}, "t.yaml")
    group = [GroupRecord(index=0, ranks=[0, 1], backend=backend)]
    ranks = [RankProfile(rank=r, host=f"dc{r + 1}-h1", dc=f"dc{r + 1}", groups=group, t_start=0.0) for r in (0, 1)]
    return ProgramProfile(program=program_identity(["true"], "."), topology=topo.model_dump(mode="json"),
                          topology_file="t.yaml", world_size=2, started=0.0, wall_s=1.0, ranks=ranks, env=env or {})


def test_a_gloo_profile_is_not_calibrated(tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "measure", lambda **_: pytest.fail("measured a gloo profile"))
    assert calibrate_transport(_profile("gloo"), tmp_path, print) is None
    assert not (tmp_path / CALIBRATION_FILE).exists()


def test_a_failed_measure_is_said_and_the_profile_stands(tmp_path, monkeypatch):
    def fail(streams: int) -> TransportCalibration:
        assert streams == 4  # the launch's ATLAS_STREAMS
        raise tc.CalibrationError("rank 1 exited 1: boom")

    monkeypatch.setattr(tc, "measure", fail)
    said: list[str] = []
    assert calibrate_transport(_profile("atlas", {"ATLAS_STREAMS": "4"}), tmp_path, said.append) is None
    assert "rank 1 exited 1: boom" in said[0] and "--transport-cost measure" in said[0]


def test_the_fingerprint_follows_the_transport_sources():
    first = tc.transport_fingerprint()
    assert len(first) == 64 and first == tc.transport_fingerprint()


@pytest.mark.long
def test_the_measure_on_loopback(tmp_path):
    """Two ranks of the atlas backend on 127.0.0.1 (spawned processes: seconds)."""
    cal = tc.measure(streams=2, sizes=(64 << 10, 1 << 20), repeats=2, python=sys.executable)
    assert {c.pattern for c in cal.costs} == {"send", "exchange"}
    assert len(cal.points) == 4 and all(p.median_s > 0 for p in cal.points)
    assert cal.fingerprint == tc.transport_fingerprint() and cal.streams == 2
    path = tc.write(cal, tmp_path)
    assert TransportCalibration.model_validate_json(path.read_text()) == cal
