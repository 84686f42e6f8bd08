"""Drive emulated devices through a pipeline schedule.

``run_worker`` is the loop of one (pipeline, rank) worker: it walks the rank's op
list, runs each forward/backward on its `Device` and hands boundary tensors to a
`Comm`. The Comm is the only I/O: `LocalComm` (in-process mailboxes, zero delay)
is used here to check schedules against real devices; a multi-host runner plugs in
one backed by the Atlas transport (send = isend, recv = wait for the tag).

``run_local`` runs every worker of every pipeline as a thread in this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from testbed_core.device_records import WorkRecord
from testbed_core.schedules import Schedule
from testbed_core.simulate import TransferKey
from testbed_runtime.device import Device


class Comm(Protocol):
    """How a worker's schedule moves boundary tensors (in-process queues, or
    atlas_transport channels: testbed/training/transport_comm.py)."""

    def send(self, key: TransferKey, payload: Any) -> None:
        """Hand a boundary tensor over; may return before it has arrived."""

    def recv(self, key: TransferKey) -> Any:
        """Block until the tensor `key` has arrived and return it."""

    def flush(self) -> None:
        """Block until every send of this worker has been delivered."""


class StageWork(Protocol):
    """What a stage computes. Seconds are model seconds for modelled devices (real
    devices time the work itself)."""

    def forward_seconds(self, stage: int) -> float | None: ...
    def backward_seconds(self, stage: int) -> float | None: ...
    def forward(self, stage: int, mb: int, x: Any) -> Any: ...
    def backward(self, stage: int, mb: int, grad: Any) -> Any: ...


@dataclass
class ModelledWork:
    """Timing only: the payloads are placeholders, the devices hold for the model's time."""

    forward_s: list[float]
    backward_s: list[float]
    payload: Any = None

    def forward_seconds(self, stage: int) -> float:
        return self.forward_s[stage]

    def backward_seconds(self, stage: int) -> float:
        return self.backward_s[stage]

    def forward(self, stage: int, mb: int, x: Any) -> Any:
        return self.payload

    def backward(self, stage: int, mb: int, grad: Any) -> Any:
        return self.payload


class ExecutorError(RuntimeError):
    """A worker failed or waited too long for a tensor."""


class LocalComm:
    """In-process mailboxes shared by all workers: zero delay, unbounded buffers."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._cv = threading.Condition()
        self._box: dict[TransferKey, Any] = {}
        self.timeout_s = timeout_s

    def send(self, key: TransferKey, payload: Any) -> None:
        with self._cv:
            self._box[key] = payload
            self._cv.notify_all()

    def recv(self, key: TransferKey) -> Any:
        with self._cv:
            if not self._cv.wait_for(lambda: key in self._box, timeout=self.timeout_s):
                raise ExecutorError(f"no tensor {key} after {self.timeout_s:g} s (is its sender running?)")
            return self._box.pop(key)

    def flush(self) -> None:
        return None


def run_worker(
    schedule: Schedule,
    rank: int,
    pipeline: int,
    device: Device,
    comm: Comm,
    work: StageWork,
    *,
    owner: str | None = None,
    start_at: float | None = None,
    flush: bool = True,
) -> list[WorkRecord]:
    """Run one worker's op list; returns its device records (in order). With `flush`
    (the default) it returns once every send was delivered (`Comm.flush`); without, the
    caller flushes later (a training worker starts its DP ring first, as a framework's
    all-reduce does not wait for the pipeline's last send to be acknowledged)."""
    owner = owner or f"train:p{pipeline}r{rank}"
    if start_at is not None:
        while (left := start_at - time.time()) > 0:
            time.sleep(left)
    inbox: dict[tuple[str, int, int], Any] = {}
    outbox: dict[tuple[str, int, int], Any] = {}
    records = []
    for op in schedule.ops[rank]:
        k = op.kind
        if k in ("RECV_F", "RECV_B"):
            inbox[(op.direction(), op.stage, op.mb)] = comm.recv(TransferKey.for_op(pipeline, op))
        elif k in ("SEND_F", "SEND_B"):
            comm.send(TransferKey.for_op(pipeline, op), outbox.pop((op.direction(), op.stage, op.mb)))
        else:  # F or B: what arrived for it (None on the first/last stage) in, its result out
            fwd = k == "F"
            box = ("fwd" if fwd else "bwd", op.stage, op.mb)
            seconds, compute = (work.forward_seconds, work.forward) if fwd else (work.backward_seconds, work.backward)
            x = inbox.pop(box, None)
            rec = device.run(
                "forward" if fwd else "backward", owner,
                duration_s=seconds(op.stage) if device.mode == "modelled" else None,
                fn=lambda op=op, x=x, compute=compute: compute(op.stage, op.mb, x),
                label=f"{k}{op.mb}@s{op.stage}",
            )
            outbox[box] = rec.result
            records.append(rec)
    if flush:
        comm.flush()
    return records


def run_local(
    schedule: Schedule,
    pipelines: int,
    devices: Mapping[tuple[int, int], Device],
    work: StageWork,
    *,
    comm: Comm | None = None,
    offsets: list[float] | None = None,
) -> dict[tuple[int, int], list[WorkRecord]]:
    """Run every (pipeline, rank) worker as a thread of this process; returns the
    device records of each worker."""
    comm = comm or LocalComm()
    missing = [(d, r) for d in range(pipelines) for r in range(schedule.ranks) if (d, r) not in devices]
    if missing:
        raise ExecutorError(f"no device for workers {missing} (keys are (pipeline, rank))")
    t0 = time.time() + 0.05  # all threads created before anyone starts
    results: dict[tuple[int, int], list[WorkRecord]] = {}

    def body(d: int, r: int) -> None:
        start = t0 + (offsets[d] if offsets else 0.0)
        results[(d, r)] = run_worker(schedule, r, d, devices[(d, r)], comm, work, start_at=start)

    run_threads([(d, r) for d in range(pipelines) for r in range(schedule.ranks)], body)
    return results


def run_threads(workers: Sequence[tuple[int, int]], body: Callable[[int, int], None], name: str = "") -> None:
    """`body(pipeline, rank)` for every worker, each on its own thread, all at once;
    returns once all have ended. A worker that raised makes it raise ExecutorError
    (how many failed, the first one's error as its cause)."""
    errors: list[BaseException] = []

    def guarded(d: int, r: int) -> None:
        try:
            body(d, r)
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(d, r), daemon=True, name=f"{name}p{d}r{r}" if name else None)
               for d, r in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise ExecutorError(f"{len(errors)} worker(s) failed; first: {errors[0]!r}") from errors[0]
