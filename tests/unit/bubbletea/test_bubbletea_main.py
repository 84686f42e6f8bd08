"""`python -m bubbletea_agent` (bubbletea_agent/__main__.py): configuration errors, the
decode server, and the virtual-time what-if."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bubbletea_agent.__main__ import main
from bubbletea_agent.engine import ModelledEngine
from bubbletea_agent.kv_ship import connect_shipper
from testbed_core.contracts.bubbletea import PrefillModelSpec

ROOT = Path(__file__).resolve().parents[3]


def test_cli_reports_config_errors(tmp_path):
    # the command in this process (`python -m bubbletea_agent` itself is started by the
    # decode-server test below)
    (tmp_path / "a.yaml").write_text("owner: x\n")
    res = CliRunner().invoke(main, ["run", "--config", str(tmp_path / "a.yaml")])
    assert res.exit_code == 1
    assert "device: required field is missing" in res.stderr


def test_decode_server_command_receives_and_acknowledges(tmp_path):
    env = dict(os.environ, ATLAS_SECRET="bt-cli")
    proc = subprocess.Popen([sys.executable, "-m", "bubbletea_agent", "decode-server", "--host", "127.0.0.1",
                             "--port", "0", "--streams", "2", "--log", str(tmp_path / "d.jsonl")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "listening on" not in line:
            line = proc.stderr.readline()
            assert line, "decode server exited before listening"
        port = int(line.rsplit(":", 1)[1])
        kv = ModelledEngine(PrefillModelSpec(preset="small"), lambda n, p: 0.0).finish(40)
        shipper = connect_shipper("127.0.0.1", port, streams=2, secret="bt-cli")
        res = shipper.ship("cli-1", kv)
        shipper.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert json.loads(out.strip().splitlines()[-1])["received"] == 1
    logged = json.loads((tmp_path / "d.jsonl").read_text())
    assert logged["request_id"] == "cli-1" and logged["wire_bytes"] == kv.logical_bytes == res.wire_bytes
    assert logged["logical_shape"] == [4, 1, 4, 40, 32] and logged["mode"] == "modelled"


def test_simulate_prints_the_metrics_of_a_virtual_run():
    res = CliRunner().invoke(main, ["simulate", "--iterations", "3", "--rate", "50", "--seed", "1"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.output)
    assert metrics["prefill_requests"]["arrived"] > 0 and metrics["device_utilization"] > metrics["device_utilization_training"]
