"""The agent wired to the real world (bubbletea_agent/runtime.py) against the emulated
GPU (testbed_runtime.device) in wall-clock time: a stand-in training worker shares the
device and publishes its slots (or its live status); the agent runs as its own process
(modelled mode, from a runner's job file), in-process with a real tiny Llama on the CPU
and KV caches shipped over atlas_transport (real mode), or in-process filling the
worker's live windows. Timing is never asserted tightly: the machine is shared."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bubbletea_agent.config import config_from_scenario, parse_config
from bubbletea_agent.metrics import guard_violations, read_request_rows, summarize
from testbed_core.contracts.bubbletea import BubbleTeaSettings, LivePaths
from testbed_runtime.device import Device
from testbed_runtime.live import Nudger, StatusWriter, status_path, wake_path
from testbed_runtime.live_reporter import LiveReporter
from testbed_runtime.readiness import READY_FD_ENV
from testbed_runtime.slots import Slot, SlotPublisher

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
        "gpu": {"type": "H100", "efficiency": 0.5},
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
    assert len(rows) == result["arrived"] and served, sorted({(r["reason"], (r.get("detail") or "")[:120]) for r in rows})
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


def test_gpu_profile_reaches_the_longest_chunk_admission_may_run(tmp_path):
    """On a GPU the short lengths sit on the kernel-launch floor, so the profile doubles
    on up to the longest chunk admission may run; on a CPU the configured lengths stand."""
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


# ------------------------------------------------------------------ live windows


def play_worker(device: Device, run_dir: Path, slots: Path, t0: float, iterations: int, period: float,
                busy: list[tuple[float, float]]) -> None:
    """Busy spans each iteration; in between, the live status says when the next begins
    (like SCHEDULED), and the next iteration's start is announced as it is decided."""
    name = device.name
    rep = LiveReporter(StatusWriter(status_path(run_dir, name)), Nudger(wake_path(run_dir, name)), lead_s=0.05)
    with SlotPublisher(slots, worker="w") as pub:
        for it in range(iterations):
            base = t0 + it * period
            pub.publish([Slot(it, 0, base + busy[0][1], period / 2)])  # epoch and iteration count
            for off, dur in busy:
                rep.scheduled(it, base + off)
                wait = base + off - time.time()
                if wait > 0:
                    time.sleep(wait)
                rep.busy()
                device.run("forward", "train:w", duration_s=dur, label=f"it{it}")
        rep.between()
        time.sleep(max(0.0, t0 + iterations * period - time.time()))
        rep.ended()
        pub.end()
    rep.close()


def test_agent_fills_live_windows_on_the_emulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bubbletea_agent.runtime import run

    run_dir = tmp_path / "run"
    dev = {"name": "dc1-h1-p0r0", "run_dir": str(run_dir), "mode": "modelled", "time_scale": 1.0,
           "gpu": "A100", "efficiency": 0.5}
    device = Device(dev["name"], run_dir, mode="modelled", time_scale=1.0)
    slots = run_dir / "slots" / "w.jsonl"
    live = LivePaths(status=status_path(run_dir, dev["name"]), wake=wake_path(run_dir, dev["name"]))
    section = BubbleTeaSettings.model_validate({
        "requests": {"rate": 60, "deadline": 1.0,
                     "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.5, "min": 16, "max": 2048}},
        "model": {"preset": "llama-3-8b"}, "window": "live"})
    cfg = config_from_scenario(section, device=dev, slots=slots, out_dir=tmp_path / "agent", shard_index=0,
                               shard_count=1, duration_s=30.0, seed=2, live=live, arrivals_until_iteration=5)
    assert cfg.window == "live" and cfg.live is not None
    result: dict = {}
    ready_r, ready_w = os.pipe()  # the agent announces readiness on it (testbed_runtime.readiness)
    monkeypatch.setenv(READY_FD_ENV, str(ready_w))
    agent = threading.Thread(target=lambda: result.update(run(cfg, install_signals=False)), daemon=True)
    agent.start()
    give_up = time.monotonic() + 60  # the agent loads (seconds on a busy machine)
    while agent.is_alive() and time.monotonic() < give_up and not select.select([ready_r], [], [], 0.1)[0]:
        pass
    line = os.read(ready_r, 4096) if select.select([ready_r], [], [], 0)[0] else b""
    os.close(ready_r)
    assert line, "the agent did not announce readiness within 60 s (or died: see the log above)"
    assert json.loads(line)["requests"] > 0
    t0 = time.time() + 0.2
    play_worker(device, run_dir, slots, t0, 6, 0.4, [(0.0, 0.1), (0.2, 0.1)])
    agent.join(60)
    assert result, "agent did not finish"
    rows = read_request_rows(tmp_path / "agent" / "requests.jsonl")
    assert len(rows) == result["arrived"] == result["served"] + result["rejected"] and result["served"] > 10
    records = device.timeline()
    window = [r for r in records if t0 <= r.start < t0 + 2.4]
    training = [r for r in window if r.kind == "forward"]
    prefill = [r for r in window if r.kind == "prefill"]
    busy = sum(r.end - r.start for r in training + prefill)
    print(f"\nlive windows: utilization {busy / 2.4:.0%} (training {sum(r.end - r.start for r in training) / 2.4:.0%})"
          f", {len(prefill)} holds, guard violations {guard_violations(window)}")
    assert busy / 2.4 > 0.75  # training alone: 50%
    assert result["counters"]["holds"] > 5
    count, waited = guard_violations(window)
    assert waited < 0.1  # a late wake-up on a loaded host may cost a little; never a whole hold
