"""Torch tensors as flat byte views, without copying the payload.

The sender sends straight from the tensor's memory and the receiver writes straight
into the destination's memory; only three cases need a staging copy, which torch
does in C: a non-contiguous tensor (made contiguous), a CUDA tensor (through pinned
host memory) and a `recv_into` destination that is itself non-contiguous or on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .protocol import DTYPE_CODES


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise TypeError(f"dtype {dtype} is not supported by the transport (supported: {', '.join(DTYPE_CODES)})")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview on the bytes of a contiguous CPU tensor (shares memory)."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def check_plain(t: torch.Tensor, what: str) -> None:
    """TypeError unless `t` is a dense tensor in CPU or CUDA memory (`what`: the
    operation or argument, for the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{what}: only dense (strided) tensors are supported, got layout {t.layout}")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{what}: tensors on {t.device.type} are not supported (use cpu or cuda)")


@dataclass
class Outgoing:
    host: torch.Tensor  # contiguous CPU tensor kept alive until the peer confirms
    view: memoryview
    dtype: str
    shape: tuple[int, ...]


def prepare_send(t: torch.Tensor) -> Outgoing:
    check_plain(t, "send")
    name = dtype_name(t.dtype)
    src = t.detach()
    if src.is_cuda:
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src)
    else:
        src = src.resolve_conj().resolve_neg()
        host = src if src.is_contiguous() else src.contiguous()
    return Outgoing(host, byte_view(host), name, tuple(host.shape))


@dataclass
class Destination:
    """Where an incoming transfer lands, and what to do once it is whole."""

    buffer: torch.Tensor  # contiguous CPU tensor the chunks are written into
    view: memoryview
    finish: Callable[[], torch.Tensor]  # returns what the user receives
    owned: bool = True  # the transport allocated `buffer` (False: it is the caller's tensor)


def check_device(device: torch.device | None) -> None:
    """Refuse a receive device this process cannot use, before any data arrives."""
    if device is None or device.type == "cpu":
        return
    if device.type != "cuda":
        raise ValueError(f"device={device}: tensors can be received on cpu or cuda")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device}: CUDA is not available in this process; receive on the cpu")


def new_destination(dtype: str, shape: tuple[int, ...], device: torch.device | None = None) -> Destination:
    """A fresh tensor for `recv` (pinned host memory when it must go to a GPU)."""
    pin = device is not None and device.type == "cuda"
    buf = torch.empty(shape, dtype=torch_dtype(dtype), pin_memory=pin)
    if device is None or device.type == "cpu":
        return Destination(buf, byte_view(buf), lambda: buf)
    return Destination(buf, byte_view(buf), lambda: buf.to(device, non_blocking=False))


def check_into(t: torch.Tensor, dtype: str, shape: tuple[int, ...]) -> str | None:
    """Why a transfer cannot land in `t`, or None when it can (same dtype and count)."""
    got = f"{dtype}[{', '.join(map(str, shape))}]"
    want = f"{dtype_name(t.dtype)}[{', '.join(map(str, t.shape))}]"
    if dtype_name(t.dtype) != dtype:
        return f"the transfer carries {got}, the destination is {want} (dtype differs)"
    numel = 1
    for d in shape:
        numel *= d
    if numel != t.numel():
        return f"the transfer carries {got}, the destination is {want} (element count differs)"
    return None


def into_destination(t: torch.Tensor) -> Destination:
    """Receive into the user's tensor: directly when it is contiguous on the CPU."""
    check_plain(t, "recv_into")
    if t.is_cuda:
        staging = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    elif t.is_contiguous() and not t.is_conj() and not t.is_neg():
        return Destination(t, byte_view(t), lambda: t, owned=False)
    else:
        staging = torch.empty(t.shape, dtype=t.dtype)

    def finish() -> torch.Tensor:
        with torch.no_grad():
            t.copy_(staging)
        return t

    return Destination(staging, byte_view(staging), finish)


def copy_into(t: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Deliver an already received tensor into the user's destination (one copy)."""
    with torch.no_grad():
        t.copy_(src.reshape(t.shape))
    return t
