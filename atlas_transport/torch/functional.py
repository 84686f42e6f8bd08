"""torch's `_c10d_functional.all_gather_into_tensor_out` (the all-gather into a given
buffer, which torch.compile's collective bucketing emits) for Python process groups.

torch 2.13's C++ kernel of that op calls `ProcessGroup::_allgather_base`, which the
trampoline of a Python process group does not forward to Python: on `atlas` (or any
Python group) it looks for a C++ backend and fails with "No backend type associated
with device type cpu". `register()` puts a kernel for the cpu and cuda dispatch keys
in front of it that does what the C++ one does, through the group's Python-visible
`_allgather_base` (for a C++ group, gloo or nccl, that is the binding of the same C++
method), and registers the work for `wait_tensor`."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, _register_work
from torch.distributed.distributed_c10d import _resolve_process_group

_LIB: torch.library.Library | None = None


def all_gather_into_tensor_out(input: torch.Tensor, group_size: int, group_name: object, *,
                               out: torch.Tensor) -> torch.Tensor:
    if not input.is_contiguous():
        raise RuntimeError("all_gather_into_tensor_out: the input must be contiguous")
    group = group_name if isinstance(group_name, dist.ProcessGroup) else _resolve_process_group(group_name)
    work = group._allgather_base(out, input, AllgatherOptions())
    _register_work(out, work)
    return out


def register() -> None:
    """Install the kernel once per process (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for key in ("CPU", "CUDA"):
        lib.impl("all_gather_into_tensor_out", all_gather_into_tensor_out, key)
    _LIB = lib
