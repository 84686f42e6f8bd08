"""Reduce operations on CPU tensors: which ops atlas supports, for which dtypes, and
combining two contributions in place. Shared by the flat algorithms (collectives)
and the hierarchical ones."""

from __future__ import annotations

import torch
import torch.distributed as dist

_OPS = {
    dist.ReduceOp.SUM: "SUM", dist.ReduceOp.AVG: "AVG", dist.ReduceOp.PRODUCT: "PRODUCT",
    dist.ReduceOp.MIN: "MIN", dist.ReduceOp.MAX: "MAX", dist.ReduceOp.BAND: "BAND",
    dist.ReduceOp.BOR: "BOR", dist.ReduceOp.BXOR: "BXOR",
}


def op_name(op: object) -> str:
    """The supported op's name; ValueError naming an unsupported one (PREMUL_SUM)."""
    for known, name in _OPS.items():
        try:
            if op == known:
                return name
        except TypeError:
            continue
    shown = getattr(getattr(op, "op", op), "name", None) or repr(op)
    raise ValueError(f"atlas: reduce op {shown} is not supported; use one of {', '.join(_OPS.values())}")


def check_op(name: str, dtype: torch.dtype) -> None:
    if name in ("BAND", "BOR", "BXOR") and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"atlas: reduce op {name} needs an integer or bool tensor, got {dtype}")
    if name == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"atlas: reduce op AVG needs a floating point tensor, got {dtype} (use SUM and divide)")
    if name in ("MIN", "MAX") and dtype.is_complex:
        raise ValueError(f"atlas: reduce op {name} is undefined for complex tensor {dtype}")


def combine(acc: torch.Tensor, other: torch.Tensor, name: str) -> None:
    """acc = acc (op) other, in place (AVG sums: the caller divides at the end)."""
    if name in ("SUM", "AVG"):
        if acc.dtype == torch.bool:
            acc.logical_or_(other)
        else:
            acc.add_(other)
    elif name == "PRODUCT":
        if acc.dtype == torch.bool:
            acc.logical_and_(other)
        else:
            acc.mul_(other)
    elif name == "MIN":
        torch.minimum(acc, other, out=acc)
    elif name == "MAX":
        torch.maximum(acc, other, out=acc)
    elif name == "BAND":
        acc.bitwise_and_(other)
    elif name == "BOR":
        acc.bitwise_or_(other)
    elif name == "BXOR":
        acc.bitwise_xor_(other)
    else:  # op_name() lets nothing else through
        raise ValueError(f"atlas: reduce op {name} is not supported")


def finish_avg(x: torch.Tensor, name: str, size: int) -> None:
    if name == "AVG":
        x.div_(size)
