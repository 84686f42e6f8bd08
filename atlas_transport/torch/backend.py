"""`ProcessGroupAtlas`: a torch.distributed process group whose traffic goes over
atlas channels (see the package docstring for use).

Point-to-point operations are posted on the pair's channel at once (or queued until
it opens) with the caller's tag; their work waits on the transfer itself.
Collectives run one at a time, in call order, on the group's own thread, all on one
reserved tag: every rank runs the same collectives in the same order, so each
pair's messages match by their order on that tag."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from . import collectives as C
from .mesh import COLL_TAG, MAX_P2P_TAG, PeerMesh, PeerOp
from .options import AtlasOptions, resolve
from .posting import Posting
from .staging import Staged
from .work import AtlasError, AtlasWork

log = logging.getLogger("atlas_transport.torch")

BACKEND_NAME = "atlas"


class P2PWork(AtlasWork):
    """A send or receive: wait() waits on the transfer itself (no extra thread)."""

    def __init__(self, mesh: PeerMesh, op: PeerOp, result: list[torch.Tensor]) -> None:
        super().__init__(op.what, result)
        self._mesh, self._op = mesh, op
        self._src = op.peer

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


class ProcessGroupAtlas(dist.ProcessGroup):
    """One process group over atlas channels (created by `init_process_group` /
    `new_group` with backend="atlas")."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str = "0",
                 global_ranks: Sequence[int] = (), options: AtlasOptions | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout_s = timeout.total_seconds()
        self._label = str(group_name)
        self.options = resolve(options)
        self._mesh = PeerMesh(rank, size, store, self.options, self._timeout_s, self._label, list(global_ranks))
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._broken: AtlasError | None = None
        self._scratch_bufs: dict[torch.dtype, torch.Tensor] = {}  # used by the collectives thread only
        self._posting = Posting(self._mesh)  # topology and detached sends, used by the collectives thread only
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"atlas-pg{self._label}-collectives")
        self._thread.start()

    # --- identity ----------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"ProcessGroupAtlas(group={self._label!r}, rank={self._rank}, size={self._size})"

    @property
    def streams_used(self) -> dict[int, int]:
        """Streams of each open channel, by peer group rank."""
        return dict(self._mesh.streams_used)

    def shutdown(self) -> None:
        self._queue.put(None)
        self._mesh.close()

    def abort(self) -> None:
        self.shutdown()

    # --- point to point -------------------------------------------------------------

    def _p2p(self, kind: str, tensors: list[torch.Tensor], peer: int, tag: int) -> P2PWork:
        if len(tensors) != 1:
            raise ValueError(f"atlas: {kind} takes exactly one tensor, got {len(tensors)}")
        if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag <= MAX_P2P_TAG:
            raise ValueError(f"atlas: {kind} tag {tag!r} is out of range: use 0..{MAX_P2P_TAG}")
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"atlas: {kind} peer {peer} is not another rank of this group (size {self._size}, "
                             f"this rank {self._rank})")
        t = tensors[0]
        what = f"{kind} of {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        op = PeerOp(kind, peer, t, tag, time.monotonic() + self._timeout_s, what)
        self._mesh.post(op)
        return P2PWork(self._mesh, op, tensors)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> P2PWork:
        return self._p2p("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> P2PWork:
        return self._p2p("recv", tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> P2PWork:
        raise AtlasError("atlas: recv from any source (src=None) is not supported: pass the sender's rank as src")

    # --- collectives --------------------------------------------------------------

    def _collective(self, name: str, result: list[torch.Tensor],
                    body: Callable[[C.Xfer], None]) -> AtlasWork:
        with self._seq_lock:
            seq = self._seq
            self._seq += 1
        work = AtlasWork(f"{name} #{seq} of group {self._label!r} on rank {self._rank}", result)
        self._queue.put((work, body))
        return work

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, body = item
            if self._broken is not None:
                work._fail(AtlasError(f"atlas: {work.what}: the group failed earlier: {self._broken}"))
                continue
            deadline = time.monotonic() + self._timeout_s
            try:
                body(self._posting.net(work.what, deadline))  # an xfer(sends, recvs) and a post/wait Net
            except AtlasError as exc:
                self._broken = exc
                work._fail(exc)
            except Exception as exc:  # noqa: BLE001 - a bad argument: this collective fails, the group lives
                work._fail(exc)
            else:
                work._finish()

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

    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        name = C.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            C.check_op(name, t.dtype)
        staged = self._flat(tensors)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                C.all_reduce(s.host, name, self._rank, self._size, xfer, self._scratch)
                s.write_back()
        return self._collective(f"all_reduce({name})", tensors, body)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        staged = self._flat(tensors, read=self._rank == root)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                C.broadcast(s.host, root, self._rank, self._size, xfer)
                if self._rank != root:
                    s.write_back()
        return self._collective(f"broadcast(root {root})", tensors, body)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts=None) -> AtlasWork:
        if len(output_tensors) != len(input_tensors):
            raise ValueError("atlas: all_gather needs one output list per input tensor")
        pairs = []
        for outs, x in zip(output_tensors, input_tensors, strict=True):
            self._check_per_rank("all_gather", "output", outs, "input", x)
            pairs.append((self._flat(outs, read=False), Staged(x)))

        def body(xfer: C.Xfer) -> None:
            for outs, x in pairs:
                C.all_gather([o.host for o in outs], x.host, self._rank, self._size, xfer)
                for o in outs:
                    o.write_back()
        return self._collective("all_gather", [t for outs in output_tensors for t in outs], body)

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> AtlasWork:
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> AtlasWork:
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"atlas: all_gather_into_tensor output has {output.numel()} elements, needs "
                             f"{self._size} x {input.numel()}")
        out, x = Staged(output, read=False), Staged(input)

        def body(xfer: C.Xfer) -> None:
            C.all_gather(list(out.host.chunk(self._size)), x.host, self._rank, self._size, xfer)
            out.write_back()
        return self._collective("all_gather_into_tensor", [output], body)

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts=None) -> AtlasWork:
        name = C.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        pairs = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            C.check_op(name, out.dtype)
            self._check_per_rank("reduce_scatter", "input", ins, "output", out)
            pairs.append((Staged(out, read=False), self._flat(ins)))

        def body(xfer: C.Xfer) -> None:
            for out, ins in pairs:
                C.reduce_scatter(out.host, [i.host for i in ins], name, self._rank, self._size, xfer)
                out.write_back()
        return self._collective(f"reduce_scatter({name})", output_tensors, body)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> AtlasWork:
        name = C.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        C.check_op(name, output.dtype)
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"atlas: reduce_scatter_tensor input has {input.numel()} elements, needs "
                             f"{self._size} x {output.numel()}")
        out, x = Staged(output, read=False), Staged(input)

        def body(xfer: C.Xfer) -> None:
            C.reduce_scatter(out.host, list(x.host.chunk(self._size)), name, self._rank, self._size, xfer)
            out.write_back()
        return self._collective(f"reduce_scatter_tensor({name})", [output], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce(self, tensors: list[torch.Tensor], opts=None) -> AtlasWork:
        name = C.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        staged = self._flat(tensors)

        def body(xfer: C.Xfer) -> None:
            for s in staged:
                C.check_op(name, s.host.dtype)
                C.reduce(s.host, name, root, self._rank, self._size, xfer)
                if self._rank == root:
                    s.write_back()
        return self._collective(f"reduce({name}, root {root})", tensors, body)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        x = Staged(input_tensors[0])
        outs = self._flat(output_tensors[0], read=False) if self._rank == root else None

        def body(xfer: C.Xfer) -> None:
            C.gather([o.host for o in outs] if outs else None, x.host, root, self._rank, self._size, xfer)
            for o in outs or []:
                o.write_back()
        return self._collective(f"gather(root {root})", [t for ts in output_tensors for t in ts], body)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts=None) -> AtlasWork:
        root = opts.rootRank if opts is not None else 0
        out = Staged(output_tensors[0], read=False)
        ins = self._flat(input_tensors[0]) if self._rank == root else None

        def body(xfer: C.Xfer) -> None:
            C.scatter(out.host, [i.host for i in ins] if ins else None, root, self._rank, self._size, xfer)
            out.write_back()
        return self._collective(f"scatter(root {root})", output_tensors, body)

    def barrier(self, opts=None) -> AtlasWork:
        return self._collective("barrier", [], lambda xfer: C.barrier(self._rank, self._size, xfer))


def create_backend(dist_opts, pg_options) -> ProcessGroupAtlas:
    """The creator torch calls for backend="atlas" (registered with extended_api)."""
    return ProcessGroupAtlas(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
                             str(dist_opts.group_id), list(dist_opts.global_ranks_in_group), pg_options)
