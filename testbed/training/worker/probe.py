"""The calibration probes (``probe-send`` / ``probe-recv``, testbed/run/calibration.py):
`count` tensors over one channel of N streams, timed on the wall clock every process
shares."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from testbed.training.worker.channels import connect_with_retry, transport_config
from testbed.training.worker.job import WorkerError
from testbed_core.contracts.worker_job import ProbeJob, RingProbeJob


def run_probe(job: ProbeJob) -> None:
    """Time `count` tensors over one channel. The receiver writes the arrival times,
    the sender the hand-over and confirmation times (wall clock), to `out`."""
    import torch

    from atlas_transport import listen
    from testbed.training.transport_comm import wall_of

    cfg = transport_config(job.transport, job.streams)
    result: dict[str, Any] = {"name": job.name, "role": job.role, "streams": job.streams, "nbytes": job.nbytes}
    deadline = time.monotonic() + job.timeout_s
    if job.role == "probe-recv":
        with listen(job.bind_ip, job.port, cfg) as lst:
            print("listening", flush=True)
            ch = lst.accept(timeout=job.timeout_s)
            try:
                if job.warmup_bytes:
                    ch.irecv(2).wait(max(0.1, deadline - time.monotonic()))
                arrived = []
                for _ in range(job.count):
                    h = ch.irecv(1)
                    h.wait(max(0.1, deadline - time.monotonic()))
                    arrived.append(wall_of(h.completed_at))
                result["arrived"] = arrived
            finally:
                ch.close(timeout=5.0)
    else:
        ch = connect_with_retry(job.peer_ip, job.port, cfg, deadline, f"probe {job.name}")
        try:
            if job.warmup_bytes:
                ch.isend(torch.zeros(job.warmup_bytes, dtype=torch.uint8), 2).wait(max(0.1, deadline - time.monotonic()))
            payload = torch.zeros(job.nbytes, dtype=torch.uint8)
            start_at = job.start_at
            if job.wait_go:  # all probes connected: the runner gives them one start instant
                print("connected", flush=True)
                words = sys.stdin.readline().split()
                if len(words) != 2 or words[0] != "go":
                    raise WorkerError(f"probe {job.name}: expected 'go <time>' on stdin, got {' '.join(words)!r}")
                start_at = float(words[1])
            if start_at is not None:
                while (left := start_at - time.time()) > 0:
                    time.sleep(left)
            sent, confirmed = [], []
            first = start_at if start_at is not None else time.time()
            for k in range(job.count):
                if job.period_s is not None:  # synchronised rounds with the other probes
                    while (left := first + k * job.period_s - time.time()) > 0:
                        time.sleep(left)
                elif k and job.gap_s:
                    time.sleep(job.gap_s)
                sent.append(time.time())
                h = ch.isend(payload, 1)
                h.wait(max(0.1, deadline - time.monotonic()))
                confirmed.append(wall_of(h.completed_at))
            result.update(sent=sent, confirmed=confirmed)
        finally:
            ch.close(timeout=5.0)
    tmp = Path(job.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, job.out)


def run_ring_probe(job: RingProbeJob) -> None:
    """Open the one channel to the other replica, wait for the runner's common start
    ('connected', then 'go <time>' on stdin, as the other probes), then run the
    training workers' DP ring all-reduce `count` times; write each run's seconds and
    the bytes each replica sent to `out`."""
    import torch

    from atlas_transport import listen
    from testbed.training.allreduce import ring_allreduce, ring_plan

    cfg = transport_config(job.transport, job.streams)
    deadline = time.monotonic() + job.timeout_s
    if job.channel == "listen":
        with listen(job.bind_ip, job.port, cfg) as lst:
            print("listening", flush=True)
            ch = lst.accept(timeout=job.timeout_s)
    else:
        ch = connect_with_retry(job.peer_ip, job.port, cfg, deadline, f"ring probe {job.name}")
    try:
        plan = ring_plan(job.dp_rank, 2, job.grad_bytes, job.bucket_bytes)
        bucket = max(plan.messages)
        filler, landing = torch.zeros(bucket, dtype=torch.uint8), torch.empty(bucket, dtype=torch.uint8)
        print("connected", flush=True)
        words = sys.stdin.readline().split()
        if len(words) != 2 or words[0] != "go":
            raise WorkerError(f"ring probe {job.name}: expected 'go <time>' on stdin, got {' '.join(words)!r}")
        while (left := float(words[1]) - time.time()) > 0:
            time.sleep(left)
        peer = {1 - job.dp_rank: ch}
        times = [ring_allreduce(plan, peer, filler, landing, max(0.1, deadline - time.monotonic()))
                 for _ in range(job.count)]
    finally:
        ch.close(timeout=5.0)
    tmp = Path(job.out).with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": job.name, "times_s": times, "bytes_sent": plan.bytes_sent}))
    os.replace(tmp, job.out)
