"""Real-device training in a worker (``real`` section of its job): its stages as torch
modules on its torch device (`RealWork`), the gradient average with the other DP
replicas of its stages, and the optimizer step after each iteration. What it saves at
the end is written by testbed/training/real_mode.py `save_params`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from testbed.training.worker.job import WorkerError
from testbed_core.contracts.worker_job import TrainJob

if TYPE_CHECKING:
    from atlas_transport.channel import Channel
    from testbed.training.real_work import RealWork


def real_work_of(job: TrainJob, dp_channels: dict[int, Channel]) -> RealWork:
    """The `RealWork` of a real-mode worker: its stages as torch modules on its torch
    device, DP gradients averaged over `dp_channels` (peer DP rank -> channel)."""
    from testbed.training.real_work import OptimConfig, PeerGradSync, RealWork, RealWorkError

    real = job.real
    assert real is not None
    try:
        sync = PeerGradSync(real.dp_rank, dp_channels, timeout_s=job.timeout_s) if dp_channels else None
        return RealWork(real.workload, real.stages, seed=real.seed, dp_rank=real.dp_rank, grad_sync=sync,
                        optim=OptimConfig(**real.optimizer.model_dump()), device=real.torch_device)
    except (RealWorkError, TypeError) as exc:
        raise WorkerError(f"{job.worker}: real-mode training cannot start: {exc}") from None


def end_real_iteration(work: RealWork, device: Any, owner: str, iteration: int) -> tuple[float | None, Any]:
    """Average the gradients over DP, then step the optimizer on the device (so its
    timeline shows it). Returns (this replica's mean loss or None, the step's record)."""
    if work.iteration != iteration:
        raise WorkerError(f"{owner}: the runner started iteration {iteration}, but the model has trained "
                          f"{work.iteration}: iterations must come in order from 0")
    steps: list[Any] = []
    loss = work.end_iteration(step=lambda fn: steps.append(device.run("optimizer", owner, fn=fn,
                                                                        label=f"step{iteration}")))
    return loss, steps[0]
