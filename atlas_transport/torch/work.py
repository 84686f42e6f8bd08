"""Work objects the `atlas` backend returns, and its error type.

A Python `Work` subclass (not a future-wrapping work: torch 2.13's
`_create_work_from_future` does not raise a failed future's error from `wait()`).
`get_future()` is what DDP's communication hooks use on all-reduce work.

A future is settled on a thread of its own, never on the thread that ran the
operation: a callback may start another collective and wait for it (DDP's PowerSGD
hook does, from inside `then`), and that collective runs on the group's one
collectives thread, which must stay free for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future


class AtlasError(dist.DistBackendError):
    """An atlas backend operation failed or timed out; the message names the
    operation, the peer rank and the cause."""


class AtlasWork(dist.distributed_c10d.Work):
    """Completed by whoever runs the operation (`_finish` / `_fail`)."""

    def __init__(self, what: str, result: list[torch.Tensor]) -> None:
        super().__init__()
        self.what = what
        self._result = result
        self._event = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._future: Future | None = None
        self._on_done: list[Callable[[], None]] = []

    # --- completion (the backend's side) ---------------------------------------------

    def _finish(self) -> None:
        self._complete(None)

    def _fail(self, exc: BaseException) -> None:
        self._complete(exc)

    def _complete(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._error = exc
            self._event.set()
            fut = self._future
        if fut is not None:
            threading.Thread(target=_settle, args=(fut, exc, self._result), daemon=True,
                             name="atlas-future").start()

    # --- torch's Work API ------------------------------------------------------------

    def _drive(self) -> None:
        """Wait until the work completes (subclasses do the waiting themselves)."""
        self._event.wait()

    def wait(self, timeout: object = None) -> bool:
        """Wait for the operation (bounded by the group's timeout already); a shorter
        `timeout` (timedelta or seconds; 0 or None: none) raises AtlasError when it
        passes first, leaving the operation running."""
        limit = seconds(timeout)
        if limit and not self._event.is_set():
            self._start_watch()
            if not self._event.wait(limit):
                raise AtlasError(f"atlas: {self.what} did not complete within the {limit:g} s given to wait()")
        else:
            self._drive()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        with self._lock:
            if self._future is None:
                devices = sorted({str(t.device) for t in self._result if t.device.type == "cuda"})
                self._future = Future(devices=devices) if devices else Future()
                if self._event.is_set():
                    _settle(self._future, self._error, self._result)
                else:
                    self._start_watch()
            return self._future

    def _start_watch(self) -> None:
        """Make sure someone completes the work without a wait() call (p2p works)."""

    def __repr__(self) -> str:
        state = "failed" if self._error else "completed" if self._event.is_set() else "pending"
        return f"<AtlasWork {self.what} {state}>"


def seconds(timeout: object) -> float:
    """A wait's timeout (timedelta, seconds or None) in seconds; 0 means none."""
    if timeout is None:
        return 0.0
    if isinstance(timeout, timedelta):
        return max(0.0, timeout.total_seconds())
    return max(0.0, float(timeout))


def _settle(fut: Future, exc: BaseException | None, result: list[torch.Tensor]) -> None:
    if exc is None:
        try:
            fut.set_result(result)
            return
        except RuntimeError as err:  # e.g. a result on a device the future was not made for
            exc = AtlasError(f"atlas: could not hand the operation's result to its future: {err}")
    fut.set_exception(exc)
