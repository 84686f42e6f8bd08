"""Wiring the agent to the real world: the host's emulated GPU (testbed_runtime.device), the
compute model, the slot file, the device timeline file (`TimelineTail`, over the shared
JSON-lines tailer of tail.py), atlas_transport to the decode host, and the output files.

Outputs in `out_dir`:
* `requests.jsonl`: one line per request as it ends (id, arrival, start, end, ttft,
  status, reason, predicted_s vs actual_s, chunks, kv_bytes, guard_violations);
  times are seconds after `epoch`.
* `agent.json`: the counters (served, rejected by reason, guard violations...), which
  engine mode ran, the latency model, the slot corrections learned, and the config.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubbletea_agent.admission import AdaptiveGuard, Admission
from bubbletea_agent.agent import Agent, WallClock, Work
from bubbletea_agent.config import AgentConfig, DeviceConfig
from bubbletea_agent.engine import (
    EngineError,
    ModelledEngine,
    TransformersEngine,
    compute_model_charge,
)
from bubbletea_agent.latency import FunctionLatency, LatencyModel, fit, profile
from bubbletea_agent.requests import Reason, load_requests
from bubbletea_agent.slots import SlotFeed, SlotTracker
from bubbletea_agent.tail import JsonlTail
from testbed_core.contracts.bubbletea import PrefillModelSpec
from testbed_runtime.readiness import announce_ready

log = logging.getLogger(__name__)

_CM_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class TimelineTail:
    """The agent's view of a device timeline (one JSON line per finished piece of work)."""

    def __init__(self, path: str | Path) -> None:
        self._tail = JsonlTail(path)

    @property
    def path(self) -> Path:
        return self._tail.path

    def poll(self) -> list[Work]:
        """Work finished since the previous poll; an unreadable line is logged and skipped."""
        out = []
        for _, raw in self._tail.poll():
            try:
                d = json.loads(raw)
                out.append(Work(d["kind"], d["owner"], d.get("label", ""), float(d.get("requested", d["start"])),
                                float(d["start"]), float(d["end"])))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping unreadable timeline line %r", self.path, raw[:80])
        return out


def compute_model_for(dev: DeviceConfig, spec: PrefillModelSpec) -> Any:
    """The compute model that charges this device (same GPU figures as the worker's)."""
    from testbed_core.compute_model import ComputeModel, GpuSpec, gpu_spec, load_profile

    dtype = _CM_DTYPE[spec.dtype]
    if dev.gpu.lower() == "custom":
        if dev.peak_tflops is None:
            raise EngineError("device.gpu custom needs device.peak_tflops (dense TFLOP/s)")
        gpu = GpuSpec("custom", {dtype: dev.peak_tflops * 1e12}, (dev.memory_bandwidth_gbs or 1e3) * 1e9, 0.0)
    else:
        gpu = gpu_spec(dev.gpu)
    prof = load_profile(dev.profile) if dev.profile else None
    return ComputeModel(gpu, dtype=dtype, efficiency=dev.efficiency, tp=dev.tp, profile=prof)


def open_device(dev: DeviceConfig, compute: Any) -> Any:
    from testbed_runtime.device import Device

    return Device(dev.name, dev.run_dir, mode=dev.mode, compute=compute, time_scale=dev.time_scale)


def profile_on_device(device: Any, engine: TransformersEngine, owner: str, lengths: list[int],
                      repeats: int, slots_path: str | Path | None = None,
                      timeout_s: float = 120.0) -> LatencyModel:
    """Time real prefills on the device and fit the latency curve.

    Profiling must not delay training either: each timed run takes the device only when
    it is free (`try_run`) and either training has not announced a slot yet (it has not
    started) or the current announced slot has room for it (at least half the slot, and
    three times what this length took before)."""
    feed = SlotFeed(slots_path) if slots_path is not None else None
    tracker = SlotTracker()
    took: dict[int, float] = {}

    def room_for(n: int, now: float) -> bool:
        if feed is not None:
            for msg in feed.poll():
                tracker.publish(msg)
        if tracker.published == 0:
            return True
        slot = tracker.current(now)
        need = max(0.5 * slot.length if slot else 0.0, 3 * max(took.get(n, 0.0), took.get(-1, 0.0)))
        return slot is not None and slot.end - now >= need

    def once(n: int) -> float:
        give_up = time.time() + timeout_s
        while time.time() < give_up:
            if room_for(n, time.time()):
                rec = device.try_run("prefill", owner, fn=lambda: engine.forward(n, None), label=f"profile:{n}")
                if rec is not None:
                    took[n] = took[-1] = rec.end - rec.start
                    return rec.end - rec.start
            time.sleep(0.002)
        raise EngineError(f"could not profile a {n}-token prefill on {device.name} within {timeout_s:.0f} s: "
                          "the device was never free in a slot with room (start the agent before training)")

    samples = profile(once, lengths, repeats=repeats, warmup=1)
    return fit(samples, source=f"profiled:{device.name}:{engine.torch_device}")


LONGEST_UNCHUNKED = 4096  # profile this far when admission may run whole prompts


def profile_lengths(cfg: AgentConfig, torch_device: str) -> list[int]:
    """The prompt lengths to time at start. On a GPU the short lengths sit on the
    kernel-launch floor (bubbletea_agent/README.md), so their slope is noise and
    extrapolating it to a long chunk mispredicts it badly either way: there the
    profile doubles on up to the longest chunk admission may run (capped at the
    model's context). On a CPU the configured lengths are
    compute-bound already and the fit extrapolates well."""
    lengths = sorted(set(cfg.profile.lengths))
    if torch_device == "cpu":
        return lengths
    context = min(cfg.admission.max_prompt_tokens, cfg.model.max_position_embeddings)
    longest = cfg.admission.max_chunk_tokens if cfg.admission.chunking and cfg.admission.max_chunk_tokens else (
        LONGEST_UNCHUNKED)
    longest = min(longest, context)
    n = lengths[-1]
    while n < longest:
        n = min(2 * n, longest)
        lengths.append(n)
    return lengths


@dataclass
class Built:
    agent: Agent
    device: Any
    config: AgentConfig
    latency: LatencyModel
    notes: list[str] = field(default_factory=list)
    link: Any = None  # controller.client.AgentLink (dispatch: controller)


def build(cfg: AgentConfig, on_record: Any = None, connect: Any = None) -> Built:
    """Everything the agent needs, from its configuration. `connect` overrides how the
    KV shipper reaches the decode host (tests)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    compute = compute_model_for(cfg.device, cfg.model)
    device = open_device(cfg.device, compute)
    notes: list[str] = []
    if cfg.device.mode == "real":
        engine: Any = TransformersEngine(cfg.model, cfg.device.torch_device)
        if engine.torch_device == "cpu":
            import torch

            torch.set_num_threads(cfg.device.cpu_threads)
        lengths = profile_lengths(cfg, engine.torch_device)
        latency = profile_on_device(device, engine, cfg.owner, lengths, cfg.profile.repeats,
                                    cfg.slots, cfg.profile.timeout_s)
        notes.append(f"real prefill of a Llama model on {engine.torch_device}")
    else:
        import torch

        torch.set_num_threads(1)  # no heavy math here; intra-op threads only fight the host's cores
        charge = compute_model_charge(cfg.model, compute)
        engine = ModelledEngine(cfg.model, charge, cfg.materialise_limit_bytes, wire_scale=cfg.kv_wire_scale)
        scale = device.time_scale

        def predicted(tokens: int, context: int) -> float:
            return charge(tokens, context) * scale

        latency = FunctionLatency(predicted, source=f"compute-model:{compute.gpu.name} "
                                                    f"eff {compute.efficiency:g} x time_scale {scale:g}")
        notes.append("modelled prefill: device held for the compute model's time; KV cache of the "
                     "model's true shape (scaled down above materialise_limit_bytes, see kv_bytes)")
    shipper = None
    if cfg.decode is not None:
        from bubbletea_agent.kv_ship import AsyncShipper, connect_shipper

        d = cfg.decode

        def default_connect() -> Any:
            # the decode server may still be starting: retry a refused connection until the timeout
            give_up = time.monotonic() + d.connect_timeout_s
            while True:
                try:
                    return connect_shipper(d.host, d.port, streams=d.streams, secret=d.secret,
                                           shared_clock=d.shared_clock, pad_to_logical=d.pad_to_logical,
                                           wire_scale=cfg.kv_wire_scale if cfg.device.mode == "modelled" else 1.0,
                                           rest_rate_bps=d.rest_rate_bps, max_rate_bps=d.max_rate_bps,
                                           connect_timeout_s=d.connect_timeout_s)
                except Exception as exc:  # noqa: BLE001 - refused while it starts; anything else is final
                    if "refused" not in str(exc).lower() or time.monotonic() > give_up:
                        raise
                    time.sleep(0.2)

        shipper = AsyncShipper(connect or default_connect)
    live_bound, waker = None, None
    if cfg.live is not None:
        from bubbletea_agent.live import bound_from
        from testbed_runtime.live import StatusReader, Waker

        status = StatusReader(cfg.live.status)
        gate = StatusReader(cfg.live.gate) if cfg.live.gate is not None else None

        def live_bound() -> float:
            return bound_from(status.read(), gate.read() if gate is not None else None)

        waker = Waker(cfg.live.wake) if cfg.live.wake is not None else None
        notes.append(f"admission fills {cfg.window} windows (live: the worker's guarantees in {cfg.live.status})")
    if cfg.window == "naive":
        # colocation: every moment the device is free is a window, and nothing guards training
        def live_bound() -> float:
            return math.inf

        notes.append("naive colocation: a whole chunk whenever the device is free, no guard")
    context = min(cfg.admission.max_prompt_tokens, cfg.model.max_position_embeddings)
    admission_cfg = cfg.admission.model_copy(update={"max_prompt_tokens": context})
    link = None
    if cfg.controller is not None:
        from bubbletea_agent.controller.auth import agent_token, run_secret
        from bubbletea_agent.controller.client import AgentLink
        from testbed_core.contracts.prefill_service import AgentHello

        points = sorted({n for n in (16, 64, 256, 1024, 4096, 16384, 65536) if n < context} | {context})
        hello = AgentHello(device=device.name, decode_host=cfg.controller.decode_host,
                           predict_s={n: latency.predict(n, 0) for n in points}, max_prompt_tokens=context)
        link = AgentLink(cfg.controller.host, cfg.controller.port, cfg.controller.name, hello,
                         token=agent_token(run_secret(who=f"agent {cfg.controller.name}"), cfg.controller.name))
        if on_record is not None:
            write = on_record

            def on_record(rec: dict[str, Any]) -> None:
                write(rec)
                link.ended(rec, agent.epoch)
        else:
            def on_record(rec: dict[str, Any]) -> None:
                link.ended(rec, agent.epoch)

        notes.append(f"work from the prefill controller at {cfg.controller.host}:{cfg.controller.port}")
    agent = Agent(
        clock=WallClock(), device=device, slots=SlotFeed(cfg.slots),
        timeline=TimelineTail(device.timeline_path),
        tracker=SlotTracker(cfg.tracker.quantile, cfg.tracker.window, cfg.tracker.min_gap_s),
        admission=Admission(latency, admission_cfg, AdaptiveGuard(cfg.guard)),
        engine=engine, requests=load_requests(cfg.requests), epoch=cfg.epoch, shipper=shipper,
        owner=cfg.owner, poll_s=cfg.poll_s, idle_poll_s=cfg.idle_poll_s, settle_s=cfg.settle_s,
        on_record=on_record, live_bound=live_bound, window=cfg.window, waker=waker,
        arrivals_until_iteration=cfg.arrivals_until_iteration, arrivals_margin_s=cfg.arrivals_margin_s,
        realtime_holds=cfg.realtime_holds,
    )
    if link is not None:
        from bubbletea_agent.controller.dispatch import SERVICE_ORDER

        agent.inbox, agent.on_status, agent.order = link.take, link.status, SERVICE_ORDER
        agent.refuse_unreachable = False  # the controller admitted each request it sends here
        if cfg.live is not None and cfg.live.wake is not None:
            from testbed_runtime.live import Nudger

            link.on_work = Nudger(cfg.live.wake).poke  # new work ends the agent's sleep, as the worker does
    return Built(agent, device, cfg, latency, notes, link)


def run(cfg: AgentConfig, connect: Any = None, install_signals: bool = True,
        summary_path: str | Path | None = None, requests_path: str | Path | None = None) -> dict[str, Any]:
    """Run one agent until training ends (or SIGTERM/SIGINT, or max_runtime_s); write
    its outputs (default `out_dir`/agent.json and `out_dir`/requests.jsonl); return its
    summary. Once the agent is built and about to loop it announces readiness
    (testbed_runtime.readiness: the runner waits for it before training starts)."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the loop thread must get the interpreter back at once when it wakes to end a
    # prefill, not after the KV shipper's threads used up a 5 ms switch interval
    sys.setswitchinterval(0.0005)
    if cfg.nice is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, cfg.nice)
        except OSError as exc:
            log.warning("cannot set CPU priority %d (%s): prefills may end late under CPU contention",
                        cfg.nice, exc.strerror)
    summary_path = Path(summary_path) if summary_path else out / "agent.json"
    requests_path = Path(requests_path) if requests_path else out / "requests.jsonl"
    stop = {"flag": False}
    if install_signals:
        def _stop(signum: int, _frame: Any) -> None:
            log.info("signal %d: stopping after the current step", signum)
            stop["flag"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    with open(requests_path, "w", buffering=1) as rows:
        built = build(cfg, on_record=lambda rec: rows.write(json.dumps(rec) + "\n"), connect=connect)
        agent = built.agent
        if built.link is not None:
            built.link.start()
        gc.collect()
        gc.freeze()  # the libraries and the request list are permanent: collections stay short
        announce_ready(pid=os.getpid(), at=time.time(), requests=len(agent.requests))
        started = time.time()
        until = started + cfg.max_runtime_s if cfg.max_runtime_s else None
        log.info("BubbleTea agent %s on %s (%s mode): %d requests, latency %s", cfg.owner,
                 built.device.name, agent.engine.mode, len(agent.requests), built.latency.describe())

        def should_stop() -> bool:
            if stop["flag"]:
                return True
            no_slots = agent.tracker.published == 0 and time.time() - started > cfg.slot_wait_s
            if no_slots:
                log.error("no idle slot was published in %s within %.0f s: is the training worker "
                          "writing it?", cfg.slots, cfg.slot_wait_s)
            return no_slots

        agent.run(until=until, should_stop=should_stop)
        if agent.tracker.published == 0:
            summary = agent.finish(reason=Reason.NO_SLOTS,
                                   detail=f"no idle slot was ever published in {cfg.slots}")
        else:
            summary = agent.finish()
        if built.link is not None:
            built.link.close()
            summary["controller_link"] = {"syncs": built.link.syncs, "errors": built.link.errors,
                                          "received": built.link.received}
        ended = time.time()
    summary.update({
        "owner": cfg.owner, "device": built.device.name, "device_mode": cfg.device.mode,
        "epoch": agent.epoch, "started": started, "ended": ended, "notes": built.notes,
        "latency": built.latency.to_json(), "config": cfg.model_dump(mode="json"),
    })
    summary["requests_path"] = str(requests_path)
    summary_path.write_text(json.dumps(summary, indent=1, default=str))
    return summary
