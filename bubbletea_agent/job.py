"""The job file the scenario runner (testbed/run/bubbletea.py) hands each agent:
`python -m bubbletea_agent <job.json>`.

The file is an `AgentJob` (testbed_core/contracts/bubbletea.py, where every field is
described): the runner writes it with ``model_dump_json`` and this module reads it with
``model_validate_json``, so the agent gets the settings the scenario validated, not a
copy re-defaulted here. `config_from_job` turns it into the agent's own configuration
(config.py): the shared device with the workload's GPU figures, this agent's share of
the cluster's request stream, the decode server and the worker's live status.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bubbletea_agent.config import AgentConfig, AgentConfigError, config_from_scenario
from testbed_core.configfile import read_text
from testbed_core.contracts.bubbletea import AgentJob

log = logging.getLogger(__name__)


def load_job(path: str | Path) -> AgentJob:
    """The job at `path`; an unreadable, non-JSON or invalid one is an AgentConfigError
    naming the file and the fields at fault."""
    path = Path(path)
    text = read_text(path, "agent job", AgentConfigError)
    try:
        return AgentJob.model_validate_json(text)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            raise AgentConfigError(f"{path}: the agent job is not JSON ({errors[0]['msg']})") from None
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        raise AgentConfigError(f"{path}: invalid agent job: {problems}") from None


def config_from_job(job: AgentJob) -> AgentConfig:
    """The agent's configuration for this job: the worker's device charged with the
    workload's GPU figures (a relative gpu profile is relative to `base_dir`)."""
    dev: dict[str, Any] = job.device.model_dump(exclude_none=True)
    if job.gpu is not None:
        dev.update(gpu=job.gpu.type, efficiency=job.gpu.efficiency, peak_tflops=job.gpu.peak_tflops,
                   memory_bandwidth_gbs=job.gpu.memory_bandwidth_gbs)
        if job.gpu.profile:
            prof = Path(job.gpu.profile)
            dev["profile"] = job.base_dir / prof if job.base_dir is not None and not prof.is_absolute() else prof
    dev["tp"] = job.tp
    if job.agent_count == 1:
        log.warning("agent job names no agent_count: this agent takes the whole request rate "
                    "(bubbletea.requests.rate is for the cluster)")
    return config_from_scenario(
        job.bubbletea, device=dev, slots=job.slots_path, out_dir=job.out.parent,
        shard_index=job.agent_index, shard_count=job.agent_count, duration_s=job.duration_s,
        epoch=job.epoch, seed=job.seed, decode=job.decode,
        owner=f"bubbletea:{job.worker}", base_dir=job.base_dir, kv_wire_scale=job.wire_scale,
        live=job.live, arrivals_until_iteration=None if job.iterations is None else job.iterations - 1,
        nice=job.nice, realtime_holds=job.realtime_holds, controller=job.controller)


def run_job(path: str | Path) -> dict[str, Any]:
    """Run the agent of the job at `path` until training ends; returns its summary."""
    from bubbletea_agent.runtime import run

    job = load_job(path)
    cfg = config_from_job(job)
    return run(cfg, summary_path=job.out, requests_path=job.out.with_suffix(".requests.jsonl"))
