"""Tensors as the collectives need them: flat, contiguous and in CPU memory.

A contiguous CPU tensor is used in place; a non-contiguous one goes through a
contiguous copy; a CUDA tensor through pinned host memory (copied to the host in
the caller's thread when the operation is posted, so the copy follows the caller's
stream, and back to the device when the operation completes)."""

from __future__ import annotations

import torch

from ..tensors import check_plain


def _pinned_ok() -> bool:
    return torch.cuda.is_available()


class Staged:
    """`host`: the flat contiguous CPU tensor the algorithms read and write."""

    def __init__(self, user: torch.Tensor, read: bool = True) -> None:
        check_plain(user, "atlas: a collective's tensor")
        self.user = user
        plain = user.device.type == "cpu" and user.is_contiguous() and not user.is_conj() and not user.is_neg()
        self.in_place = plain
        if plain:
            self.host = user.detach().view(-1)
            return
        host = torch.empty(user.shape, dtype=user.dtype, pin_memory=user.is_cuda and _pinned_ok())
        if read:
            with torch.no_grad():
                host.copy_(user.detach())
        self.host = host.view(-1)

    def write_back(self) -> None:
        """Copy the result into the caller's tensor (nothing to do when used in place)."""
        if not self.in_place:
            with torch.no_grad():
                self.user.copy_(self.host.view(self.user.shape))
