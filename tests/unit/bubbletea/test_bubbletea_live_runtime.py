"""The agent (in-process, wall clock) on the real emulated GPU, driven by a stand-in
training worker's live status: prefill fills exactly the guaranteed windows. Timing is
asserted loosely: the machine is shared."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bubbletea_agent.config import config_from_scenario
from bubbletea_agent.live import LiveReporter, Nudger, StatusWriter, status_path, wake_path
from bubbletea_agent.metrics import guard_violations, read_request_rows
from bubbletea_agent.slots import Slot, SlotPublisher
from testbed_core.device import Device


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


def test_agent_fills_live_windows_on_the_emulated_gpu(tmp_path: Path) -> None:
    from bubbletea_agent.runtime import run

    run_dir = tmp_path / "run"
    dev = {"name": "dc1-h1-p0r0", "run_dir": str(run_dir), "mode": "modelled", "time_scale": 1.0,
           "gpu": "A100", "efficiency": 0.5}
    device = Device(dev["name"], run_dir, mode="modelled", time_scale=1.0)
    slots = run_dir / "slots" / "w.jsonl"
    live = {"status": str(status_path(run_dir, dev["name"])), "wake": str(wake_path(run_dir, dev["name"])),
            "gate": None}
    section = {"requests": {"rate": 60, "deadline": 1.0,
                            "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.5, "min": 16, "max": 2048}},
               "model": {"preset": "llama-3-8b"}, "window": "live"}
    cfg = config_from_scenario(section, device=dev, slots=slots, out_dir=tmp_path / "agent", shard_index=0,
                               shard_count=1, duration_s=30.0, seed=2, live=live, arrivals_until_iteration=5)
    assert cfg.window == "live" and cfg.live is not None
    result: dict = {}
    agent = threading.Thread(target=lambda: result.update(run(cfg, install_signals=False)), daemon=True)
    agent.start()
    time.sleep(1.5)  # the agent loads
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
