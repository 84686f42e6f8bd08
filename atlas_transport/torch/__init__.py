"""The Atlas transport as a torch.distributed backend: `import atlas_transport.torch`
registers backend "atlas", then

    dist.init_process_group(backend="atlas")            # or
    dist.new_group(ranks, backend="atlas", pg_options=AtlasOptions(streams=8))

carries the group's traffic over atlas channels: one per pair of ranks, opened on
first use, N TCP streams each (AtlasOptions.streams or ATLAS_STREAMS; by default 1
stream on a path under 2 ms RTT, 8 beyond). Point-to-point (send, recv, isend, irecv,
batch_isend_irecv) and the collectives of data parallelism (broadcast, all_reduce,
all_gather, reduce_scatter, barrier, reduce, gather, scatter). Rendezvous goes
through the group's store; every wait is bounded by the group's timeout and a dead
or silent peer becomes an `AtlasError` naming its rank. Importing this module only
registers the backend (idempotent)."""

from __future__ import annotations

import torch.distributed as _dist

from .backend import BACKEND_NAME, ProcessGroupAtlas, create_backend
from .options import AtlasOptions
from .work import AtlasError, AtlasWork

__all__ = ["AtlasError", "AtlasOptions", "AtlasWork", "ProcessGroupAtlas", "BACKEND_NAME"]


def _register() -> None:
    if BACKEND_NAME.upper() in _dist.Backend._plugins:
        return
    _dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu", "cuda"])


_register()
