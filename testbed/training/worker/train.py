"""The training loop of a ``train`` worker: connect to the runner, open the channels,
then run each iteration of its schedule when the runner says ``go`` (at the common
start plus its pipeline's planned offset), write its transfer records and report the
iteration done, until the runner says ``stop``."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from testbed.training.allreduce import ring_allreduce, ring_plan
from testbed.training.gloo_comm import GlooChannel, close_gloo, gloo_allreduce, init_gloo
from testbed.training.worker.channels import open_all_channels, transport_config
from testbed.training.worker.control import Control
from testbed.training.worker.live import (
    live_comm,
    live_reporter,
    publish_slots,
    slot_publisher,
    watched,
)
from testbed.training.worker.real import end_real_iteration, real_work_of
from testbed_core.contracts.control import Bye, Hello, IterDone, Ready, Stop, WorkerFailed
from testbed_core.contracts.worker_job import TrainJob

if TYPE_CHECKING:
    from testbed.training.transport_comm import Planned


class TemporalArgs(TypedDict, total=False):
    """The `TransportComm` keyword arguments a temporal plan sets."""

    plan: dict[tuple[str, int, int], Planned]
    mode: str
    token_timeout_s: float


def temporal_comm_args(job: TrainJob) -> TemporalArgs:
    """The `TransportComm` arguments of the job's temporal plan (none without a plan)."""
    from testbed.training.transport_comm import Planned

    if job.temporal is None:
        return {}
    plan = {(p.direction, p.boundary, p.mb): Planned(p.start_s, tuple(p.tokens), p.duration_s, tuple(p.next))
            for p in job.temporal.sends}
    return {"plan": plan, "mode": job.temporal.mode, "token_timeout_s": job.temporal.token_timeout_s}


def run_train(job: TrainJob) -> None:
    """Run a training worker to its end; any failure is also reported to the runner
    (an ``error`` message with the traceback) before it propagates."""
    t0 = time.time()
    import torch

    from testbed.training.executor import ModelledWork, run_worker
    from testbed.training.real_mode import save_params
    from testbed.training.transport_comm import ChannelPath, TokenBus, TransferLog, TransportComm
    from testbed_core.schedules import build_schedule
    from testbed_runtime.device import Device

    control = Control(job.control, job.worker, job.setup_timeout_s)
    try:
        control.send(Hello(worker=job.worker, pid=os.getpid(), host=job.host))
        schedule = build_schedule(job.schedule, job.pp, job.microbatches, job.chunks)
        if job.real is not None:
            torch.set_num_threads(job.real.threads)
        else:  # no math: one thread (a warm start's torch was imported before OMP_NUM_THREADS was set)
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
        device = Device(job.device.name, job.device.run_dir, mode=job.device.mode, time_scale=job.device.time_scale)
        gloo_group = None
        if job.gloo is not None:  # torch-gloo: the process group carries the pipeline and the all-reduce
            groups = init_gloo(store_ip=job.gloo.store_ip, port=job.gloo.port, rank=job.gloo.rank,
                               world_size=job.gloo.world_size, own_ip=job.gloo.own_ip, timeout_s=job.setup_timeout_s,
                               groups=job.gloo.dp_groups)
            gloo_group = groups[job.gloo.dp_group]
        t_imports = time.time()
        channels, dp_channels = open_all_channels(job)
        if job.real is not None and job.gloo is None:  # small real tensors: streams as the calibration had them
            from testbed.training.worker.warm import warm_wan_channels

            warm_wan_channels(channels, job.channels, job.setup_timeout_s)
        t_channels = time.time()
        if job.gloo is not None:
            channels = {b: GlooChannel(peer, job.wire_bytes) for b, peer in job.gloo.peers.items()}
        owner = f"train:{job.worker}"
        real = None if job.real is None else real_work_of(job, dp_channels)
        work = real if real is not None else ModelledWork(list(job.forward_s), list(job.backward_s))
        live = live_reporter(job)
        paths = {c.boundary: ChannelPath(c.peer, tuple(c.links), c.latency_s, c.streams, tuple(c.recv_links))
                 for c in job.channels}
        filler = torch.zeros(job.wire_bytes, dtype=torch.uint8)
        ring = gloo_buffer = None
        if job.dp is not None and gloo_group is not None:
            gloo_buffer = torch.zeros(max(1, min(job.dp.grad_bytes, job.dp.bucket_bytes) // 4), dtype=torch.float32)
        elif job.dp is not None and real is None:  # modelled devices: the ring moves placeholder bytes
            ring = ring_plan(job.dp.dp_rank, job.dp.dp, job.dp.grad_bytes, job.dp.bucket_bytes)
            bucket = max(ring.messages)
            ring_out, ring_in = torch.zeros(bucket, dtype=torch.uint8), torch.empty(bucket, dtype=torch.uint8)
        comm = TransportComm(job.pipeline, job.worker, watched(channels, job, live), paths, filler=filler,
                             timeout_s=job.timeout_s, verify=job.verify_tensors and real is None,
                             **temporal_comm_args(job))
        driver = comm if live is None else live_comm(comm, live)
        if job.temporal is not None and job.temporal.token_bus is not None:
            bus = job.temporal.token_bus
            comm.bus = TokenBus(job.bind_ip, bus.port, bus.peers, comm.on_token,
                                secret=transport_config(job.transport, 1).resolved_secret())
        tlog = TransferLog(Path(job.transfers_path))
        publisher = slot_publisher(job)
        if live is not None:
            live.between()
        control.send(Ready(worker=job.worker))
        print(f"{job.worker}: ready {time.time() - t0:.2f} s after start (imports and process group "
              f"{t_imports - t0:.2f} s, channels {t_channels - t_imports:.2f} s)", file=sys.stderr, flush=True)
        try:
            for msg in control.messages():
                if isinstance(msg, Stop):
                    break
                i, at = msg.iteration, msg.at
                comm.begin_iteration(i, at)
                if publisher is not None:
                    publish_slots(publisher, job, i, at)
                if live is not None:
                    live.scheduled(i, at + job.offset_s)
                # the ring starts at the last backward and the pipeline's sends are confirmed
                # after it: a DP all-reduce does not wait for the stage before to acknowledge
                # the last gradient (a WAN latency after it arrived)
                records = run_worker(schedule, job.rank, job.pipeline, device, driver, work,
                                     owner=owner, start_at=at + job.offset_s, flush=ring is None)
                loss, allreduce_s = None, None
                if ring is not None or gloo_buffer is not None:
                    if live is not None:
                        live.busy()
                    if ring is not None:
                        allreduce_s = ring_allreduce(ring, dp_channels, ring_out, ring_in, job.timeout_s)
                    else:
                        allreduce_s = gloo_allreduce(gloo_group, job.dp.grad_bytes, job.dp.bucket_bytes, gloo_buffer)
                    ring_end = time.time()
                if ring is not None:
                    driver.flush()
                if real is not None:  # DP gradient average (network), then the step on the device
                    if live is not None:
                        live.busy()
                    loss, step = end_real_iteration(real, device, owner, i)
                    records.append(step)
                sent, received = comm.take_records()
                tlog.add("send", sent)
                tlog.add("recv", received)
                tlog.write()
                end = max((r.end for r in records), default=at)
                if allreduce_s is not None:
                    end = max(end, ring_end)
                control.send(IterDone(worker=job.worker, iteration=i, end=end, allreduce_s=allreduce_s,
                                      busy=sum(r.end - r.start for r in records),
                                      token_timeouts=comm.token_timeouts, loss=loss))
                if live is not None:
                    live.between()  # the runner heard we are done: the next start is >= now + lead
            if real is not None:
                save_params(job, real)
        finally:
            if live is not None:
                live.ended()
                live.close()
                print(f"live status of {job.worker}: {json.dumps(live.stats)}", file=sys.stderr, flush=True)
            if publisher is not None:
                publisher.end()
                publisher.close()
            comm.close()
            if comm.bus is not None:
                comm.bus.close()
            for ch in [*channels.values(), *dp_channels.values()]:
                ch.close(timeout=5.0)
            if job.gloo is not None:
                close_gloo()
        control.send(Bye(worker=job.worker))
    except BaseException as exc:
        try:
            control.send(WorkerFailed(worker=job.worker, message=f"{type(exc).__name__}: {exc}",
                                      trace=traceback.format_exc()))
        except OSError:
            pass
        raise
    finally:
        control.close()
