"""The `torch-gloo` variant's network: torch.distributed with the gloo backend, as
pipeline training across DCs is run today, over the same emulated network.

`init_gloo` joins the run's process group (one rank per worker, the store on the
first worker's host) over the interface that carries the worker's own address.
`GlooChannel` gives a peer rank the part of an atlas_transport channel's interface
the pipeline's `TransportComm` uses (``isend``, ``irecv``, handles that say when they
completed), so the schedule, the transfer records and the metrics stay the same and
only the bytes' path differs: gloo's one TCP connection per pair of ranks.
`gloo_allreduce` is the DP gradient all-reduce: ``dist.all_reduce`` of the gradients'
size over the stage's DP group, in buckets, as DDP does.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup, Work

GLOO_TAG_MASK = (1 << 31) - 1
"""gloo tags are 31-bit: a channel tag keeps its low bits (micro-batch, direction and
boundary; the iteration's bits go, and no two iterations' tensors are in flight at once)."""
_SIOCGIFADDR = 0x8915


class GlooError(RuntimeError):
    """The process group cannot be joined, or a transfer failed."""


def interface_of(ip: str) -> str:
    """The name of the network interface that has address `ip` in this namespace
    (gloo binds to an interface: by default it resolves the host name, which in an
    emulated host is the machine's and names no address here)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == ip:
            return name
    names = ", ".join(n for _, n in socket.if_nameindex())
    raise GlooError(f"no interface has address {ip} here (interfaces: {names})")


def init_gloo(*, store_ip: str, port: int, rank: int, world_size: int, own_ip: str, timeout_s: float,
              groups: list[list[int]]) -> list[ProcessGroup]:
    """Join the run's gloo process group and create `groups` (every rank creates every
    group, in the same order: torch.distributed requires it). Returns the groups."""
    import datetime

    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = interface_of(own_ip)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{store_ip}:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return [dist.new_group(ranks=g, backend="gloo") for g in groups]
    except (RuntimeError, ValueError) as exc:
        raise GlooError(f"rank {rank} of {world_size}: joining the gloo process group at {store_ip}:{port} "
                        f"failed: {exc}") from None


@dataclass
class _GlooHandle:
    """A gloo send or receive: `wait` returns the received tensor (or None for a send).
    `completed_at` (time.monotonic) is when `wait` saw it complete: gloo's futures
    complete when the work is queued, not when the bytes are there, so the wait is
    the clock (the pipeline waits for what it receives: the arrival, to the wait's
    granularity)."""

    work: Work
    tensor: torch.Tensor | None
    is_recv: bool
    completed_at: float | None = None
    _done: bool = field(default=False, repr=False)

    def _stamp(self) -> None:
        if self.completed_at is None:
            self.completed_at = time.monotonic()

    def wait(self, timeout: float | None = None) -> torch.Tensor | None:
        import datetime

        if not self._done:
            try:
                if timeout is None:
                    self.work.wait()
                else:
                    self.work.wait(datetime.timedelta(seconds=max(0.001, timeout)))
            except RuntimeError as exc:
                if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                    raise TimeoutError(str(exc)) from None
                raise GlooError(str(exc)) from None
            self._stamp()
            self._done = True
        return self.tensor if self.is_recv else None


class GlooChannel:
    """To one peer rank through gloo: what `TransportComm` calls on a channel. Received
    tensors are `nbytes` bytes (the workload's wire size: modelled work sends
    placeholders of that size)."""

    def __init__(self, peer_rank: int, nbytes: int) -> None:
        self.peer_rank = peer_rank
        self.nbytes = nbytes

    def isend(self, tensor: torch.Tensor, tag: int) -> _GlooHandle:
        import torch.distributed as dist

        return _GlooHandle(dist.isend(tensor.contiguous(), self.peer_rank, tag=tag & GLOO_TAG_MASK), None, False)

    def irecv(self, tag: int, *, into: torch.Tensor | None = None, device: torch.device | str | None = None
              ) -> _GlooHandle:
        import torch
        import torch.distributed as dist

        buf = into if into is not None else torch.empty(self.nbytes, dtype=torch.uint8)
        return _GlooHandle(dist.irecv(buf, self.peer_rank, tag=tag & GLOO_TAG_MASK), buf, True)

    def close(self, timeout: float | None = None) -> None:
        """Nothing to close per peer: the process group ends with `close_gloo`."""


def close_gloo(timeout_s: float = 30.0) -> None:
    """Leave the process group once every rank is done with it (a barrier first: a rank
    that tears its gloo threads down while a peer still talks to it can abort the
    process at exit)."""
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError:
        pass  # a peer is gone already: nothing left to wait for
    dist.destroy_process_group()


def gloo_allreduce(group: ProcessGroup, grad_bytes: int, bucket_bytes: int, buffer: torch.Tensor) -> float:
    """All-reduce `grad_bytes` of gradients over `group` in buckets of `bucket_bytes`
    (float32 elements of `buffer`, at least one bucket), as DDP does with gloo. Returns
    the seconds it took."""
    import torch.distributed as dist

    t0 = time.monotonic()
    left = grad_bytes
    while left > 0:
        n = min(left, bucket_bytes)
        dist.all_reduce(buffer[: max(1, n // 4)], group=group)
        left -= n
    return time.monotonic() - t0
