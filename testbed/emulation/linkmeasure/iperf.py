"""iperf3 (its Python wrapper over libiperf) as run inside an emulated node: one
server test, one client test, each in-process. `topo check` (`check.measure_goodput`,
through this module's command line, ``python -m testbed.emulation.linkmeasure.iperf
client|server`` in the nodes) and the transport benchmark (testbed/bench/transport.py)
both use these, so both get the same fixes.

- The wrapper captures libiperf's JSON result through a pipe that it reads only when
  the test ends; a large result (many streams) would block the test on a default
  64 KiB pipe, so the pipe is grown first.
- The wrapper objects close the process's stdio in `__del__`: they are kept alive until
  the process ends.
- A client started before its server listens retries for `connect_timeout` seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from iperf3 import IPerf3, TestResult

IPERF_MODULE = "testbed.emulation.linkmeasure.iperf"  # this module, as `python -m` runs it in a node
IPERF_PORT = 5201
F_SETPIPE_SZ = 1031
_KEEP: list[IPerf3] = []  # wrapper objects live as long as the process (see above)


class IperfLine(BaseModel):
    """What ``python -m testbed.emulation.linkmeasure.iperf client`` prints, one JSON line:
    the goodput the server received (bit/s) and what the client sent, or the error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bps: float | None
    sent_bps: float | None = None
    retransmits: int | None = None
    streams: int | None = None
    error: str | None = None


def _grow_pipe(obj: IPerf3) -> None:
    import fcntl

    try:
        fcntl.fcntl(obj._pipe_in, F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError):
        pass


def iperf3_server(bind: str, port: int) -> TestResult | None:
    """Serve one iperf3 test on `bind:port`; the wrapper's result (None if it failed
    before a test)."""
    import iperf3

    server = iperf3.Server()
    _KEEP.append(server)
    _grow_pipe(server)
    server.bind_address, server.port, server.verbose = bind, port, False
    return server.run()


def iperf3_client(host: str, port: int, streams: int, duration: int, omit: int = 0,
                  connect_timeout: float = 10.0) -> TestResult:
    """Run one iperf3 test against `host:port` with `streams` parallel streams for
    `duration` seconds (the first `omit` not counted); the wrapper's result, whose
    `error` is set when the test failed."""
    import iperf3

    deadline = time.monotonic() + connect_timeout
    while True:
        client = iperf3.Client()
        _KEEP.append(client)
        _grow_pipe(client)
        client.server_hostname, client.port = host, port
        client.num_streams, client.duration, client.omit = streams, duration, omit
        client.verbose = False
        result = client.run()
        if result.error and "connect" in result.error.lower() and time.monotonic() < deadline:
            time.sleep(0.1)  # the server is not listening yet
            continue
        return result


# --------------------------------------------------------------------------- in-node entry points


def _server_main(bind: str, port: int) -> int:
    result = iperf3_server(bind, port)
    return 0 if result is not None and not getattr(result, "error", None) else 1


def _client_main(server_ip: str, port: int, streams: int, duration: int, omit: int,
                 connect_timeout: float = 10.0) -> int:
    """One test; its result as one JSON line on stdout (what `check.measure_goodput` reads)."""
    result = iperf3_client(server_ip, port, streams, duration, omit, connect_timeout)
    if result.error:
        print(IperfLine(bps=None, error=result.error).model_dump_json())
        return 1
    print(IperfLine(bps=result.received_bps, sent_bps=result.sent_bps, retransmits=result.retransmits,
                    streams=streams).model_dump_json())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {IPERF_MODULE}",
                                     description="iperf3 (Python wrapper) endpoints run inside emulated nodes")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, default=IPERF_PORT)
    c = sub.add_parser("client")
    c.add_argument("--server", required=True)
    c.add_argument("--port", type=int, default=IPERF_PORT)
    c.add_argument("--streams", type=int, default=8)
    c.add_argument("--duration", type=int, default=4)
    c.add_argument("--omit", type=int, default=1)
    ns = parser.parse_args(argv)
    if ns.role == "server":
        return _server_main(ns.bind, ns.port)
    return _client_main(ns.server, ns.port, ns.streams, ns.duration, ns.omit)


if __name__ == "__main__":
    sys.exit(main())
