"""iperf3 (its Python wrapper over libiperf) as run inside an emulated node: one
server test, one client test, each in-process. `topo check` (linkcheck) and the
transport benchmark both use these, so both get the same fixes.

- The wrapper captures libiperf's JSON result through a pipe that it reads only when
  the test ends; a large result (many streams) would block the test on a default
  64 KiB pipe, so the pipe is grown first.
- The wrapper objects close the process's stdio in `__del__`: they are kept alive until
  the process ends.
- A client started before its server listens retries for `connect_timeout` seconds.
"""

from __future__ import annotations

import time
from typing import Any

F_SETPIPE_SZ = 1031
_KEEP: list[Any] = []  # wrapper objects live as long as the process (see above)


def _grow_pipe(obj: Any) -> None:
    import fcntl

    try:
        fcntl.fcntl(obj._pipe_in, F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError):
        pass


def iperf3_server(bind: str, port: int) -> Any:
    """Serve one iperf3 test on `bind:port`; the wrapper's result (None if it failed
    before a test)."""
    import iperf3

    server = iperf3.Server()
    _KEEP.append(server)
    _grow_pipe(server)
    server.bind_address, server.port, server.verbose = bind, port, False
    return server.run()


def iperf3_client(host: str, port: int, streams: int, duration: int, omit: int = 0,
                  connect_timeout: float = 10.0) -> Any:
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
