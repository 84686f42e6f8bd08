"""The agent against the real emulated GPU (testbed_core.device) in wall-clock time:
a stand-in training worker shares the device and publishes its slots; the agent runs
as its own process (modelled mode) or in-process with a real tiny Llama on the CPU and
KV caches shipped over atlas_transport (real mode). Timing is never asserted tightly:
the machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bubbletea_agent.config import AgentConfigError, config_from_scenario, load_config, parse_config
from bubbletea_agent.metrics import guard_violations, read_request_rows, summarize
from bubbletea_agent.slots import Slot, SlotPublisher
from testbed_core.device import Device

ROOT = Path(__file__).resolve().parents[3]


def play_training(device: Device, slots_path: Path, t0: float, iterations: int, period: float,
                  busy: list[tuple[float, float]], real: bool = False) -> None:
    """A minimal training worker: publishes each iteration's gaps as slots, then asks for
    the device for each busy span at its planned time (or when the previous ends)."""
    with SlotPublisher(slots_path, worker="w0") as pub:
        for it in range(iterations):
            base = t0 + it * period
            gaps = []
            for k, (off, dur) in enumerate(busy):
                nxt = busy[k + 1][0] if k + 1 < len(busy) else period
                if nxt > off + dur:
                    gaps.append(Slot(it, len(gaps), base + off + dur, nxt - off - dur))
            pub.publish(gaps)
            for k, (off, dur) in enumerate(busy):
                wait = base + off - time.time()
                if wait > 0:
                    time.sleep(wait)
                if real:
                    device.run("forward", "trainer", fn=lambda d=dur: time.sleep(d), label=f"it{it}-p{k}")
                else:
                    device.run("forward", "trainer", duration_s=dur, label=f"it{it}-p{k}")
        wait = t0 + iterations * period - time.time()
        if wait > 0:
            time.sleep(wait)
        pub.end()


def test_agent_process_fills_bubbles_on_the_emulated_gpu(tmp_path):
    """The scenario runner's way: `python -m bubbletea_agent job.json`."""
    run_dir = tmp_path / "run"
    device = Device("dc0-h1-gpu0", run_dir, mode="modelled", time_scale=1.0)
    job = {
        "device": {"name": "dc0-h1-gpu0", "run_dir": str(run_dir), "mode": "modelled", "time_scale": 1.0},
        "slots_path": str(tmp_path / "slots" / "dc0-h1-gpu0.jsonl"), "worker": "p0-s0", "host": "dc0-h1",
        "bubbletea": {"enabled": True, "chunk_tokens": 512, "guard": 0.1,
                      "requests": {"rate": 300, "deadline": 2.0,
                                   "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.6,
                                                     "min": 16, "max": 4096}},
                      "model": {"preset": "llama-3-8b"}},
        "seed": 5, "out": str(tmp_path / "agents" / "p0-s0.json"),
        "agent_index": 0, "agent_count": 2, "duration_s": 3.0,
        "gpu": {"type": "H100", "efficiency": 0.5}, "some_runner_field": 1,
    }
    (tmp_path / "agents").mkdir()
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = subprocess.Popen([sys.executable, "-m", "bubbletea_agent", str(tmp_path / "job.json")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the agent opens its request log once it is up (imports take seconds on a busy host)
        give_up = time.time() + 90
        while not (tmp_path / "agents" / "p0-s0.requests.jsonl").exists():
            assert proc.poll() is None and time.time() < give_up, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        t0 = time.time() + 0.5  # slots are announced just before training starts
        play_training(device, tmp_path / "slots" / "dc0-h1-gpu0.jsonl", t0, 6, 0.5,
                      [(0.0, 0.15), (0.25, 0.15)])
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "agents" / "p0-s0.json").read_text())
    rows = read_request_rows(tmp_path / "agents" / "p0-s0.requests.jsonl")
    assert summary["engine_mode"] == "modelled" and summary["device_mode"] == "modelled"
    assert summary["owner"] == "bubbletea:p0-s0"
    assert len(rows) == summary["arrived"] == summary["served"] + summary["rejected"]
    assert summary["served"] > 20
    assert t0 - 1.0 < summary["epoch"] < t0  # request time zero: when the first slot was announced
    records = device.timeline()
    m = summarize(rows, records, t0, t0 + 3.0)
    print("\nmodelled agent process:", json.dumps({k: m[k] for k in (
        "device_utilization_training", "device_utilization", "guard_violations",
        "training_wait_on_prefill_s", "ttft_p50_s", "ttft_p99_s")}))
    assert m["device_utilization_training"] == pytest.approx(0.6, abs=0.03)
    assert m["device_utilization"] > m["device_utilization_training"] + 0.15
    prefills = [r for r in records if r.kind == "prefill"]
    assert prefills and all(r.owner == "bubbletea:p0-s0" for r in prefills)
    # training is not slowed: the last piece ends close to its planned end (generous margin)
    last = max(r.end for r in records if r.kind == "forward")
    assert last - (t0 + 5 * 0.5 + 0.4) < 0.1
    assert summary["guard_violations"] <= m["guard_violations"] + 1


def test_real_tiny_llama_on_device_ships_kv_over_atlas(tmp_path):
    pytest.importorskip("atlas_transport.channel")
    from bubbletea_agent.kv_ship import DecodeServer
    from bubbletea_agent.runtime import run

    server = DecodeServer.start("127.0.0.1", 0, streams=2, secret="bt-rt", keep_tensors=False,
                                log_path=str(tmp_path / "decode.jsonl"))
    run_dir = tmp_path / "run"
    device = Device("dc1-h1-gpu0", run_dir, mode="real")
    t0 = time.time() + 3.0
    cfg = parse_config({
        "owner": "bt-dc1-h1",
        "device": {"name": "dc1-h1-gpu0", "run_dir": str(run_dir), "mode": "real", "torch_device": "cpu"},
        "slots": str(tmp_path / "slots.jsonl"), "out_dir": str(tmp_path / "out"), "epoch": t0,
        "model": {"preset": "tiny", "dtype": "float32"},
        "requests": {"kind": "poisson", "rate_per_s": 20, "duration_s": 1.5, "deadline_s": 3.0, "seed": 2,
                     "lengths": {"kind": "uniform", "min": 16, "max": 128}},
        "profile": {"lengths": [16, 64, 128], "repeats": 2},
        "guard": {"initial_rel": 0.5, "abs_floor_s": 0.005},
        "decode": {"host": "127.0.0.1", "port": server.port, "streams": 2, "secret": "bt-rt"},
        "max_runtime_s": 40,
    })
    result: dict = {}
    agent = threading.Thread(target=lambda: result.update(run(cfg, install_signals=False)))
    agent.start()
    try:
        play_training(device, tmp_path / "slots.jsonl", t0, 4, 0.5, [(0.0, 0.1), (0.3, 0.1)], real=True)
        agent.join(60)
    finally:
        server.stop()
    assert not agent.is_alive()
    assert result["engine_mode"] == "real"
    assert result["latency"]["source"].startswith("profiled:dc1-h1-gpu0:cpu")
    rows = read_request_rows(tmp_path / "out" / "requests.jsonl")
    served = [r for r in rows if r["status"] == "served"]
    assert len(rows) == result["arrived"] and served
    decoded = [json.loads(line) for line in (tmp_path / "decode.jsonl").read_text().splitlines()]
    assert {d["request_id"] for d in decoded} >= {r["id"] for r in served}
    for r in served:  # TTFT ends at arrival on the decode host, after the prefill ended
        assert r["ttft"] >= r["end"] - r["arrival"] - 1e-6
        assert r["kv_bytes"] == 2 * 2 * 2 * r["prompt_tokens"] * 16 * 4  # tiny: 2 layers, 2 kv heads, dim 16
    records = device.timeline()
    prefills = [r for r in records if r.kind == "prefill" and not r.label.startswith("profile")]
    assert prefills and all(r.mode == "real" for r in prefills)
    # profiling at start never made training wait
    profiles = [r for r in records if r.label.startswith("profile")]
    assert len(profiles) == 1 + 3 * 2 and guard_violations(
        [r for r in records if r.kind != "prefill" or r.label.startswith("profile")])[0] == 0
    m = summarize(rows, records, t0, t0 + 2.0)
    print("\nreal tiny llama:", json.dumps({k: m[k] for k in (
        "device_utilization_training", "device_utilization", "guard_violations", "ttft_p50_s")}))


def test_config_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "a.yaml"
    bad.write_text("device: {name: x, run_dir: /tmp}\nslots: s\nout_dir: o\nrequests: {kind: poisson, rate_per_s: 1, lengths: {kind: fixed, tokens: 8}}\nfoo: 1\n")
    with pytest.raises(AgentConfigError) as exc:
        load_config(bad)
    msg = str(exc.value)
    assert "a.yaml: invalid BubbleTea agent configuration" in msg
    assert "foo: unknown field" in msg and "requests.poisson: poisson request source needs duration_s or count" in msg
    with pytest.raises(AgentConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "b.yaml").write_text("- 1\n")
    with pytest.raises(AgentConfigError, match="is a mapping"):
        load_config(tmp_path / "b.yaml")


def test_cli_reports_config_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("owner: x\n")
    proc = subprocess.run([sys.executable, "-m", "bubbletea_agent", "run", "--config", str(tmp_path / "a.yaml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "device: required field is missing" in proc.stderr


def test_config_from_scenario_section(tmp_path):
    section = {"enabled": True, "requests": {"rate": 40, "deadline": 4.0,
                                             "prompt_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.5,
                                                               "min": 16, "max": 2048}},
               "model": {"preset": "llama-3-8b", "num_hidden_layers": 8}, "chunk_tokens": 256, "guard": 0.08}
    cfgs = [config_from_scenario(section, device={"name": f"g{i}", "run_dir": str(tmp_path)},
                                 slots=tmp_path / f"s{i}", out_dir=tmp_path / f"o{i}", shard_index=i,
                                 shard_count=2, duration_s=10, epoch=123.0, seed=9) for i in range(2)]
    c = cfgs[0]
    assert c.requests.rate_per_s == 40 and c.requests.lengths.mean == 600 and c.requests.deadline_s == 4.0
    assert c.admission.chunking and c.admission.max_chunk_tokens == 256
    assert c.guard.initial_rel == 0.08 and c.model.num_hidden_layers == 8 and c.epoch == 123.0
    from bubbletea_agent.requests import load_requests

    a, b = (load_requests(x.requests) for x in cfgs)
    assert not {r.id for r in a} & {r.id for r in b} and 300 < len(a) + len(b) < 500
    whole = config_from_scenario({"chunk_tokens": 0, "requests": {"trace": "t.csv"}},
                                 device={"name": "g", "run_dir": str(tmp_path)}, slots="s", out_dir="o",
                                 shard_index=0, shard_count=1, duration_s=5, base_dir=tmp_path)
    assert not whole.admission.chunking and whole.requests.path == tmp_path / "t.csv"


def test_job_file_defaults_and_errors(tmp_path, caplog):
    from bubbletea_agent.job import config_from_job, load_job

    base = {"device": {"name": "g0", "run_dir": str(tmp_path), "mode": "modelled", "time_scale": 1.0},
            "slots_path": "s.jsonl", "worker": "p1-s0", "out": str(tmp_path / "agents" / "p1-s0.json")}
    (tmp_path / "j.json").write_text(json.dumps(base))
    cfg = config_from_job(load_job(tmp_path / "j.json"))
    assert cfg.model.preset == "llama-3-8b" and cfg.device.gpu == "H100" and cfg.owner == "bubbletea:p1-s0"
    assert cfg.requests.shard_count == 1 and cfg.requests.duration_s == 600 and cfg.epoch is None
    assert cfg.out_dir == tmp_path / "agents" and cfg.decode is None
    assert "takes the whole request rate" in caplog.text
    real = dict(base, device=dict(base["device"], mode="real"),
                gpu={"type": "custom", "peak_tflops": 50, "efficiency": 0.4}, agent_index=2, agent_count=3,
                decode={"host": "10.0.0.9", "port": 7071})
    (tmp_path / "k.json").write_text(json.dumps(real))
    cfg = config_from_job(load_job(tmp_path / "k.json"))
    assert cfg.model.preset == "tiny" and cfg.device.gpu == "custom" and cfg.device.peak_tflops == 50
    assert cfg.requests.shard_index == 2 and cfg.decode.host == "10.0.0.9" and cfg.decode.port == 7071
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(AgentConfigError, match=r"bad.json: the agent job is not JSON"):
        load_job(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({"device": {}, "worker": "w"}))
    with pytest.raises(AgentConfigError, match=r"short.json: invalid agent job: slots_path: Field required"):
        load_job(tmp_path / "short.json")


def test_decode_server_command_receives_and_acknowledges(tmp_path):
    pytest.importorskip("atlas_transport.channel")
    import os
    import signal

    from bubbletea_agent.engine import ModelledEngine, ModelSpec
    from bubbletea_agent.kv_ship import connect_shipper

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
        kv = ModelledEngine(ModelSpec(preset="small"), lambda n, p: 0.0).finish(40)
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


def test_gpu_profile_reaches_the_longest_chunk_admission_may_run(tmp_path):
    """On a GPU the short lengths sit on the launch floor (H200: ~23 ms up to 512
    tokens for an 8B model), so the profile doubles on up to the longest chunk; on a
    CPU the configured lengths stand."""
    from bubbletea_agent.runtime import LONGEST_UNCHUNKED, profile_lengths

    def cfg(admission, preset="tiny"):
        return parse_config({
            "owner": "bt", "device": {"name": "g", "run_dir": str(tmp_path), "mode": "real"},
            "slots": str(tmp_path / "slots.jsonl"), "out_dir": str(tmp_path / "out"),
            "model": {"preset": preset}, "requests": {"kind": "poisson", "rate_per_s": 1, "duration_s": 1,
                                                      "lengths": {"kind": "fixed", "tokens": 64}},
            "profile": {"lengths": [64, 16, 256]}, "admission": admission,
        })

    assert profile_lengths(cfg({"max_chunk_tokens": 3000}), "cpu") == [16, 64, 256]
    assert profile_lengths(cfg({"max_chunk_tokens": 3000}), "cuda") == [16, 64, 256, 512, 1024, 2048, 3000]
    assert profile_lengths(cfg({"max_chunk_tokens": 200}), "cuda") == [16, 64, 256]
    whole = profile_lengths(cfg({"chunking": False}, preset="small"), "cuda")
    assert whole[-1] == LONGEST_UNCHUNKED and whole[3:] == [512, 1024, 2048, 4096]
    # never past the model's context (the tiny preset has 4096 positions)
    assert profile_lengths(cfg({"max_chunk_tokens": 10000}), "cuda")[-1] == 4096
