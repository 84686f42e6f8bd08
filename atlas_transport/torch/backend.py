"""`ProcessGroupAtlas`: a torch.distributed process group whose traffic goes over
atlas channels (see the package docstring for use).

It is a Python `ProcessGroup` (torch's C++ trampoline calls its methods, also from
C++ callers such as functional collectives and DDP), so it also answers what torch
otherwise asks of the C++ backends a `ProcessGroup` holds: its name and description,
the device types it serves (cpu and cuda), `_get_backend(device)` (itself),
`split_group`, coalescing, the group store.

Point-to-point operations are posted on the pair's channel at once (or queued until
it opens) with the caller's tag; their work waits on the transfer itself.
Collectives run one at a time, in call order, on the group's own thread, all on one
reserved tag: every rank runs the same collectives in the same order, so each
pair's messages match by their order on that tag."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from . import collectives as C
from . import intrasite as I
from .anysource import AnySource
from .mesh import COLL_TAG, MAX_P2P_TAG, PeerMesh, PeerOp
from .options import AtlasOptions, resolve
from .posting import Posting
from .staging import Staged
from .work import AtlasError, AtlasWork, seconds

log = logging.getLogger("atlas_transport.torch")

BACKEND_NAME = "atlas"
DEVICE_TYPES = ("cpu", "cuda")
MONITORED_BARRIER_TAG = MAX_P2P_TAG  # the last point-to-point tag: monitored_barrier's messages


class P2PWork(AtlasWork):
    """A send or receive: wait() waits on the transfer itself (no extra thread)."""

    def __init__(self, mesh: PeerMesh, op: PeerOp | None, result: list[torch.Tensor], what: str = "") -> None:
        super().__init__(op.what if op is not None else what, result)
        self._mesh, self._op = mesh, op
        self._src = op.peer if op is not None else -1

    def _drive(self) -> None:
        if self._event.is_set():
            return
        try:
            self._mesh.wait(self._op)
        except AtlasError as exc:
            self._fail(exc)
        else:
            self._finish()

    def is_completed(self) -> bool:
        if not self._event.is_set() and self._op.done():
            self._drive()
        return self._event.is_set()

    def _start_watch(self) -> None:
        threading.Thread(target=self._drive, daemon=True, name="atlas-p2p-future").start()

    def _source_rank(self) -> int:
        return self._src

    def source_rank(self) -> int:
        return self._src


class GroupStore:
    """The group's store with every read bounded by the group's timeout rather than the
    store's own (the default group's, often minutes): a rank that never reaches this
    group's first operation, and so never publishes its address or site, fails the
    operation within the group's timeout. Everything else goes to the store itself."""

    def __init__(self, store, timeout: timedelta, group: str, rank: int) -> None:
        self._store, self._timeout, self._group, self._rank = store, timeout, group, rank

    def get(self, key: str) -> bytes:
        try:
            self._store.wait([key], self._timeout)
        except Exception as exc:  # noqa: BLE001 - DistStoreError (timeout) or a store that went away
            raise AtlasError(
                f"atlas: group {self._group!r} on rank {self._rank}: key {key!r} did not appear in the store "
                f"within the group's timeout of {self._timeout.total_seconds():g} s: the rank that publishes it "
                f"has not reached this group's first operation (is it running, and does it call the same "
                f"operations on this group?) ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
        return self._store.get(key)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


class AnySourceWork(AtlasWork):
    """A receive from any source: completed by its own thread; `_source_rank()` is the
    sender's group rank once matched (-1 before)."""

    def __init__(self, what: str, result: list[torch.Tensor]) -> None:
        super().__init__(what, result)
        self._src = -1

    def _source_rank(self) -> int:
        return self._src

    def source_rank(self) -> int:
        return self._src


class CoalescedWork(AtlasWork):
    """The works issued between `_start_coalescing` and `_end_coalescing` (collectives,
    sends and receives), as one."""

    def __init__(self, what: str, works: list[AtlasWork]) -> None:
        super().__init__(what, [t for w in works for t in w.result()])
        self._works = works
        if not works:
            self._finish()
        else:
            threading.Thread(target=self._drive_all, daemon=True, name="atlas-coalesced").start()

    def _drive_all(self) -> None:
        for w in self._works:
            w._drive()
        err = next((w._error for w in self._works if w._error is not None), None)
        self._complete(err)


def _is_premul(op: object) -> bool:
    """Is `op` PREMUL_SUM (`dist._make_nccl_premul_sum(f)`, FSDP2's `ReduceOp.PREMUL_SUM(1 / f)`)?"""
    try:
        return getattr(op, "op", op) == dist.ReduceOp.RedOpType.PREMUL_SUM
    except TypeError:
        return False


_REDUCIBLE: dict[tuple[str, torch.dtype], str | None] = {}


def _check_reducible(what: str, name: str, dtype: torch.dtype) -> None:
    """ValueError naming the op and the dtype when torch has no CPU kernel to reduce it
    with (float8, uint16, ...): the reduction runs on host memory, for CUDA tensors too."""
    key = (name, dtype)
    if key not in _REDUCIBLE:
        try:
            C.combine(torch.zeros(1, dtype=dtype), torch.zeros(1, dtype=dtype), name)
            _REDUCIBLE[key] = None
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            _REDUCIBLE[key] = str(exc).splitlines()[0]
    why = _REDUCIBLE[key]
    if why is not None:
        raise ValueError(f"atlas: {what}: reduce op {name} is not supported for {dtype} (torch has no CPU kernel "
                         f"for it: {why}); reduce in a wider dtype such as torch.float32 and cast back")


def all_to_all(outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], rank: int, size: int,
               xfer: C.Xfer) -> None:
    """outs[p] = rank p's ins[rank] (each pair's parts may differ in size, also be empty)."""
    impl = getattr(C, "all_to_all", None)  # the algorithms module's, once it has one
    if impl is not None:
        impl(outs, ins, rank, size, xfer)
        return
    outs[rank].copy_(ins[rank])
    peers = [p for p in range(size) if p != rank]
    xfer([(p, ins[p]) for p in peers], [(p, outs[p]) for p in peers])


class ProcessGroupAtlas(dist.ProcessGroup):
    """One process group over atlas channels (created by `init_process_group` /
    `new_group` with backend="atlas")."""

    # What torch asks of the backend `_get_backend(device)` returns (this group itself).
    supports_splitting = True
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str = "0",
                 global_ranks: Sequence[int] = (), options: AtlasOptions | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._store = store
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._label = str(group_name)
        self._group_name = str(group_name)
        self._group_desc = "undefined"
        self._global_ranks = list(global_ranks)
        self.options = resolve(options)
        self._mesh = PeerMesh(rank, size, GroupStore(store, timeout, self._label, rank), self.options,
                              self._timeout_s, self._label, list(global_ranks))
        self._anysource = AnySource(self._mesh)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._coalescing: list[AtlasWork] | None = None
        self._pending = 0  # collectives queued for the collectives thread and not yet run
        self._broken: AtlasError | None = None
        self._scratch_bufs: dict[torch.dtype, torch.Tensor] = {}  # used by the collectives thread only
        self._posting = Posting(self._mesh, store, self.options.intra_site)  # topology and detached sends, used by the collectives thread only
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"atlas-pg{self._label}-collectives")
        self._thread.start()

    # --- identity, as torch asks it of a process group and of its backends -----------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    # The group's name: torch sets it after creating the group (`_set_group_name`) and
    # reads it from Python (`group_name`: DeviceMesh, functional collectives) and C++
    # (`getGroupName`, through the trampoline). C++'s own version would read it from a
    # registered C++ backend, which a Python group has none of ("ProcessGroup name not set").
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = str(name)

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = str(desc)

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _set_group_name(self, name: str) -> None:
        self.setGroupName(name)

    def _set_group_desc(self, desc: str) -> None:
        self.setGroupDesc(desc)

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device(d) for d in DEVICE_TYPES]

    def _get_backend(self, device: object) -> ProcessGroupAtlas:
        """This group serves cpu and cuda tensors itself (RuntimeError for other devices,
        as torch's own lookup raises)."""
        kind = device.type if isinstance(device, torch.device) else torch.device(str(device)).type
        if kind not in DEVICE_TYPES:
            raise RuntimeError(f"atlas: process group {self._group_name!r} has no backend for device type "
                               f"{kind!r}: backend 'atlas' serves {' and '.join(DEVICE_TYPES)} tensors")
        return self

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        """Sequence numbers count this group's collectives from 0 on every rank already."""

    def eager_connect_single_device(self, device: object) -> None:
        """`init_process_group(device_id=...)`: torch binds the device to the group it
        replaces with this one, so bind it here (channels open on first use)."""
        if device is not None:
            self.bound_device_id = device if isinstance(device, torch.device) else torch.device(device)

    def perform_nocolor_split(self, device: object) -> None:
        """A rank outside a new group takes no part in creating it."""

    def supports_tensor_alloc(self, device: object) -> bool:
        return False

    def get_group_store(self):
        return self._store

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._mesh.timeout_s = self._timeout_s
        if isinstance(self._mesh.store, GroupStore):
            self._mesh.store._timeout = timeout

    def split_group(self, ranks: Sequence[int], timeout: timedelta | None = None, opts: object = None,
                    group_name: str | None = None, group_desc: str | None = None,
                    device_types: object = None) -> ProcessGroupAtlas | None:
        """A new atlas group of `ranks` (group ranks of this group), or None on a rank
        outside it; `torch.distributed.split_group` calls this on every rank."""
        ranks = sorted(int(r) for r in ranks)
        if self._rank not in ranks:
            return None
        name = group_name or f"{self._group_name}:split:{','.join(map(str, ranks))}"
        glob = self._global_ranks or list(range(self._size))
        pg = ProcessGroupAtlas(dist.PrefixStore(f"{name}/", self._store), ranks.index(self._rank), len(ranks),
                               timeout or self._timeout, name, [glob[r] for r in ranks],
                               opts if isinstance(opts, AtlasOptions) else self.options)
        pg.setGroupDesc(group_desc or f"{self._group_desc}:split")
        return pg

    def __repr__(self) -> str:
        return f"ProcessGroupAtlas(group={self._label!r}, rank={self._rank}, size={self._size})"

    @property
    def streams_used(self) -> dict[int, int]:
        """Streams of each open channel, by peer group rank."""
        return dict(self._mesh.streams_used)

    def shutdown(self) -> None:
        self._queue.put(None)
        self._mesh.close()
        self._posting.close()

    def abort(self) -> None:
        self.shutdown()

    # --- point to point -------------------------------------------------------------

    def _check_p2p(self, kind: str, tensors: list[torch.Tensor], tag: int) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"atlas: {kind} takes exactly one tensor, got {len(tensors)}")
        if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag <= MAX_P2P_TAG:
            raise ValueError(f"atlas: {kind} tag {tag!r} is out of range: use 0..{MAX_P2P_TAG}")
        return tensors[0]

    def _p2p(self, kind: str, tensors: list[torch.Tensor], peer: int, tag: int) -> P2PWork:
        t = self._check_p2p(kind, tensors, tag)
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"atlas: {kind} peer {peer} is not another rank of this group (size {self._size}, "
                             f"this rank {self._rank})")
        what = f"{kind} of {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        op = PeerOp(kind, peer, t, tag, time.monotonic() + self._timeout_s, what)
        self._mesh.post(op)
        return self._coalesce(P2PWork(self._mesh, op, tensors))

    def _coalesce(self, work: AtlasWork) -> AtlasWork:
        """Count `work` in the open coalescing block, if any (its end waits for it)."""
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> P2PWork:
        return self._p2p("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> P2PWork:
        return self._p2p("recv", tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> AnySourceWork:
        """Receive the next message on `tag` from whichever rank sends first; the work's
        `_source_rank()` names it (what `dist.recv(t)` without src returns)."""
        t = self._check_p2p("recv", tensors, tag)
        if self._size < 2:
            raise ValueError("atlas: recv from any source in a group of one rank: there is no other rank")
        what = f"recv of {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        work = AnySourceWork(f"{what} from any source", tensors)
        deadline = time.monotonic() + self._timeout_s

        def run() -> None:
            try:
                op = self._anysource.match(
                    tag, deadline, what, lambda peer: PeerOp("recv", peer, t, tag, deadline, what))
                self._mesh.wait(op)
                work._src = op.peer
            except AtlasError as exc:
                work._fail(exc)
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the work
                work._fail(AtlasError(f"atlas: {what} from any source failed: {type(exc).__name__}: {exc}"))
            else:
                work._finish()

        threading.Thread(target=run, daemon=True, name=f"atlas-pg{self._label}-anysource").start()
        return self._coalesce(work)

    # --- collectives --------------------------------------------------------------

    def _collective(self, name: str, result: list[torch.Tensor],
                    body: Callable[[C.Xfer], None]) -> AtlasWork:
        with self._seq_lock:
            seq = self._seq
            self._seq += 1
            self._pending += 1
        work = self._coalesce(AtlasWork(f"{name} #{seq} of group {self._label!r} on rank {self._rank}", result))
        self._queue.put((work, body))
        return work

    def _direct(self, site: I.SiteGroup, name: str, result: list[torch.Tensor], gloo_work,
                after: Callable[[], None] | None = None) -> AtlasWork:
        """The work of a collective handed to the site's gloo group from this thread:
        `gloo_work`, one gloo work or the list issued for a call over several tensors;
        `after`, what completes the result once gloo is done (AVG's division)."""
        what = f"{name} #{self._seq - 1} of group {self._label!r} on rank {self._rank}"
        return I.GlooWork(what, result, site, gloo_work, after)

    def _direct_site(self, tensors: Sequence[torch.Tensor]) -> I.SiteGroup | None:
        """The site's gloo group when this collective goes to it straight from the
        caller's thread (gloo's own work returned, no hand-off to the collectives
        thread): the group is one site on gloo, nothing is queued before it (so gloo
        sees the collectives in call order), no coalescing block is open, and every
        tensor is a plain contiguous CPU tensor of a dtype gloo takes. Counts the
        collective's sequence number when it answers a group."""
        site = self._posting.site
        if (site is None or not site.whole or self._pending or self._coalescing is not None
                or self._broken is not None):
            return None
        for t in tensors:
            if (t.device.type != "cpu" or t.layout != torch.strided or not t.is_contiguous() or t.is_conj()
                    or t.is_neg() or t.dtype not in I.GLOO_DTYPES):
                return None
        with self._seq_lock:
            if self._pending:
                return None
            self._seq += 1
        return site

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, body = item
            err = self._run_one(work, body)
            with self._seq_lock:  # before completing: the caller's next collective may go to gloo directly
                self._pending -= 1
            work._complete(err)

    def _run_one(self, work: AtlasWork, body: Callable[[C.Xfer], None]) -> BaseException | None:
        """Run one queued collective; its error, or None."""
        if self._broken is not None:
            return AtlasError(f"atlas: {work.what}: the group failed earlier: {self._broken}")
        deadline = time.monotonic() + self._timeout_s
        try:
            body(self._posting.net(work.what, deadline))  # an xfer(sends, recvs) and a post/wait Net
        except AtlasError as exc:
            if work.what not in str(exc):  # e.g. from the store, before any transfer: name the operation
                exc = AtlasError(f"atlas: {work.what}: {str(exc).removeprefix('atlas: ')}")
            self._broken = exc
            return exc
        except Exception as exc:  # noqa: BLE001 - a bad argument: this collective fails, the group lives
            return exc
        return None

    def _xfer(self, sends, recvs, what: str, deadline: float) -> None:
        ops = [PeerOp("recv", p, t, COLL_TAG, deadline, what) for p, t in recvs]
        ops += [PeerOp("send", p, t, COLL_TAG, deadline, what) for p, t in sends]
        for op in ops:
            self._mesh.post(op)
        for op in ops:
            self._mesh.wait(op)

    def _scratch(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        buf = self._scratch_bufs.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = self._scratch_bufs[dtype] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    def _start_coalescing(self, device: object = None) -> None:
        """Collectives until `_end_coalescing` still run at once, in order; the end
        returns one work for all of them."""
        if self._coalescing is not None:
            raise ValueError(f"atlas: group {self._group_name!r} is already coalescing (a _coalescing_manager "
                             "inside another on the same group)")
        self._coalescing = []

    def _end_coalescing(self, device: object = None) -> CoalescedWork:
        works, self._coalescing = self._coalescing, None
        if works is None:
            raise ValueError(f"atlas: _end_coalescing on group {self._group_name!r} without _start_coalescing")
        return CoalescedWork(f"{len(works)} coalesced collectives of group {self._label!r}", works)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    def _check_per_rank(self, op: str, role: str, tensors: Sequence[torch.Tensor], other: str,
                        like: torch.Tensor) -> None:
        """ValueError unless `tensors` holds one tensor per rank of the group, each with
        as many elements and the same dtype as `like` (the `other` side of `op`)."""
        if len(tensors) != self._size:
            raise ValueError(f"atlas: {op} needs {self._size} {role} tensors (the group size), got {len(tensors)}")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(f"atlas: {op} {role} {tuple(t.shape)} {t.dtype} does not match the "
                                 f"{other} {tuple(like.shape)} {like.dtype}")

    def _flat(self, tensors: Sequence[torch.Tensor], read: bool = True) -> list[Staged]:
        return [Staged(t, read) for t in tensors]

    def _reduce_op(self, opts: object, what: str, tensors: Sequence[torch.Tensor]) -> tuple[str, float | None]:
        """(name of the op the algorithms run, PREMUL_SUM's factor or None), checked
        against every tensor's dtype in the caller's thread."""
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if _is_premul(op):
            factor = getattr(op, "factor", None)
            if factor is None:
                raise ValueError(f"atlas: {what}: reduce op PREMUL_SUM needs its factor: pass "
                                 "dist._make_nccl_premul_sum(factor) or ReduceOp.PREMUL_SUM(factor)")
            if isinstance(factor, torch.Tensor):
                if factor.numel() != 1:
                    raise ValueError(f"atlas: {what}: PREMUL_SUM's factor must be one number, got a tensor of "
                                     f"shape {tuple(factor.shape)}")
                factor = factor.item()
            for t in tensors:
                if not (t.dtype.is_floating_point or t.dtype.is_complex):
                    raise ValueError(f"atlas: {what}: reduce op PREMUL_SUM needs a floating point tensor, got "
                                     f"{t.dtype}")
                _check_reducible(what, "SUM", t.dtype)
            return "SUM", float(factor)
        try:
            name = C.op_name(op)
        except ValueError as exc:
            dtypes = ", ".join(sorted({str(t.dtype) for t in tensors})) or "no tensors"
            raise ValueError(f"{exc} (in {what} of {dtypes})") from None
        for t in tensors:
            C.check_op(name, t.dtype)
            _check_reducible(what, name, t.dtype)
        return name, None

    @staticmethod
    def _op_label(name: str, factor: float | None) -> str:
        return f"PREMUL_SUM({factor:g})" if factor is not None else name

    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        name, factor = self._reduce_op(opts, "all_reduce", tensors)
        site = self._direct_site(tensors) if tensors else None
        if site is not None:  # one gloo all_reduce per tensor (gloo's own list form sums the list)
            if factor is not None:  # PREMUL_SUM: scaled in place before the sum, as the atlas path does
                for t in tensors:
                    t.detach().mul_(factor)
            gloo_op = I.allreduce_options(name)
            return self._direct(site, f"all_reduce({self._op_label(name, factor)})", tensors,
                                [site.pg.allreduce([t], gloo_op) for t in tensors],
                                I.avg_after(tensors, name, self._size))
        staged = self._flat(tensors)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                if factor is not None:
                    s.host.mul_(factor)
                C.all_reduce(s.host, name, self._rank, self._size, xfer, self._scratch)
                s.write_back()
        return self._collective(f"all_reduce({self._op_label(name, factor)})", tensors, body)

    def _sparse_allreduce(self, tensors: list[torch.Tensor], opts) -> AtlasWork:
        """SUM of sparse COO tensors (as gloo does it; `nn.Embedding(sparse=True)` under
        DDP): every rank gathers every rank's indices and values, padded to the largest
        count, and coalesces them in rank order, so every rank gets the same bits; the
        result replaces each tensor's contents."""
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if _is_premul(op) or C.op_name(op) != "SUM":
            raise ValueError(f"atlas: all_reduce of sparse tensors supports reduce op SUM only, got "
                             f"{getattr(getattr(op, 'op', op), 'name', op)}")
        for t in tensors:
            if t.layout != torch.sparse_coo:
                raise ValueError(f"atlas: all_reduce takes sparse and dense tensors in separate calls, got "
                                 f"{sorted({str(x.layout) for x in tensors})}")

        def body(xfer: C.Xfer) -> None:
            for t in tensors:
                mine = t.detach().cpu().coalesce()
                idx, val = mine.indices().contiguous(), mine.values().contiguous()
                counts = [torch.empty(1, dtype=torch.int64) for _ in range(self._size)]
                C.all_gather(counts, torch.tensor([idx.shape[1]], dtype=torch.int64), self._rank, self._size, xfer)
                counts_i = [int(c.item()) for c in counts]
                most = max(counts_i)
                pad_idx = torch.zeros(idx.shape[0], most, dtype=idx.dtype)
                pad_idx[:, :idx.shape[1]] = idx
                pad_val = torch.zeros((most, *val.shape[1:]), dtype=val.dtype)
                pad_val[:val.shape[0]] = val
                all_idx = [torch.empty_like(pad_idx) for _ in range(self._size)]
                all_val = [torch.empty_like(pad_val) for _ in range(self._size)]
                C.all_gather([a.view(-1) for a in all_idx], pad_idx.view(-1), self._rank, self._size, xfer)
                C.all_gather([a.view(-1) for a in all_val], pad_val.view(-1), self._rank, self._size, xfer)
                total = torch.sparse_coo_tensor(
                    torch.cat([a[:, :n] for a, n in zip(all_idx, counts_i, strict=True)], dim=1),
                    torch.cat([a[:n] for a, n in zip(all_val, counts_i, strict=True)]), t.shape).coalesce()
                with torch.no_grad():
                    t.copy_(total.to(t.device))
        return self._collective("all_reduce(SUM) of sparse tensors", tensors, body)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        site = self._direct_site(tensors) if tensors and 0 <= root < self._size else None
        if site is not None:
            gloo_opts = I.broadcast_options(root)
            return self._direct(site, f"broadcast(root {root})", tensors,
                                [site.pg.broadcast([t], gloo_opts) for t in tensors])
        staged = self._flat(tensors, read=self._rank == root)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                C.broadcast(s.host, root, self._rank, self._size, xfer)
                if self._rank != root:
                    s.write_back()
        return self._collective(f"broadcast(root {root})", tensors, body)

    def _gather_pairs(self, op: str, outputs: Sequence[Sequence[torch.Tensor]],
                      inputs: Sequence[torch.Tensor]) -> list[tuple[list[Staged], Staged]]:
        if len(outputs) != len(inputs):
            raise ValueError(f"atlas: {op} needs one output list per input tensor, got {len(outputs)} output "
                             f"lists for {len(inputs)} inputs")
        pairs = []
        for outs, x in zip(outputs, inputs, strict=True):
            self._check_per_rank(op, "output", outs, "input", x)
            pairs.append((self._flat(outs, read=False), Staged(x)))
        return pairs

    def _run_gathers(self, name: str, pairs: list[tuple[list[Staged], Staged]],
                     result: list[torch.Tensor]) -> AtlasWork:
        def body(xfer: C.Xfer) -> None:
            # one round for every pair (a coalesced call crosses the WAN once, not once per tensor)
            C.all_gather_many([([o.host for o in outs], x.host) for outs, x in pairs], self._rank, self._size, xfer)
            for outs, _ in pairs:
                for o in {id(w): w for w in (getattr(o, "whole", o) for o in outs)}.values():
                    o.write_back()
        return self._collective(name, result, body)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts=None) -> AtlasWork:
        pairs = self._gather_pairs("all_gather", output_tensors, input_tensors)
        result = [t for outs in output_tensors for t in outs]
        site = self._direct_site([*result, *input_tensors]) if input_tensors else None
        if site is not None:
            return self._direct(site, "all_gather", result, [I.all_gather_work(site, outs, x) for outs, x in
                                                             zip(output_tensors, input_tensors, strict=True)])
        return self._run_gathers("all_gather", pairs, result)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts=None) -> AtlasWork:
        """`all_gather_coalesced`: `output_lists[rank][i]` receives that rank's `input_list[i]`."""
        if len(output_lists) != self._size:
            raise ValueError(f"atlas: all_gather_coalesced needs one output list per rank ({self._size}), got "
                             f"{len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"atlas: all_gather_coalesced output list of rank {r} has {len(outs)} tensors, "
                                 f"needs one per input ({len(input_list)})")
        per_input = [[output_lists[r][i] for r in range(self._size)] for i in range(len(input_list))]
        pairs = self._gather_pairs("all_gather_coalesced", per_input, input_list)
        result = [t for outs in output_lists for t in outs]
        site = self._direct_site([*result, *input_list]) if input_list else None
        if site is not None:
            return self._direct(site, "all_gather_coalesced", result, [I.all_gather_work(site, outs, x) for outs, x
                                                                       in zip(per_input, input_list, strict=True)])
        return self._run_gathers("all_gather_coalesced", pairs, result)

    def _single_gather(self, op: str, output: torch.Tensor, input: torch.Tensor) -> tuple[list[Staged], Staged]:
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(f"atlas: {op} output {tuple(output.shape)} {output.dtype} needs {self._size} x the "
                             f"input's {input.numel()} elements of {input.dtype}")
        out = Staged(output, read=False)
        return [_Part(out, c) for c in out.host.chunk(self._size)], Staged(input)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> AtlasWork:
        pair = self._single_gather("all_gather_into_tensor", output, input)
        site = self._direct_site([output, input])
        if site is not None:
            return self._direct(site, "all_gather_into_tensor", [output], site.pg._allgather_base(output, input))
        return self._run_gathers("all_gather_into_tensor", [pair], [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts=None) -> AtlasWork:
        if len(outputs) != len(inputs):
            raise ValueError(f"atlas: all_gather_into_tensor_coalesced got {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        pairs = [self._single_gather("all_gather_into_tensor_coalesced", o, i)
                 for o, i in zip(outputs, inputs, strict=True)]
        site = self._direct_site([*outputs, *inputs]) if inputs else None
        if site is not None:
            return self._direct(site, "all_gather_into_tensor_coalesced", list(outputs),
                                [site.pg._allgather_base(o, i) for o, i in zip(outputs, inputs, strict=True)])
        return self._run_gathers("all_gather_into_tensor_coalesced", pairs, list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _run_reduce_scatters(self, name: str, factor: float | None, op: str,
                             pairs: list[tuple[Staged, list[Staged]]], result: list[torch.Tensor]) -> AtlasWork:
        def body(xfer: C.Xfer) -> None:
            for out, ins in pairs:
                parts = [i.host for i in ins]
                if factor is not None:  # scale a copy: the caller's input stays as it was
                    parts = [p.mul(factor) for p in parts]
                C.reduce_scatter(out.host, parts, name, self._rank, self._size, xfer)
                out.write_back()
        return self._collective(f"{op}({self._op_label(name, factor)})", result, body)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts=None) -> AtlasWork:
        name, factor = self._reduce_op(opts, "reduce_scatter", output_tensors)
        if len(output_tensors) != len(input_tensors):
            raise ValueError(f"atlas: reduce_scatter needs one input list per output tensor, got "
                             f"{len(input_tensors)} input lists for {len(output_tensors)} outputs")
        pairs = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            self._check_per_rank("reduce_scatter", "input", ins, "output", out)
            pairs.append((Staged(out, read=False), self._flat(ins)))
        site = (self._direct_site([*output_tensors, *(t for ins in input_tensors for t in ins)])
                if output_tensors else None)
        if site is not None:
            return self._direct_reduce_scatters(site, "reduce_scatter", name, factor, list(output_tensors),
                                                [list(ins) for ins in input_tensors])
        return self._run_reduce_scatters(name, factor, "reduce_scatter", pairs, output_tensors)

    def _direct_reduce_scatters(self, site: I.SiteGroup, op: str, name: str, factor: float | None,
                                outs: list[torch.Tensor], ins: list[list[torch.Tensor]]) -> AtlasWork:
        """Reduce-scatters handed to the site's gloo group from this thread, one gloo work
        per output: PREMUL_SUM sums a scaled copy (the caller's input stays as it was),
        AVG divides the sum once gloo is done, as the atlas path does."""
        if factor is not None:  # one buffer's chunks stay one buffer's chunks (gloo's single-buffer form)
            ins = [list(flat.mul(factor).chunk(self._size)) if (flat := I.joined(parts)) is not None
                   else [p.mul(factor) for p in parts] for parts in ins]
        return self._direct(site, f"{op}({self._op_label(name, factor)})", outs,
                            [I.reduce_scatter_work(site, o, parts, name) for o, parts in zip(outs, ins, strict=True)],
                            I.avg_after(outs, name, self._size))

    def _single_scatter(self, op: str, output: torch.Tensor, input: torch.Tensor) -> tuple[Staged, list[Staged]]:
        if input.numel() != output.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(f"atlas: {op} input {tuple(input.shape)} {input.dtype} needs {self._size} x the "
                             f"output's {output.numel()} elements of {output.dtype}")
        x = Staged(input)
        return Staged(output, read=False), [_Part(x, c) for c in x.host.chunk(self._size)]

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> AtlasWork:
        name, factor = self._reduce_op(opts, "reduce_scatter_tensor", [output])
        pair = self._single_scatter("reduce_scatter_tensor", output, input)
        site = self._direct_site([output, input])
        if site is not None:
            return self._direct_reduce_scatters(site, "reduce_scatter_tensor", name, factor, [output],
                                                [list(input.view(-1).chunk(self._size))])
        return self._run_reduce_scatters(name, factor, "reduce_scatter_tensor", [pair], [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts=None) -> AtlasWork:
        name, factor = self._reduce_op(opts, "reduce_scatter_tensor_coalesced", outputs)
        if len(outputs) != len(inputs):
            raise ValueError(f"atlas: reduce_scatter_tensor_coalesced got {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        pairs = [self._single_scatter("reduce_scatter_tensor_coalesced", o, i)
                 for o, i in zip(outputs, inputs, strict=True)]
        site = self._direct_site([*outputs, *inputs]) if inputs else None
        if site is not None:
            return self._direct_reduce_scatters(site, "reduce_scatter_tensor_coalesced", name, factor, list(outputs),
                                                [list(i.view(-1).chunk(self._size)) for i in inputs])
        return self._run_reduce_scatters(name, factor, "reduce_scatter_tensor_coalesced", pairs, list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def _splits(self, op: str, role: str, t: torch.Tensor, splits: Sequence[int]) -> list[int]:
        """Rows of `t` (along dim 0) for each rank: `splits`, or equal parts when empty."""
        rows = t.shape[0] if t.dim() > 0 else 1
        if not splits:
            if rows % self._size:
                raise ValueError(f"atlas: {op} {role} has {rows} rows (dim 0), not divisible by the group size "
                                 f"{self._size}: pass {role}_split_sizes")
            return [rows // self._size] * self._size
        splits = [int(s) for s in splits]
        if len(splits) != self._size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"atlas: {op} {role}_split_sizes {splits} must be {self._size} (the group size) "
                             f"non-negative row counts adding up to the {role}'s {rows} rows (dim 0)")
        return splits

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts=None) -> AtlasWork:
        """`all_to_all_single`: rank r's input rows for rank p land in rank p's output
        rows for rank r; splits may be uneven or empty (equal parts)."""
        op = "all_to_all_single"
        if output.dtype != input.dtype:
            raise ValueError(f"atlas: {op} output {output.dtype} does not match the input {input.dtype}")
        row_in = math.prod(input.shape[1:]) if input.dim() > 0 else 1
        row_out = math.prod(output.shape[1:]) if output.dim() > 0 else 1
        if row_in != row_out:
            raise ValueError(f"atlas: {op} rows of the output {tuple(output.shape)} and the input "
                             f"{tuple(input.shape)} differ in size ({row_out} and {row_in} elements)")
        ins = self._splits(op, "input", input, input_split_sizes)
        outs = self._splits(op, "output", output, output_split_sizes)
        site = self._direct_site([output, input])
        if site is not None:
            return self._direct(site, op, [output], site.pg.alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes), dist.AllToAllOptions()))
        x, out = Staged(input), Staged(output, read=False)
        in_parts = [_Part(x, c) for c in x.host.split([s * row_in for s in ins])]
        out_parts = [_Part(out, c) for c in out.host.split([s * row_out for s in outs])]

        def body(xfer: C.Xfer) -> None:
            all_to_all([o.host for o in out_parts], [i.host for i in in_parts], self._rank, self._size, xfer)
            out.write_back()
        return self._collective(op, [output], body)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts=None) -> AtlasWork:
        """`all_to_all`: output_tensors[p] receives rank p's input_tensors[this rank]."""
        op = "all_to_all"
        for role, ts in (("output", output_tensors), ("input", input_tensors)):
            if len(ts) != self._size:
                raise ValueError(f"atlas: {op} needs {self._size} {role} tensors (the group size), got {len(ts)}")
        dtypes = {t.dtype for t in [*output_tensors, *input_tensors]}
        if len(dtypes) > 1:
            raise ValueError(f"atlas: {op} tensors must share one dtype, got {sorted(map(str, dtypes))}")
        if output_tensors[self._rank].numel() != input_tensors[self._rank].numel():
            raise ValueError(f"atlas: {op} output {self._rank} {tuple(output_tensors[self._rank].shape)} does not "
                             f"match input {self._rank} {tuple(input_tensors[self._rank].shape)} (this rank's own part)")
        ins, outs = self._flat(input_tensors), self._flat(output_tensors, read=False)

        def body(xfer: C.Xfer) -> None:
            all_to_all([o.host for o in outs], [i.host for i in ins], self._rank, self._size, xfer)
            for o in outs:
                o.write_back()
        return self._collective(op, list(output_tensors), body)

    def reduce(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        name, factor = self._reduce_op(opts, "reduce", tensors)
        root = opts.rootRank if opts is not None else 0
        staged = self._flat(tensors)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                if factor is not None:
                    s.host.mul_(factor)
                C.reduce(s.host, name, root, self._rank, self._size, xfer)
                if self._rank == root:
                    s.write_back()
        return self._collective(f"reduce({self._op_label(name, factor)}, root {root})", tensors, body)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        if len(input_tensors) != 1:
            raise ValueError(f"atlas: gather takes exactly one input tensor, got {len(input_tensors)}")
        x = Staged(input_tensors[0])
        outs = None
        if self._rank == root:
            if len(output_tensors) != 1:
                raise ValueError(f"atlas: gather takes one output list on the root, got {len(output_tensors)}")
            self._check_per_rank("gather", "output", output_tensors[0], "input", input_tensors[0])
            outs = self._flat(output_tensors[0], read=False)

        def body(xfer: C.Xfer) -> None:
            C.gather([o.host for o in outs] if outs else None, x.host, root, self._rank, self._size, xfer)
            for o in outs or []:
                o.write_back()
        return self._collective(f"gather(root {root})", [t for ts in output_tensors for t in ts], body)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        if len(output_tensors) != 1:
            raise ValueError(f"atlas: scatter takes exactly one output tensor, got {len(output_tensors)}")
        out = Staged(output_tensors[0], read=False)
        ins = None
        if self._rank == root:
            if len(input_tensors) != 1:
                raise ValueError(f"atlas: scatter takes one input list on the root, got {len(input_tensors)}")
            self._check_per_rank("scatter", "input", input_tensors[0], "output", output_tensors[0])
            ins = self._flat(input_tensors[0])

        def body(xfer: C.Xfer) -> None:
            C.scatter(out.host, [i.host for i in ins] if ins else None, root, self._rank, self._size, xfer)
            out.write_back()
        return self._collective(f"scatter(root {root})", output_tensors, body)

    def barrier(self, opts=None) -> AtlasWork:
        site = self._direct_site([])
        if site is not None:
            return self._direct(site, "barrier", [], I.barrier_work(site))
        return self._collective("barrier", [], lambda xfer: C.barrier(self._rank, self._size, xfer))

    def monitored_barrier(self, timeout: object = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier, on this group object (`dist.monitored_barrier` itself
        accepts only gloo, by name): every rank reports to rank 0, which waits up to
        `timeout` (default: the group's) and raises RuntimeError naming the first rank
        that did not arrive (every such rank with `wait_all_ranks`), then releases the
        others; a rank that rank 0 does not release raises naming rank 0. Runs on point
        to point tag MONITORED_BARRIER_TAG, apart from the collectives' order."""
        limit = self._timeout.total_seconds() if timeout is None else seconds(timeout)
        ms = round(limit * 1000)
        tag = MONITORED_BARRIER_TAG
        if self._rank != 0:
            try:
                self.send([torch.zeros(1, dtype=torch.uint8)], 0, tag)
                self.recv([torch.empty(1, dtype=torch.uint8)], 0, tag).wait(timeout=max(limit, 1e-3))
            except Exception as exc:  # noqa: BLE001 - reported as gloo reports it, with the cause
                raise RuntimeError(f"Rank {self._rank} successfully reached monitoredBarrier, but received errors "
                                   f"while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                   f"rank. ({exc})") from None
            return
        start = time.monotonic()
        works = {r: self.recv([torch.empty(1, dtype=torch.uint8)], r, tag) for r in range(1, self._size)}
        done: list[int] = []
        failed: list[int] = []
        for r, w in works.items():
            remaining = limit if wait_all_ranks else limit - (time.monotonic() - start)
            if remaining <= 0:
                raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms (group "
                                   f"{self._group_name!r}); ranks that arrived: {done}")
            try:
                w.wait(timeout=remaining)
                done.append(r)
            except Exception:  # noqa: BLE001 - the rank did not arrive in time
                if not wait_all_ranks:
                    raise RuntimeError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms (group "
                                       f"{self._group_name!r})") from None
                failed.append(r)
        if failed:
            raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier in "
                               f"{ms} ms (group {self._group_name!r})")
        for w in [self.send([torch.zeros(1, dtype=torch.uint8)], r, tag) for r in range(1, self._size)]:
            w.wait()


class _Part:
    """A slice of a staged tensor's host buffer; the caller writes back `whole`, once."""

    def __init__(self, whole: Staged, host: torch.Tensor) -> None:
        self.whole, self.host = whole, host


def create_backend(dist_opts, pg_options) -> ProcessGroupAtlas:
    """The creator torch calls for backend="atlas" (registered with extended_api)."""
    return ProcessGroupAtlas(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
                             str(dist_opts.group_id), list(dist_opts.global_ranks_in_group), pg_options)
