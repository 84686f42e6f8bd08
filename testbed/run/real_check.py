"""What a real-mode run (``workload.gpu.mode: real``) may do on this machine, and its
check, for the runner (testbed/run/runner.py); the worker side (the real jobs, the
saved parameters) is testbed/training/real_mode.py.

What may run where is checked before anything is built (`check_machine`, from the
scenario's validation; `resolve_device`, from the job building): without CUDA,
models above ``real.cpu_max_params`` are refused; with it, the estimated memory of
every replica's weights, gradients and optimizer state must fit.

The check is part of the product: `equivalence` trains the same model in ONE process
(testbed/training/reference.py), same seed, same data, same optimizer, same
iterations, and compares with what the workers saved. Two references: the
micro-batched one does pipeline training's arithmetic and must be equal bit for bit
(on CPU, same thread count); the global-batch one is the independent ground truth,
compared with the tolerance of `reference.tolerance_for`. Calibration and prediction
still run: the a-priori prediction comes from the compute model of ``gpu.type``; the
final one uses the stage times the warm-up iterations measured on this machine
(testbed/run/runner.py `play_variant`), and the summary says which.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.training.real_mode import RealModeError, load_worker_results, params_dir
from testbed_core.contracts.summary import RealCheck, RealCheckSkipped, RealReference

if TYPE_CHECKING:
    from testbed.training.reference import ReferenceResult
    from testbed_core.workload import Workload

__all__ = ["RealModeError", "check_machine", "describe", "equivalence", "references", "resolve_device",
           "summary_entry"]

CUDA_MEMORY_SHARE = 0.9  # of the free GPU memory a real run may plan to use


# ------------------------------------------------------------------ what may run here


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch: call only for real mode)."""
    import torch

    return bool(torch.cuda.is_available())


def cuda_free_bytes() -> int:
    """Free memory of the current CUDA device, in bytes."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free)


def model_params(workload: Workload) -> int:
    """Parameters of the real model (testbed/training/model.py: the LM head is always
    its own weight, so a tied-embedding model counts it too)."""
    from testbed_core.compute_model import param_count

    spec = workload.model_spec()
    head = workload.model.vocab * workload.model.hidden if workload.model.tied_embeddings else 0
    return param_count(spec) + head


def memory_estimate_bytes(workload: Workload) -> int:
    """GPU memory a real run needs, roughly: every DP replica's weights and gradients
    and optimizer state, plus one more copy for the one-process reference, plus 25%
    for activations and the CUDA allocator."""
    dtype_bytes = workload.model_spec().dtype_bytes
    opt = workload.real.optimizer
    states = 2 if opt.kind == "adam" else 1 if opt.momentum > 0 else 0
    per_param = dtype_bytes * (2 + states)
    return int(1.25 * (workload.parallelism.dp + 1) * model_params(workload) * per_param)


def resolve_device(workload: Workload, *, cuda: bool | None = None, free_bytes: Callable[[], int] | None = None) -> str:
    """The torch device the workers of a real-mode `workload` use here ("cuda" or
    "cpu"), or RealModeError saying why it cannot run here and what to do."""
    real = workload.real
    has_cuda = cuda_available() if cuda is None else cuda
    n = model_params(workload)
    if real.device == "cuda" and not has_cuda:
        raise RealModeError(
            "real.device is cuda, but torch sees no CUDA device on this machine; use real.device: auto "
            "(or cpu) to train on the CPU, or gpu.mode: modelled"
        )
    device = "cuda" if real.device == "cuda" or (real.device == "auto" and has_cuda) else "cpu"
    if device == "cpu" and n > real.cpu_max_params:
        raise RealModeError(
            f"gpu.mode real: model {workload.model.name} has {n:,} parameters, too many to train on the CPU "
            f"(real.cpu_max_params is {real.cpu_max_params:,}) and {'real.device is cpu' if has_cuda else 'no CUDA device is present'}; "
            "use gpu.mode: modelled (durations from the compute model), a smaller model (e.g. "
            "scenarios/workloads/tiny.yaml), a machine with CUDA, or raise real.cpu_max_params"
        )
    if device == "cuda":
        need = memory_estimate_bytes(workload)
        free = (free_bytes or cuda_free_bytes)()
        if need > CUDA_MEMORY_SHARE * free:
            raise RealModeError(
                f"gpu.mode real: model {workload.model.name} ({n:,} parameters) needs about {need / 1e9:.1f} GB of "
                f"GPU memory for {workload.parallelism.dp} replicas and the one-process reference, and "
                f"{free / 1e9:.1f} GB are free; use gpu.mode: modelled, a smaller model, or fewer replicas"
            )
    return device


def check_machine(workload: Workload) -> str | None:
    """For scenario validation: the torch device a real-mode workload will use (None
    for a modelled GPU); RealModeError when it cannot run on this machine."""
    if workload.gpu.mode != "real":
        return None
    return resolve_device(workload)


# ------------------------------------------------------------------ the check


@functools.lru_cache(maxsize=8)
def _references(workload_json: str, iterations: int, seed: int, device: str,
                threads: int) -> tuple[ReferenceResult, ReferenceResult]:
    from testbed.training.real_work import OptimConfig
    from testbed.training.reference import train_reference
    from testbed_core.workload import parse_workload

    wl = parse_workload(json.loads(workload_json), "real-mode reference")
    opt = wl.real.optimizer.model_dump()
    oc = OptimConfig(**{**opt, "betas": tuple(opt["betas"])})
    accumulate = train_reference(wl, iterations=iterations, seed=seed, optim=oc, device=device, mode="accumulate",
                                 threads=threads)
    global_batch = train_reference(wl, iterations=iterations, seed=seed, optim=oc, device=device, threads=threads)
    return accumulate, global_batch


def references(workload: Workload, iterations: int, device: str, threads: int) -> tuple[ReferenceResult, ReferenceResult]:
    """(micro-batched, global-batch) one-process references, cached per workload."""
    return _references(workload.model_dump_json(), iterations, workload.real.seed, device, threads)


def equivalence(variant_folder: Path, workload: Workload) -> RealCheck:
    """Compare the parameters the workers of a real-mode variant saved with the
    one-process references (see the module doc); the `real` block of the variant's
    summary entry."""
    from testbed.training.real_work import OptimConfig
    from testbed.training.reference import compare_params, tolerance_for

    par = workload.parallelism
    saved = load_worker_results(variant_folder)
    replicas: dict[int, dict[str, Any]] = {}
    losses: dict[int, list[float]] = {}
    for s in saved:
        replicas.setdefault(int(s["dp_rank"]), {}).update(s["params"])
        if s["losses"]:
            losses[int(s["dp_rank"])] = [float(x) for x in s["losses"]]
    missing = sorted(set(range(par.dp)) - set(replicas))
    if missing:
        raise RealModeError(f"{params_dir(variant_folder)}: no parameters of DP replica(s) {missing}")
    iterations = {int(s["iterations"]) for s in saved}
    devices = sorted({str(s["torch_device"]) for s in saved})
    threads = max(int(s["threads"]) for s in saved)
    if len(iterations) != 1:
        raise RealModeError(f"{params_dir(variant_folder)}: the workers trained different numbers of iterations "
                            f"({sorted(iterations)}); a worker stopped early")
    n = iterations.pop()
    device = "cuda" if devices[0].startswith("cuda") else "cpu"
    acc, glob = references(workload, n, device, threads)
    opt = workload.real.optimizer.model_dump()
    rtol, atol = tolerance_for(OptimConfig(**{**opt, "betas": tuple(opt["betas"])}))
    per_replica = {}
    identical, within = True, True
    max_acc = max_glob = 0.0
    for d in sorted(replicas):
        exact = compare_params(replicas[d], acc.params)
        close = compare_params(replicas[d], glob.params, rtol=rtol, atol=atol)
        identical = identical and exact.bitwise_equal
        within = within and close.ok
        max_acc, max_glob = max(max_acc, exact.max_abs), max(max_glob, close.max_abs)
        per_replica[str(d)] = {"micro_batched": exact.describe(), "global_batch": close.describe()}
    mean_losses = None
    if len(losses) == par.dp:
        mean_losses = [sum(ls[i] for ls in losses.values()) / par.dp for i in range(n)]
    reference = RealReference(
        what="the same model, seed, synthetic data and optimizer trained in one process "
             "(testbed/training/reference.py) for the same number of iterations",
        micro_batched={"description": "pipeline training's arithmetic in one process (loss / m per micro-batch, "
                                      "replicas averaged in rank order): equal bit for bit on CPU at the same "
                                      "thread count",
                       "max_abs_param_diff": max_acc, "identical": identical, "losses": acc.losses},
        global_batch={"description": "one batch, one mean: the independent ground truth, compared "
                                     "elementwise |a - b| <= atol + rtol |b|",
                      "max_abs_param_diff": max_glob, "rtol": rtol, "atol": atol,
                      "within_tolerance": within, "losses": glob.losses},
    )
    return RealCheck(
        device=devices[0] if len(devices) == 1 else devices,
        torch_threads=threads,
        seed=workload.real.seed,
        optimizer=opt,
        iterations_trained=n,
        note=(f"forward/backward/optimizer ran as real torch work on {', '.join(devices)} (device timelines "
              f"measured); predicted times come from the compute model of gpu.type {workload.gpu.type}"),
        identical=identical,
        max_abs_param_diff=max_acc,
        within_tolerance=within,
        equivalent=identical or within,
        reference=reference,
        losses=mean_losses,
        losses_identical=mean_losses == acc.losses if mean_losses is not None else None,
        replicas=per_replica,
        params_files=[s["file"] for s in saved],
    )


def describe(result: RealCheck | RealCheckSkipped) -> str:
    """One log line for a variant's `real` block."""
    if isinstance(result, RealCheckSkipped):
        return f"real training: no equivalence check: {result.error}"
    glob = (result.reference.model_extra or {})["global_batch"]
    verdict = ("bit-identical to" if result.identical else
               "within tolerance of" if result.within_tolerance else "DIFFERENT from")
    losses = result.losses or []
    trend = f"; loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else ""
    return (f"real training on {result.device}, {result.iterations_trained} iterations: parameters "
            f"{verdict} the one-process reference (max |diff| {result.max_abs_param_diff:.3g} vs micro-batched, "
            f"{glob['max_abs_param_diff']:.3g} vs global batch, atol {glob['atol']:g} rtol {glob['rtol']:g}){trend}")


def summary_entry(variant_folder: Path, workload: Workload, log: Callable[[str], None] | None = None,
                  name: str = "") -> RealCheck | RealCheckSkipped | None:
    """A real-mode variant's ``real`` block (None for modelled GPUs): the equivalence
    with the one-process reference, or why it could not be checked."""
    if workload.gpu.mode != "real":
        return None
    result: RealCheck | RealCheckSkipped
    if not workload.real.check:
        result = RealCheckSkipped(error="real.check is false: not compared with the one-process reference",
                                  note=f"predicted times come from the compute model of gpu.type {workload.gpu.type}")
    else:
        try:
            result = equivalence(variant_folder, workload)
        except RealModeError as exc:
            result = RealCheckSkipped(error=str(exc))
    if log is not None:
        log(f"  {name}: {describe(result)}")
    return result
