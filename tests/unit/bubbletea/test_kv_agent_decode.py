"""A real agent (tiny Llama on the CPU, real prefill in the slots of a played training)
ships whole KV caches over atlas_transport to a decode server holding the same model: every
served request's record says its digest and its decode step passed (the agent's chunk
labels name the request, whose synthetic prompt the decode host rebuilds)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_bubbletea_runtime import play_training  # noqa: E402

from bubbletea_agent.config import parse_config  # noqa: E402
from bubbletea_agent.decode_check import DecodeChecker  # noqa: E402
from bubbletea_agent.kv_ship import DecodeServer  # noqa: E402
from bubbletea_agent.metrics import read_request_rows  # noqa: E402
from testbed_core.contracts.bubbletea import PrefillModelSpec  # noqa: E402
from testbed_runtime.device import Device  # noqa: E402


def test_agent_records_the_decode_hosts_checks(tmp_path: Path) -> None:
    from bubbletea_agent.runtime import run

    model = {"preset": "tiny", "dtype": "float32", "seed": 4}
    server = DecodeServer.start("127.0.0.1", 0, streams=1, secret="kv-agent", keep_tensors=False,
                                checker=DecodeChecker(PrefillModelSpec(**model), "cpu"),
                                log_path=str(tmp_path / "decode.jsonl"))
    run_dir = tmp_path / "run"
    device = Device("dc1-h1-gpu0", run_dir, mode="real")
    cfg = parse_config({
        "owner": "bt-dc1-h1",
        "device": {"name": "dc1-h1-gpu0", "run_dir": str(run_dir), "mode": "real", "torch_device": "cpu"},
        "slots": str(tmp_path / "slots.jsonl"), "out_dir": str(tmp_path / "out"),
        "model": model,
        "requests": {"kind": "poisson", "rate_per_s": 15, "duration_s": 1.2, "deadline_s": 3.0, "seed": 3,
                     "lengths": {"kind": "uniform", "min": 16, "max": 96}},
        "profile": {"lengths": [16, 64], "repeats": 1},
        "guard": {"initial_rel": 0.5, "abs_floor_s": 0.005},
        "decode": {"host": "127.0.0.1", "port": server.port, "streams": 1, "secret": "kv-agent"},
        "max_runtime_s": 40,
    })
    result: dict = {}
    agent = threading.Thread(target=lambda: result.update(run(cfg, install_signals=False)))
    agent.start()
    try:
        # training starts once the agent has profiled its prefill (3 timed runs; slow on a busy machine);
        # requests count from the first slot it announces
        give_up = time.time() + 120
        while time.time() < give_up and len([r for r in device.timeline() if r.label.startswith("profile")]) < 3:
            time.sleep(0.1)
        t0 = time.time() + 0.5
        play_training(device, tmp_path / "slots.jsonl", t0, 3, 0.5, [(0.0, 0.1), (0.3, 0.1)], real=True)
        agent.join(60)
    finally:
        server.stop()
    assert not agent.is_alive()
    rows = read_request_rows(tmp_path / "out" / "requests.jsonl")
    served = [r for r in rows if r["status"] == "served"]
    assert served, rows
    assert all(r["kv_digest_ok"] is True and r["kv_decode_ok"] is True for r in served), served
    assert result["counters"]["kv_decode_passed"] == len(served) and result["counters"]["kv_decode_failed"] == 0
    assert all(r["kv_wire_bytes"] == r["kv_bytes"] for r in served)  # whole caches crossed
    decoded = [json.loads(line) for line in (tmp_path / "decode.jsonl").read_text().splitlines()]
    assert all(d["decode_check"]["ok"] for d in decoded) and len(decoded) == len(served)
