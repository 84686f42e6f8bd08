"""The job file the scenario runner (testbed/run/bubbletea.py) hands each agent:
`python -m bubbletea_agent <job.json>`.

Fields (JSON object; unknown fields are ignored, as the runner may add its own):

    device        {name, run_dir, mode, time_scale}: the worker's device, shared
    slots_path    the slot feed the worker writes (bubbletea_agent/slots.py)
    worker, host  who this agent sits next to (names its owner on the timeline)
    bubbletea     the scenario's `bubbletea:` section (testbed/run/scenario.py)
    seed          the scenario seed (the request stream is drawn from it)
    out           where the agent's summary JSON goes; `<out stem>.requests.jsonl`
                  beside it gets one line per request
    agent_index, agent_count   this agent's share of the cluster-wide request rate
                  (default 0 of 1: then this agent alone takes the whole rate)
    duration_s    how long requests keep coming (default 600 s; the agent stops when
                  training ends anyway, and counts the rest as not arrived)
    epoch         time.time() of request time zero (default: the first slot announced)
    gpu           the workload's `gpu:` section {type, efficiency, peak_tflops,
                  memory_bandwidth_gbs, profile}: what a modelled prefill costs
                  (default H100 at efficiency 0.5)
    tp            tensor-parallel degree of the device (default 1)
    decode        {host, port, streams, secret}: the decode server (an address
                  reachable from this host); none: TTFT ends with the prefill
    base_dir      folder that relative paths (trace, gpu profile) are relative to
    wire_scale    wire size / true size of a KV cache: modelled KV caches cross the
                  emulated network at that fraction of their true size (default 1; the
                  runner passes the scenario's bubbletea.kv_wire_scale)
    live          {status, wake, gate}: the worker's live status (bubbletea_agent/live.py)
    iterations    training iterations of the run: requests stop arriving half a second
                  before the last one's planned end (so that each can still be served)
    ready         file the agent creates once it is built (the runner waits for it)
    nice          CPU priority of the agent process (negative: wakes first; needs root)
    realtime_holds  run each device hold at SCHED_FIFO 1 (needs root; default false)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bubbletea_agent.config import AgentConfig, AgentConfigError, config_from_scenario

log = logging.getLogger(__name__)


class RunnerJob(BaseModel):
    model_config = ConfigDict(extra="ignore")

    device: dict[str, Any]
    slots_path: str
    worker: str
    host: str = ""
    bubbletea: dict[str, Any] = Field(default_factory=dict)
    seed: int = 1
    out: str
    agent_index: int = Field(default=0, ge=0)
    agent_count: int = Field(default=1, ge=1)
    duration_s: float = Field(default=600.0, gt=0)
    epoch: float | None = None
    gpu: dict[str, Any] | None = None
    tp: int = Field(default=1, ge=1)
    decode: dict[str, Any] | None = None
    base_dir: str | None = None
    wire_scale: float = Field(default=1.0, gt=0, le=1)
    live: dict[str, Any] | None = None
    iterations: int | None = Field(default=None, ge=1)
    ready: str | None = None
    nice: int | None = Field(default=None, ge=-20, le=19)
    realtime_holds: bool = False


def load_job(path: str | Path) -> RunnerJob:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise AgentConfigError(f"{path}: cannot read the agent job ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise AgentConfigError(f"{path}: the agent job is not JSON ({exc.msg}, line {exc.lineno})") from None
    try:
        job = RunnerJob.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise AgentConfigError(f"{path}: invalid agent job: {problems}") from None
    unknown = sorted(set(data) - set(RunnerJob.model_fields))
    if unknown:
        log.info("%s: ignoring job fields %s", path, unknown)
    return job


def config_from_job(job: RunnerJob) -> AgentConfig:
    dev = {k: v for k, v in job.device.items() if k in ("name", "run_dir", "mode", "time_scale", "torch_device")}
    gpu = job.gpu or {}
    if gpu:
        dev["gpu"] = gpu.get("type", "H100")
        for key in ("efficiency", "peak_tflops", "memory_bandwidth_gbs"):
            if gpu.get(key) is not None:
                dev[key] = gpu[key]
        if gpu.get("profile"):
            prof = Path(gpu["profile"])
            dev["profile"] = str(Path(job.base_dir) / prof if job.base_dir and not prof.is_absolute() else prof)
    dev["tp"] = job.tp
    if job.agent_count == 1:
        log.warning("agent job names no agent_count: this agent takes the whole request rate "
                    "(bubbletea.requests.rate is for the cluster)")
    section = dict(job.bubbletea)
    if not section.get("model"):
        # a realistic size where the device is modelled; what a CPU can run where it is real
        section["model"] = {"preset": "llama-3-8b" if dev.get("mode", "modelled") == "modelled" else "tiny"}
    out = Path(job.out)
    return config_from_scenario(
        section, device=dev, slots=job.slots_path, out_dir=out.parent,
        shard_index=job.agent_index, shard_count=job.agent_count, duration_s=job.duration_s,
        epoch=job.epoch, seed=job.seed, decode=job.decode,
        owner=f"bubbletea:{job.worker}", base_dir=job.base_dir, kv_wire_scale=job.wire_scale,
        live=job.live, arrivals_until_iteration=None if job.iterations is None else job.iterations - 1,
        nice=job.nice, realtime_holds=job.realtime_holds)


def run_job(path: str | Path) -> dict[str, Any]:
    from bubbletea_agent.runtime import run

    job = load_job(path)
    cfg = config_from_job(job)
    out = Path(job.out)
    return run(cfg, summary_path=out, requests_path=out.with_suffix(".requests.jsonl"), ready_path=job.ready)
