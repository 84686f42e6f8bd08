"""Real-device training (``workload.gpu.mode: real``), the workers' side: what a real
worker's job says, and the parameters it saves at the end.

With a modelled GPU a worker holds its device for the compute model's time and sends
placeholder tensors of the workload's wire size. With ``gpu.mode: real`` the same
workers, on the same hosts, train the workload's model for real: each holds its
stages as torch modules (`real_work.RealWork`, on CUDA when present, else on the
CPU), its boundary channels carry the real activations and gradients (through
`TransportComm`, so Atlas's temporal plan and tokens still apply), the workers of a
stage average their gradients over channels of their own (the job's ``dp`` part: one
per pair of DP replicas), and the device records its own timeline. At the end each worker
saves its parameters and per-iteration losses to ``<variant>/params/<worker>.pt``
(`save_params`), which the runner's check reads back (`load_worker_results`,
testbed/run/real_check.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed_core.contracts.worker_job import RealJob, TrainJob

if TYPE_CHECKING:
    from testbed.training.real_work import RealWork
    from testbed_core.workload import Workload

PARAMS_DIR = "params"  # <variant folder>/params/<worker>.pt


class RealModeError(ValueError):
    """A real-mode run that cannot be carried out here; the message says what to do."""


def params_dir(variant_folder: Path) -> Path:
    """Where the workers of a variant save their parameters."""
    return Path(variant_folder) / PARAMS_DIR


# ------------------------------------------------------------------ jobs


def real_jobs(
    *,
    workload: Workload,
    variant_folder: Path,
    torch_device: str,
    worker_id: Callable[[int, int], str],
) -> dict[str, RealJob]:
    """The ``real`` part of every worker's job (pure: no I/O): the stages it trains on
    `torch_device`; parameters go to ``<variant>/params/<worker>.pt``. Its DP gradient
    channels are the job's ``dp`` part (testbed/run/jobs.py `dp_sync_jobs`)."""
    par = workload.parallelism
    out = params_dir(variant_folder)
    real = workload.real
    return {
        worker_id(d, r): RealJob(
            workload=workload, stages=[c * par.pp + r for c in range(par.chunks)], dp_rank=d, seed=real.seed,
            optimizer=real.optimizer, torch_device=torch_device, threads=real.threads,
            out=str(out / f"{worker_id(d, r)}.pt"),
        )
        for d in range(par.dp) for r in range(par.pp)
    }


# ------------------------------------------------------------------ saved parameters


def save_params(job: TrainJob, work: RealWork) -> None:
    """A real worker's parameters (CPU copies, the whole model's names) and
    per-iteration losses (last stage only), with what the runner's reference needs to
    match them, to ``job.real.out`` (written whole, then renamed)."""
    import torch

    real = job.real
    assert real is not None
    out = Path(real.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save({
        "worker": job.worker, "pipeline": job.pipeline, "rank": job.rank, "dp_rank": real.dp_rank,
        "stages": list(work.stages), "iterations": work.iteration, "losses": list(work.losses),
        "params": work.state_dict(), "seed": real.seed, "optimizer": real.optimizer.model_dump(mode="json"),
        "torch_device": str(work.device), "threads": real.threads, "torch_version": torch.__version__,
    }, tmp)
    os.replace(tmp, out)


def load_worker_results(variant_folder: Path) -> list[dict[str, Any]]:
    """What each worker of a variant saved (`save_params`), by file name."""
    import torch

    folder = params_dir(variant_folder)
    files = sorted(folder.glob("*.pt"))
    if not files:
        raise RealModeError(f"{folder}: no saved parameters (did the workers run in real mode and finish?)")
    out = []
    for f in files:
        try:
            data = torch.load(f, map_location="cpu", weights_only=False)
        except Exception as exc:  # a truncated or foreign file: say which
            raise RealModeError(f"{f}: cannot read the saved parameters: {exc}") from None
        data["file"] = f"{Path(variant_folder).name}/{PARAMS_DIR}/{f.name}"
        out.append(data)
    return out
