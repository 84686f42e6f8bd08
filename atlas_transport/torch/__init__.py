"""The Atlas transport as a torch.distributed backend: `import atlas_transport.torch`
registers backend "atlas" (for cpu and cuda tensors), then

    dist.init_process_group(backend="atlas")            # or
    dist.new_group(ranks, backend="atlas", pg_options=AtlasOptions(streams=8))

carries the group's traffic over atlas channels: one per pair of ranks, opened on
first use, N TCP streams each (AtlasOptions.streams or ATLAS_STREAMS; by default 1
stream on a path under 2 ms RTT, 8 beyond). CUDA tensors are staged through host
memory.

What works on it (torch 2.13, checked by tests/unit/transport/test_torch_backend*.py):
- point to point: send, recv, isend, irecv, batch_isend_irecv, recv from any source
  (`dist.recv(t)` returns the sender), object send/recv;
- every collective in its list, single-tensor and coalesced forms: all_reduce (SUM,
  AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM; SUM of sparse COO tensors,
  as gloo), allreduce_coalesced,
  broadcast, all_gather, all_gather_into_tensor, all_gather_coalesced,
  reduce_scatter, reduce_scatter_tensor, all_to_all and all_to_all_single (uneven
  splits), reduce, gather, scatter, barrier, the object collectives, and
  `_coalescing_manager` (its coalesced forms);
- what torch's libraries look up on a group: its name (DeviceMesh, functional
  collectives and torch.compile'd ones, DTensor, tensor parallel, FSDP2), its device
  types (object collectives, state-dict broadcast, dcp.async_save), `_get_backend`,
  `split_group` where an accelerator is bound (`init_process_group(device_id=...)`);
- DDP communication hooks: futures are settled off the collectives thread, so a
  callback may run collectives and wait for them (PowerSGD);
- `monitored_barrier` on the group object, as gloo's.
torch restricts two things to its built-in backends: `dist.monitored_barrier` (gloo
only, by name) and `_set_pg_timeout` (gloo and nccl; `set_timeout` on the group
works). The `_out` all-gather of compiled code (`all_gather_into_tensor_out`), whose
C++ kernel looks for a C++ backend a Python group cannot have, gets a kernel that
calls the group's `_allgather_base` (see `functional`; it serves C++ groups the same
way).

Rendezvous goes through the group's store; every wait is bounded by the group's
timeout and a dead or silent peer becomes an `AtlasError` naming its rank. Bad input
(an op a dtype cannot take, split sizes, list lengths) raises at the call, naming
the op and dtype; tensors whose sizes differ across ranks fail the operation naming
both ranks and both sizes. Importing this module registers the backend and that kernel
(idempotent)."""

from __future__ import annotations

import torch.distributed as _dist

from . import functional
from .backend import BACKEND_NAME, ProcessGroupAtlas, create_backend
from .options import AtlasOptions
from .work import AtlasError, AtlasWork

__all__ = ["AtlasError", "AtlasOptions", "AtlasWork", "ProcessGroupAtlas", "BACKEND_NAME"]


def _register() -> None:
    functional.register()
    if BACKEND_NAME.upper() in _dist.Backend._plugins:
        return
    _dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu", "cuda"])


_register()
