"""`Calibration.from_report` (testbed_core/contracts/calibration.py): a kept run's
``summary.json`` calibration read back into the measurement its predictions used, so a
run can be re-predicted from its own calibration (scripts/repredict.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from testbed_core.contracts.calibration import Calibration, CalibrationReport

ROOT = Path(__file__).resolve().parents[3]


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def test_a_kept_calibration_reads_back_to_the_same_report() -> None:
    for name in ("results/sweep-paper-1f1b/p008-delay=100ms-rate=400Mbit/summary.json", "docs/atlas-4dc/summary.json"):
        data = json.loads((ROOT / name).read_text())["calibration"]
        cal = Calibration.from_report(CalibrationReport.model_validate(data))
        assert cal.paths and all(p.rates_bps and 1 in p.rates_bps for p in cal.paths)
        assert cal.rates_bps[1] == data["channel_rate_mbps"]["1"] * 1e6
        assert cal.even_spread is False  # a run before the even spread: its channels took chunks greedily
        back = json.loads(cal.report().model_dump_json())
        assert back.pop("even_spread") is False
        assert back.pop("even_spread_stream_bytes") is None
        assert back.pop("even_spread_chunks") == 1
        for key in ("lan_alone_channel_rate_mbps", "lan_alone_transfer_s", "verify",  # probes added later
                    "lan_tensor_pair", "lan_tensor_channel_rate_mbps", "lan_tensor_transfer_s",
                    "op_overhead_s", "op_overhead_samples_s",
                    "lan_loaded_with", "lan_loaded_channel_rate_mbps", "lan_loaded_transfer_s",
                    "lan_loaded_wan_transfer_s"):
            if key not in data:
                assert back.pop(key) is None
        for path, kept in zip(back["paths"], data["paths"], strict=True):
            if "turns" not in kept:  # the turns probe, added later
                assert path.pop("turns") is None
            for key in ("one_way_channel_rate_mbps", "one_way_transfer_s"):  # the one-way probe, added later
                if key not in kept:
                    assert path.pop(key) is None
        assert _close(back, data), name


def test_the_tensor_checks_calibration_reads_back() -> None:
    """``calibration.verify`` (runner.verify_tensors) survives the round trip, and a
    report without a fill or a check is refused (the planner needs both means)."""
    import pytest
    from pydantic import ValidationError

    from testbed_core.contracts.calibration import VerifyCalibration

    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=4096, latency_s=0.025,
                      verify=VerifyCalibration(nbytes=4096, fill_s=[0.004, 0.006], check_s=[0.01, 0.03]))
    back = Calibration.from_report(CalibrationReport.model_validate_json(cal.report().model_dump_json()))
    assert back.verify == cal.verify
    assert math.isclose(back.verify.fill_mean_s, 0.005) and math.isclose(back.verify.check_mean_s, 0.02)
    assert "the tensor checks (verify)" in cal.report().method
    with pytest.raises(ValidationError, match="check_s"):
        VerifyCalibration(nbytes=4096, fill_s=[0.004], check_s=[])


def test_a_new_calibration_says_its_channels_spread_tensors_evenly() -> None:
    """This checkout's transport spreads a tensor of at most two smallest chunks per
    stream evenly over a channel's streams (the planner then sends such tensors one after
    another); the report keeps it. A kept report without the chunk count spread one."""
    from atlas_transport.channel import SPLIT_MIN_BYTES, SPREAD_CHUNKS

    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=4096, latency_s=0.025)
    assert cal.even_spread is True and cal.even_spread_stream_bytes == SPLIT_MIN_BYTES  # the smallest chunk
    assert cal.even_spread_chunks == SPREAD_CHUNKS == 2
    report = cal.report()
    assert report.even_spread is True and report.even_spread_stream_bytes == SPLIT_MIN_BYTES
    back = Calibration.from_report(CalibrationReport.model_validate_json(report.model_dump_json()))
    assert back.even_spread is True and back.even_spread_stream_bytes == SPLIT_MIN_BYTES
    assert back.even_spread_chunks == SPREAD_CHUNKS
    before = report.model_dump()
    del before["even_spread_chunks"]
    assert Calibration.from_report(CalibrationReport.model_validate(before)).even_spread_chunks == 1
    # a run at 1745c66 spread every tensor: no size in its report
    at_1745c66 = CalibrationReport.model_validate({**report.model_dump(), "even_spread_stream_bytes": None})
    assert Calibration.from_report(at_1745c66).even_spread_stream_bytes is None
