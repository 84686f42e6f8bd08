"""Real torch work for pipeline workers: the `StageWork` that real devices run.

A worker (one pipeline rank of one DP replica) builds ``RealWork(workload, stages,
seed=..., dp_rank=..., grad_sync=...)`` for the (virtual) stages it holds and gives
it to `executor.run_worker`, once per iteration, then calls ``end_iteration()``:

* ``forward(stage, mb, x)``: the first stage makes micro-batch `mb`'s tokens itself
  (`SyntheticData`, from the seed: no data crosses the network); other stages take
  the received activations. The autograd graph is kept for the backward. The last
  stage computes the loss (cross-entropy / num_micro_batches, so gradients accumulate
  to those of the replica's mean loss) and returns it detached; others return their
  output activations, detached (what goes on the wire).
* ``backward(stage, mb, grad)``: backpropagates the received output gradient (the
  loss on the last stage) and returns the input gradient to send back (None on
  the first stage). Parameter gradients accumulate over the micro-batches.
* ``end_iteration()``: averages the gradients over the DP replicas of each stage
  (`GradSync`), takes one optimizer step (SGD or Adam, `OptimConfig`), zeroes the
  gradients, and returns the replica's mean loss (last stage) or None.

DP gradient averaging goes through a `GradSync` hook, not torch.distributed: gloo
process groups are per-process globals (no threads as ranks, one rendezvous per
group) while the testbed runs workers both as threads (`train_in_process`) and as
processes on emulated hosts. `LocalGradGroup` serves threads; `PeerGradSync` runs
over atlas_transport channels between the replicas of a stage (inside a DC, so on
the LAN). Each replica receives every other replica's flat gradient and sums them
in DP-rank order before dividing by dp, so every replica computes bit-identical
averages and stays bit-identical to the others. At dp <= 4 of a tiny model an
all-gather costs nothing worth a ring.

Determinism: fixed per-parameter init (model.py), data from (seed, iteration,
replica, micro-batch), fixed reduction order; `forward_seconds`/`backward_seconds`
are None because real devices time the work themselves.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
import torch.nn.functional as F

from testbed.training.model import GPTStage, build_stage
from testbed_core.workload import Workload

if TYPE_CHECKING:
    from testbed.training.executor import Comm
    from testbed_core.device_records import WorkRecord

DP_TAG_BASE = 1 << 40  # atlas_transport tags of DP gradient exchanges (stage is added)


class RealWorkError(RuntimeError):
    """Real pipeline work used wrongly (a backward before its forward, a missing
    gradient, an unknown stage); the message says which stage and micro-batch."""


# ------------------------------------------------------------------ optimizer


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer every stage and the reference use (deterministic on CPU:
    single-tensor implementations, no fused kernels)."""

    kind: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adam"):
            raise RealWorkError(f"optimizer kind {self.kind!r}: use 'sgd' or 'adam'")
        if not self.lr > 0:
            raise RealWorkError(f"optimizer lr={self.lr!r}: use a positive learning rate")
        if not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise RealWorkError("optimizer momentum must be in [0, 1) and weight_decay >= 0")

    def build(self, params: Any) -> torch.optim.Optimizer:
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay, foreach=False)
        return torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps,
                                weight_decay=self.weight_decay, foreach=False, fused=False)


# ------------------------------------------------------------------ data


def _mix(*parts: int) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class SyntheticData:
    """Token sequences from a seed, learnable so the loss falls: each token follows
    the previous one by t' = (a*t + c) mod vocab, except a `noise` fraction drawn at
    random. Micro-batch (iteration, replica, mb) is the same wherever it is made."""

    vocab: int
    seq_len: int
    micro_batch: int
    seed: int = 0
    noise: float = 0.1

    @classmethod
    def for_workload(cls, workload: Workload, seed: int = 0) -> SyntheticData:
        m = workload.model
        return cls(m.vocab, m.seq_len, workload.parallelism.micro_batch, seed)

    def tokens(self, iteration: int, replica: int, mb: int) -> torch.Tensor:
        """(micro_batch, seq_len + 1) int64: inputs are [:, :-1], targets [:, 1:]."""
        gen = torch.Generator().manual_seed(_mix(self.seed, iteration, replica, mb))
        rule = torch.Generator().manual_seed(_mix(self.seed, "rule"))
        a = int(torch.randint(1, max(2, self.vocab), (1,), generator=rule)) | 1
        c = int(torch.randint(0, self.vocab, (1,), generator=rule))
        n = self.micro_batch
        out = torch.empty(n, self.seq_len + 1, dtype=torch.int64)
        out[:, 0] = torch.randint(0, self.vocab, (n,), generator=gen)
        noisy = torch.rand(n, self.seq_len, generator=gen) < self.noise
        random = torch.randint(0, self.vocab, (n, self.seq_len), generator=gen)
        for i in range(self.seq_len):
            nxt = (out[:, i] * a + c) % self.vocab
            out[:, i + 1] = torch.where(noisy[:, i], random[:, i], nxt)
        return out

    def global_batch(self, iteration: int, replicas: int, micro_batches: int) -> torch.Tensor:
        """Every replica's micro-batches of one iteration, replica-major, stacked."""
        return torch.cat([self.tokens(iteration, d, mb) for d in range(replicas) for mb in range(micro_batches)])


# ------------------------------------------------------------------ DP gradient averaging


class GradSync(Protocol):
    """Averages one stage's flat gradient over the DP replicas of that stage. Every
    replica calls it once per iteration per stage, in the same stage order."""

    def allreduce_mean(self, stage: int, flat: torch.Tensor) -> torch.Tensor: ...


def ordered_mean(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """(parts[0] + parts[1] + ...) / n, summed in this order: the same bits everywhere."""
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total / len(parts)


class LocalGradGroup:
    """DP replicas that are threads of one process; `member(rank)` is each one's GradSync."""

    def __init__(self, dp: int, timeout_s: float = 60.0) -> None:
        if dp < 1:
            raise RealWorkError(f"a DP group needs dp >= 1 replicas, got {dp}")
        self.dp = dp
        self.timeout_s = timeout_s
        self._cv = threading.Condition()
        self._slots: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        self._taken: dict[tuple[int, int], int] = {}

    def member(self, rank: int) -> _LocalMember:
        if not 0 <= rank < self.dp:
            raise RealWorkError(f"DP rank {rank} is outside the group (0..{self.dp - 1})")
        return _LocalMember(self, rank)

    def _exchange(self, rank: int, key: tuple[int, int], flat: torch.Tensor) -> torch.Tensor:
        with self._cv:
            slots = self._slots.setdefault(key, {})
            slots[rank] = flat.detach().clone()
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: len(slots) == self.dp, timeout=self.timeout_s):
                missing = sorted(set(range(self.dp)) - set(slots))
                raise RealWorkError(
                    f"DP gradient average of stage {key[0]} (round {key[1]}): replicas {missing} did not "
                    f"arrive within {self.timeout_s:g} s"
                )
            result = ordered_mean([slots[r] for r in range(self.dp)])
            self._taken[key] = self._taken.get(key, 0) + 1
            if self._taken[key] == self.dp:
                del self._slots[key], self._taken[key]
            return result


@dataclass
class _LocalMember:
    group: LocalGradGroup
    rank: int
    rounds: dict[int, int] = field(default_factory=dict)

    def allreduce_mean(self, stage: int, flat: torch.Tensor) -> torch.Tensor:
        n = self.rounds.get(stage, 0)
        self.rounds[stage] = n + 1
        return self.group._exchange(self.rank, (stage, n), flat)


class Peer(Protocol):
    """What PeerGradSync needs of a link to another replica (an atlas_transport Channel)."""

    def isend(self, tensor: torch.Tensor, tag: int) -> Any: ...
    def recv(self, tag: int, *, timeout: float | None = None) -> torch.Tensor: ...


class PeerGradSync:
    """DP averaging over links to the other replicas of this worker's stages (one
    atlas_transport Channel per peer replica; tags DP_TAG_BASE + stage, so the
    channels may also carry other traffic on lower tags)."""

    def __init__(self, rank: int, peers: Mapping[int, Peer], *, tag_base: int = DP_TAG_BASE,
                 timeout_s: float = 60.0) -> None:
        if rank in peers:
            raise RealWorkError(f"DP rank {rank} is listed among its own peers")
        ranks = sorted([rank, *peers])
        if ranks != list(range(len(ranks))):
            raise RealWorkError(f"DP peers must be ranks 0..dp-1 besides this one ({rank}); got {sorted(peers)}")
        self.rank = rank
        self.peers = dict(peers)
        self.dp = len(ranks)
        self.tag_base = tag_base
        self.timeout_s = timeout_s

    def allreduce_mean(self, stage: int, flat: torch.Tensor) -> torch.Tensor:
        tag = self.tag_base + stage
        mine = flat.detach().contiguous()
        sends = [(r, p.isend(mine, tag)) for r, p in sorted(self.peers.items())]
        parts = {self.rank: mine}
        for r, p in sorted(self.peers.items()):
            got = p.recv(tag, timeout=self.timeout_s)
            if got.shape != mine.shape or got.dtype != mine.dtype:
                raise RealWorkError(
                    f"DP gradient of stage {stage} from replica {r} is {tuple(got.shape)} {got.dtype}, "
                    f"expected {tuple(mine.shape)} {mine.dtype}: do both replicas run the same workload?"
                )
            parts[r] = got.to(mine.device)
        for _, h in sends:
            h.wait(self.timeout_s)
        return ordered_mean([parts[r] for r in range(self.dp)])


# ------------------------------------------------------------------ the stage work


def grads_flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
        offset += n


class RealWork:
    """`StageWork` with real torch modules for the stages one worker holds."""

    def __init__(
        self,
        workload: Workload,
        stages: Sequence[int],
        *,
        seed: int = 0,
        dp_rank: int = 0,
        grad_sync: GradSync | None = None,
        optim: OptimConfig | None = None,
        device: torch.device | str | None = None,
        data: SyntheticData | None = None,
    ) -> None:
        par = workload.parallelism
        self.workload = workload
        self.num_stages = par.pp * par.chunks
        self.micro_batches = par.num_micro_batches
        self.dp = par.dp
        bad = [s for s in stages if not 0 <= s < self.num_stages]
        if not stages or bad or len(set(stages)) != len(stages):
            raise RealWorkError(
                f"stages {list(stages)}: give distinct stage ids in 0..{self.num_stages - 1} "
                f"(pp={par.pp} x chunks={par.chunks})"
            )
        if not 0 <= dp_rank < par.dp:
            raise RealWorkError(f"dp_rank {dp_rank} is outside 0..{par.dp - 1} (parallelism.dp={par.dp})")
        if par.dp > 1 and grad_sync is None:
            raise RealWorkError(
                f"parallelism.dp={par.dp}: pass grad_sync= (LocalGradGroup(dp).member(rank) for threads, "
                "PeerGradSync over channels for processes) so the replicas average their gradients"
            )
        self.stages = sorted(stages)
        self.seed = seed
        self.dp_rank = dp_rank
        self.grad_sync = grad_sync
        self.optim_config = optim or OptimConfig()
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.data = data or SyntheticData.for_workload(workload, seed)
        self.modules: dict[int, GPTStage] = {
            s: build_stage(workload.model, s, self.num_stages, seed, self.device) for s in self.stages
        }
        self._params = {s: list(m.parameters()) for s, m in self.modules.items()}
        self.optimizers = {s: self.optim_config.build(self._params[s]) for s in self.stages}
        self.iteration = 0
        self.losses: list[float] = []  # per iteration: this replica's mean loss (last stage only)
        self._saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._mb_loss: dict[int, float] = {}
        self._lock = threading.Lock()
        self.last = self.num_stages - 1

    # -- StageWork

    def forward_seconds(self, stage: int) -> float | None:
        return None

    def backward_seconds(self, stage: int) -> float | None:
        return None

    def _module(self, stage: int) -> GPTStage:
        try:
            return self.modules[stage]
        except KeyError:
            raise RealWorkError(f"this worker holds stages {self.stages}, not stage {stage}") from None

    def forward(self, stage: int, mb: int, x: Any) -> torch.Tensor:
        mod = self._module(stage)
        if not 0 <= mb < self.micro_batches:
            raise RealWorkError(f"micro-batch {mb} of stage {stage}: an iteration has {self.micro_batches}")
        tokens = None
        if stage == 0 or stage == self.last:
            tokens = self.data.tokens(self.iteration, self.dp_rank, mb).to(self.device)
        if stage == 0:
            inp = tokens[:, :-1]
        else:
            if not isinstance(x, torch.Tensor):
                raise RealWorkError(f"forward of micro-batch {mb} on stage {stage} got no activations "
                                    f"(got {type(x).__name__}) from stage {stage - 1}")
            inp = x.detach().to(self.device).requires_grad_(True)
        with torch.enable_grad():
            out = mod(inp)
            if stage == self.last:
                loss = F.cross_entropy(out.flatten(0, 1).float(), tokens[:, 1:].reshape(-1))
                out = loss / self.micro_batches
        with self._lock:
            if (stage, mb) in self._saved:
                raise RealWorkError(f"forward of micro-batch {mb} on stage {stage} ran twice in iteration "
                                    f"{self.iteration} without its backward")
            self._saved[(stage, mb)] = (inp if stage > 0 else None, out)
            if stage == self.last:
                self._mb_loss[mb] = float(loss.detach())
        return out.detach()

    def backward(self, stage: int, mb: int, grad: Any) -> torch.Tensor | None:
        self._module(stage)
        with self._lock:
            saved = self._saved.get((stage, mb))
        if saved is None:
            raise RealWorkError(f"backward of micro-batch {mb} on stage {stage} before its forward "
                                f"(iteration {self.iteration})")
        inp, out = saved
        if stage != self.last and (not isinstance(grad, torch.Tensor) or grad.shape != out.shape):
            what = tuple(grad.shape) if isinstance(grad, torch.Tensor) else type(grad).__name__
            raise RealWorkError(f"backward of micro-batch {mb} on stage {stage} needs the output "
                                f"gradient {tuple(out.shape)} from stage {stage + 1}, got {what}")
        with self._lock:
            del self._saved[(stage, mb)]
        with torch.enable_grad():
            if stage == self.last:
                out.backward()
            else:
                out.backward(grad.to(self.device, out.dtype))
        if inp is None:
            return None
        return inp.grad.detach()

    # -- end of an iteration

    def sync_gradients(self) -> None:
        """Average each stage's gradients over the DP replicas (no-op at dp=1)."""
        if self.grad_sync is None or self.dp == 1:
            return
        for s in self.stages:
            params = self._params[s]
            set_grads(params, self.grad_sync.allreduce_mean(s, grads_flat(params)))

    def optimizer_step(self) -> None:
        for s in self.stages:
            self.optimizers[s].step()
            self.optimizers[s].zero_grad(set_to_none=True)

    def end_iteration(self, step: Callable[[Callable[[], None]], Any] | None = None) -> float | None:
        """Average gradients over DP, step, and start the next iteration; returns the
        replica's mean loss of the iteration that ended (None without the last stage).

        `step` runs the optimizer step, e.g. on the device so its timeline shows it:
        ``work.end_iteration(step=lambda fn: device.run("optimizer", owner, fn=fn))``;
        the DP average before it is network time and stays off the device."""
        with self._lock:
            left = sorted(self._saved)
        if left:
            raise RealWorkError(f"iteration {self.iteration} ends with forwards whose backward never ran: "
                                f"(stage, micro-batch) {left}")
        loss = None
        if self.last in self.modules:
            if len(self._mb_loss) != self.micro_batches:
                raise RealWorkError(f"iteration {self.iteration}: the last stage saw {len(self._mb_loss)} "
                                    f"of {self.micro_batches} micro-batches")
            loss = sum(self._mb_loss[mb] for mb in range(self.micro_batches)) / self.micro_batches
            self.losses.append(loss)
            self._mb_loss.clear()
        self.sync_gradients()
        if step is None:
            self.optimizer_step()
        else:
            step(self.optimizer_step)
        self.iteration += 1
        return loss

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This worker's parameters under the whole model's names, as CPU copies."""
        out: dict[str, torch.Tensor] = {}
        for s in self.stages:
            for name, p in self.modules[s].named_parameters():
                out[name] = p.detach().to("cpu").clone()
        return out


# ------------------------------------------------------------------ in-process driver


@dataclass
class InProcessResult:
    """A threads-only pipeline training (`train_in_process`): per replica its
    parameters and losses, the device records, and how long it took."""

    params: list[dict[str, torch.Tensor]]  # per DP replica: the whole model's parameters
    losses: list[list[float]]  # per DP replica, per iteration
    records: dict[tuple[int, int], list[WorkRecord]]  # (pipeline, rank) -> device WorkRecords
    wall_s: float

    def mean_losses(self) -> list[float]:
        """Mean over replicas per iteration: the global batch's loss."""
        return [sum(r[i] for r in self.losses) / len(self.losses) for i in range(len(self.losses[0]))]


def train_in_process(
    workload: Workload,
    run_dir: str,
    *,
    iterations: int = 3,
    seed: int = 0,
    optim: OptimConfig | None = None,
    schedule: str | None = None,
    offsets: Sequence[float] | None = None,
    comm: Comm | None = None,
    device: torch.device | str | None = None,
) -> InProcessResult:
    """Pipeline training with every (replica, rank) worker a thread of this process,
    on real devices (`Device(mode='real')`), through `comm` (default LocalComm).
    `offsets` delays each pipeline's start (seconds); `device` is the torch device
    (default CPU; `testbed_runtime.device.torch_device()` picks CUDA when present)."""
    from testbed.training.executor import LocalComm, run_threads, run_worker
    from testbed_core.schedules import build_schedule
    from testbed_runtime.device import Device

    par = workload.parallelism
    sched = build_schedule(schedule or par.schedule, par.pp, par.num_micro_batches, par.chunks)
    comm = comm or LocalComm()
    group = LocalGradGroup(par.dp)
    works = {
        (d, r): RealWork(workload, [c * par.pp + r for c in range(par.chunks)], seed=seed, dp_rank=d,
                         grad_sync=group.member(d), optim=optim, device=device)
        for d in range(par.dp) for r in range(par.pp)
    }
    devices = {(d, r): Device(f"p{d}r{r}", run_dir, mode="real") for d, r in works}
    records: dict[tuple[int, int], list[WorkRecord]] = {k: [] for k in works}
    t0 = time.time() + 0.05

    def body(d: int, r: int) -> None:
        for it in range(iterations):
            start = t0 + (offsets[d] if offsets else 0.0) if it == 0 else None
            dev = devices[(d, r)]
            records[(d, r)] += run_worker(sched, r, d, dev, comm, works[(d, r)], start_at=start)
            works[(d, r)].end_iteration(step=lambda fn, dev=dev: dev.run("optimizer", f"train:p{d}r{r}", fn=fn))

    run_threads(list(works), body, name="real-")
    params, losses = [], []
    for d in range(par.dp):
        merged: dict[str, torch.Tensor] = {}
        for r in range(par.pp):
            merged.update(works[(d, r)].state_dict())
        params.append(merged)
        losses.append(works[(d, (par.pp * par.chunks - 1) % par.pp)].losses)
    return InProcessResult(params, losses, records, time.time() - t0)
