"""Opening a worker's channels: its pipeline boundary channels (`ChannelJob`) and, in
with dp > 1, its DP gradient channels (`DpPeerJob`). Every channel is an
atlas_transport channel with the job's transport settings and its own stream count."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from testbed.training.worker.job import WorkerError
from testbed_core.contracts.worker_job import ChannelJob, DpPeerJob, TrainJob, TransportJob

if TYPE_CHECKING:
    from atlas_transport.channel import Channel
    from atlas_transport.config import TransportConfig
    from atlas_transport.endpoints import Listener


def transport_config(transport: TransportJob, streams: int, window_clamp: int | None = None) -> TransportConfig:
    """The atlas_transport endpoint settings of one channel of `streams` streams
    (`window_clamp`: the most each stream advertises as receive window, ChannelJob.window_clamp)."""
    from atlas_transport import TransportConfig

    return TransportConfig(streams=streams, chunk_bytes=transport.chunk_bytes, congestion=transport.congestion,
                           pacing_rate_mbps=transport.pacing_rate_mbps, window_clamp=window_clamp,
                           connect_timeout_s=transport.connect_timeout_s)


def _clamp(c: ChannelJob | DpPeerJob) -> int | None:
    """A boundary channel's window clamp (DP gradient channels have none)."""
    return c.window_clamp if isinstance(c, ChannelJob) else None


def connect_with_retry(ip: str, port: int, cfg: TransportConfig, deadline: float, what: str) -> Channel:
    """connect(), retried while the listener is not up yet (refused) until `deadline`."""
    from atlas_transport import connect
    from atlas_transport.errors import AuthenticationError, ConnectError

    while True:
        try:
            return connect(ip, port, cfg)
        except AuthenticationError as exc:
            raise WorkerError(f"{what}: {exc} (are both ends started with the same ATLAS_SECRET?)") from None
        except (ConnectError, OSError) as exc:
            if time.monotonic() > deadline:
                raise WorkerError(f"{what}: cannot connect to {ip}:{port}: {exc}") from None
            time.sleep(0.1)


def _ends(job: TrainJob) -> list[tuple[tuple[str, int], ChannelJob | DpPeerJob, str]]:
    """Every channel of a worker: ((kind, index), spec, what it is, for messages);
    kind "b" is a pipeline boundary, "dp" a DP peer (index: its DP rank)."""
    if job.gloo is not None:  # torch.distributed carries everything (testbed/training/gloo_comm.py)
        return []
    out: list[tuple[tuple[str, int], ChannelJob | DpPeerJob, str]] = [
        (("b", c.boundary), c, f"the channel of boundary {c.boundary}") for c in job.channels]
    if job.dp is not None:
        out += [(("dp", p.dp_rank), p, f"the gradient channel of DP replica {p.dp_rank}") for p in job.dp.peers]
    return out


def open_all_channels(job: TrainJob) -> tuple[dict[int, Channel], dict[int, Channel]]:
    """(boundary channels by boundary, DP gradient channels by peer DP rank): listen
    for every channel this worker accepts, connect the others, then accept. Listening
    first lets two workers that connect to each other in opposite orders both proceed."""
    from atlas_transport import listen

    deadline = time.monotonic() + job.setup_timeout_s
    ends = _ends(job)
    listeners: dict[tuple[str, int], tuple[ChannelJob | DpPeerJob, Listener]] = {}
    channels: dict[tuple[str, int], Channel] = {}
    try:
        for key, c, _ in ends:
            if c.role == "listen":
                listeners[key] = (c, listen(job.bind_ip, c.port, transport_config(job.transport, c.streams,
                                                                                   _clamp(c))))
        for key, c, what in ends:
            if c.role == "connect":
                channels[key] = connect_with_retry(c.peer_ip, c.port,
                                                   transport_config(job.transport, c.streams, _clamp(c)),
                                                   deadline, f"{job.worker}: {what} to {c.peer}")
        whats = {key: what for key, _, what in ends}
        for key, (c, lst) in listeners.items():
            try:
                channels[key] = lst.accept(timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise WorkerError(
                    f"{job.worker}: {c.peer} did not open {whats[key]} "
                    f"(port {c.port}) within {job.setup_timeout_s:g} s"
                ) from None
    except BaseException:
        for ch in channels.values():
            ch.close(timeout=1.0)
        raise
    finally:
        for _, lst in listeners.values():
            lst.close()
    return ({i: ch for (k, i), ch in channels.items() if k == "b"},
            {i: ch for (k, i), ch in channels.items() if k == "dp"})
