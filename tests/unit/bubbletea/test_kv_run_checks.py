"""The runner's side of KV checks: what share of a cache crosses the wire (the workload's
scale, bounded for modelled caches), the decode server's check model on real devices, and
summary.json's kv_checks from the agents' request rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from testbed.run.bubbletea import decode_check_args, kv_checks, kv_wire_scale
from testbed.run.scenario import load_scenario
from testbed_core.contracts.bubbletea import PrefillModelSpec
from testbed_core.contracts.summary import KVChecks

ROOT = Path(__file__).resolve().parents[3]


def jobs(torch_device: str | None) -> dict:
    return {w: SimpleNamespace(device=SimpleNamespace(torch_device=torch_device)) for w in ("p0r0", "p0r1")}


def test_real_devices_ship_whole_caches_and_check_them_with_the_agents_model() -> None:
    scenario, _ = load_scenario(ROOT / "scenarios/real-bubbletea-2dc.yaml")
    wl = scenario.workload
    assert wl.gpu.mode == "real" and kv_wire_scale(scenario, wl) == 1.0
    args = decode_check_args(scenario, wl, jobs("cpu"))
    assert args[0] == "--check-model" and args[2:] == ["--check-device", "cpu"]
    assert PrefillModelSpec.model_validate_json(args[1]) == scenario.bubbletea.model


def test_modelled_caches_cross_at_the_workload_scale_bounded_by_kv_wire_scale() -> None:
    scenario, _ = load_scenario(ROOT / "scenarios/atlas-2dc-bubbletea.yaml")
    wl = scenario.workload
    assert decode_check_args(scenario, wl, jobs(None)) == []  # modelled caches: no model to decode with
    assert wl.scale == 1.0 and kv_wire_scale(scenario, wl) == scenario.bubbletea.kv_wire_scale == 0.001
    small = wl.model_copy(update={"scale": 1e-4})
    assert kv_wire_scale(scenario, small) == 1e-4  # a smaller workload scale wins: caches like every tensor


def test_kv_checks_count_the_decode_hosts_verdicts() -> None:
    rows = [
        {"status": "served", "kv_bytes": 1000, "kv_wire_bytes": 1000, "kv_digest_ok": True, "kv_decode_ok": True},
        {"status": "served", "kv_bytes": 1000, "kv_wire_bytes": 1000, "kv_digest_ok": True, "kv_decode_ok": False},
        {"status": "rejected", "kv_bytes": 500, "kv_wire_bytes": 0, "kv_digest_ok": False, "kv_decode_ok": None},
        {"status": "rejected", "kv_bytes": 0, "kv_wire_bytes": 0, "kv_digest_ok": None, "kv_decode_ok": None},
    ]
    got = KVChecks.model_validate_json(kv_checks(rows).model_dump_json())  # summary.json's typed field
    assert (got.shipped, got.digest_ok, got.digest_mismatches) == (3, 2, 1)
    assert (got.decode_checked, got.decode_passed, got.decode_failed) == (2, 1, 1)
    assert got.kv_bytes == got.wire_bytes == 2000 and got.wire_scale == 1.0
    assert kv_checks([]).wire_scale is None
