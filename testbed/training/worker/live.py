"""BubbleTea next to a training worker: the slot feed of its device (planned idle
slots per iteration, testbed_runtime/slots.py) and its live status (the earliest time
training can want the device again, testbed_runtime/live.py and live_reporter.py), each
only when the job asks for it. The worker writes both through the runtime layer and
never imports the BubbleTea agent."""

from __future__ import annotations

import sys
from typing import Any

from testbed_core.contracts.worker_job import TrainJob
from testbed_runtime.live import Nudger, StatusWriter
from testbed_runtime.live_reporter import (
    ArrivalFloor,
    LiveComm,
    LiveReporter,
    ProgressBound,
    WatchedChannel,
)
from testbed_runtime.slots import Slot, SlotPublisher
from testbed_runtime.tcp_progress import TcpProgressError, TcpReceived


def slot_publisher(job: TrainJob) -> SlotPublisher | None:
    """BubbleTea's slot feed of this worker's device, or None."""
    if not job.slots_path:
        return None
    return SlotPublisher(job.slots_path, worker=job.worker, stage=job.rank)


def publish_slots(publisher: SlotPublisher, job: TrainJob, iteration: int, start: float) -> None:
    """The planned idle slots of `iteration`, which starts at `start` (wall clock)."""
    publisher.publish([Slot(iteration, k, start + s, e - s, job.rank) for k, (s, e) in enumerate(job.idle_slots)])


def live_reporter(job: TrainJob) -> LiveReporter | None:
    """BubbleTea's live status writer of this worker's device, or None."""
    if job.live is None:
        return None
    return LiveReporter(StatusWriter(job.live.status_path), Nudger(job.live.wake_path), lead_s=job.live.lead_s,
                        poll_s=job.live.poll_s)


def watched(channels: dict[int, Any], job: TrainJob, live: LiveReporter | None) -> dict[int, Any]:
    """The channels as the Comm sees them: with live status, receives report while they
    wait (bounded by the bytes still missing at the slowest link's rate, where the
    kernel's byte counts of the channel's sockets can be read)."""
    if live is None:
        return channels
    assert job.live is not None
    out: dict[int, Any] = {}
    for c in job.channels:
        rate = job.live.recv_rate_bps[c.boundary]
        progress = None
        if rate > 0:
            try:
                counter = TcpReceived.for_channel(c.peer_ip, c.port, c.role, c.streams)
                progress = ProgressBound(counter.total, rate, job.live.slack_bytes)
            except (TcpProgressError, OSError) as exc:
                print(f"{job.worker}: boundary {c.boundary}: no byte counts ({exc}); live bound learned instead",
                      file=sys.stderr, flush=True)
        floor = ArrivalFloor(job.wire_bytes * 8 / rate if rate > 0 else 0.0)
        out[c.boundary] = WatchedChannel(channels[c.boundary], live, floor, job.wire_bytes, progress)
    return out


def live_comm(comm: Any, live: LiveReporter) -> LiveComm:
    """The Comm the schedule drives: `comm`, reporting the live status as it goes."""
    return LiveComm(comm, live)
