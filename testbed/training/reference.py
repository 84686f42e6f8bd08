"""The ground truth: the same model trained in ONE process on the same data.

No pipeline, no threads, no network: the whole model (`model.build_model`, same seed,
same per-parameter init) trains on the same synthetic batches (`SyntheticData`, every
DP replica's micro-batches of an iteration) with the same optimizer.

Two references, two tolerances (fp32, CPU):

* mode "accumulate" does pipeline training's arithmetic in one process (loss / m
  per micro-batch, accumulated; replicas averaged in rank order). Pipeline training,
  over threads or TCP, with any schedule, stream count or send order, must equal it
  BIT FOR BIT (on CPU, at the same torch intra-op thread count: kernels split their
  reductions by thread, so 1 and 2 threads differ in the last bit): that is the
  proof that Atlas's reordering changes nothing.
* mode "global" is the independent ground truth (one batch, one mean). Compared with
  torch.allclose semantics, |a - b| <= atol + rtol * |b| elementwise: with SGD only
  the order of the summations differs, so a tight RTOL and ATOL hold. Adam divides
  each gradient by its own running magnitude, which turns the rounding of near-zero
  gradients into visible update differences, so for Adam atol is a fraction of one
  step's size (of lr). A misrouted micro-batch is off by orders of magnitude more
  (the tests check that it is caught).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from testbed.training.model import build_model
from testbed.training.real_work import (
    OptimConfig,
    SyntheticData,
    grads_flat,
    ordered_mean,
    set_grads,
)
from testbed_core.workload import Workload

RTOL = 1e-5
ATOL = 1e-6
ADAM_ATOL_OF_LR = 0.05  # Adam vs the global batch: 5% of one step's size (see module doc)


def tolerance_for(optim: OptimConfig) -> tuple[float, float]:
    """(rtol, atol) for comparing with the global-batch reference after training with `optim`."""
    if optim.kind == "adam":
        return RTOL, max(ATOL, ADAM_ATOL_OF_LR * optim.lr)
    return RTOL, ATOL


@dataclass
class ReferenceResult:
    """What a reference training produced: its final parameters and its losses."""

    params: dict[str, torch.Tensor]  # the whole model, CPU copies
    losses: list[float]  # per iteration, before its step


def train_reference(
    workload: Workload,
    *,
    iterations: int = 3,
    seed: int = 0,
    optim: OptimConfig | None = None,
    device: torch.device | str | None = None,
    mode: Literal["global", "accumulate"] = "global",
    threads: int | None = None,
) -> ReferenceResult:
    """Train the whole model in this process for `iterations` steps.

    mode "global": one forward/backward over the global batch (the independent
    ground truth). mode "accumulate": the same arithmetic as pipeline training, in
    one process: per micro-batch loss / m accumulated per replica, replicas averaged
    in rank order (`ordered_mean`); pipeline training must match it bit for bit.
    `threads`: torch intra-op threads for the run (the workers' count: CPU kernels
    split reductions by thread, so bitwise equality needs the same count).
    """
    if mode not in ("global", "accumulate"):
        raise ValueError(f"reference mode {mode!r}: use 'global' or 'accumulate'")
    if threads is None:
        return _train(workload, iterations, seed, optim, device, mode)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(workload, iterations, seed, optim, device, mode)
    finally:
        torch.set_num_threads(before)


def _train(workload: Workload, iterations: int, seed: int, optim: OptimConfig | None,
           device: torch.device | str | None, mode: str) -> ReferenceResult:
    par = workload.parallelism
    m = par.num_micro_batches
    model = build_model(workload.model, seed, device)
    dev = model.head.weight.device
    params = list(model.parameters())
    opt = (optim or OptimConfig()).build(params)
    data = SyntheticData.for_workload(workload, seed)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(dev)
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].reshape(-1))

    losses = []
    for it in range(iterations):
        if mode == "global":
            loss = loss_of(data.global_batch(it, par.dp, m))
            loss.backward()
            losses.append(float(loss.detach()))
        else:
            per_replica, replica_losses = [], []
            for d in range(par.dp):
                mb_losses = []
                for mb in range(m):
                    loss = loss_of(data.tokens(it, d, mb))
                    (loss / m).backward()
                    mb_losses.append(float(loss.detach()))
                replica_losses.append(sum(mb_losses) / m)
                per_replica.append(grads_flat(params))
                opt.zero_grad(set_to_none=True)
            if par.dp > 1:
                set_grads(params, ordered_mean(per_replica))
            else:
                set_grads(params, per_replica[0])
            losses.append(sum(replica_losses) / par.dp)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return ReferenceResult({n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}, losses)


@dataclass(frozen=True)
class ParamDiff:
    """How a candidate's parameters differ from a reference's (`compare_params`)."""

    ok: bool
    max_abs: float
    max_rel: float
    worst: str  # parameter with the largest absolute difference
    bitwise_equal: bool
    missing: tuple[str, ...]  # in the reference, not in the candidate
    extra: tuple[str, ...]  # in the candidate, not in the reference

    def describe(self) -> str:
        if self.missing or self.extra:
            return f"parameter names differ: missing {list(self.missing)}, unexpected {list(self.extra)}"
        return (f"max |diff| {self.max_abs:.3g} (in {self.worst}), max relative {self.max_rel:.3g}, "
                f"bitwise equal: {self.bitwise_equal}")


def compare_params(
    candidate: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> ParamDiff:
    """How far `candidate` is from `reference`, name by name (allclose semantics)."""
    missing = tuple(sorted(set(reference) - set(candidate)))
    extra = tuple(sorted(set(candidate) - set(reference)))
    max_abs = max_rel = 0.0
    worst = ""
    ok = not missing and not extra
    bitwise = ok
    for name in sorted(set(reference) & set(candidate)):
        a, b = candidate[name].detach().cpu(), reference[name].detach().cpu()
        if a.shape != b.shape:
            return ParamDiff(False, float("inf"), float("inf"), name, False, missing, extra)
        diff = (a.double() - b.double()).abs()
        d = float(diff.max()) if diff.numel() else 0.0
        rel = float((diff / b.double().abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
        if d > max_abs or not worst:
            max_abs, worst = d, name
        max_rel = max(max_rel, rel)
        ok = ok and torch.allclose(a, b, rtol=rtol, atol=atol)
        bitwise = bitwise and torch.equal(a, b)
    return ParamDiff(ok, max_abs, max_rel, worst, bitwise, missing, extra)
