"""A connected channel pair inside one process, over 127.0.0.1: for tests, examples
and quick experiments without a second process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from .channel import Channel
from .config import TransportConfig
from .endpoints import connect, listen


@contextmanager
def loopback_pair(cfg: TransportConfig | None = None, **overrides: object) -> Iterator[tuple[Channel, Channel]]:
    """Yield (connector side, listener side); both are closed on exit."""
    cfg = replace(cfg or TransportConfig(secret="loopback"), **overrides)
    with listen("127.0.0.1", 0, cfg) as lst:
        box: dict[str, object] = {}

        def accept() -> None:
            try:
                box["ch"] = lst.accept(timeout=cfg.connect_timeout_s + 5)
            except Exception as exc:  # surfaced below
                box["err"] = exc

        th = threading.Thread(target=accept, daemon=True)
        th.start()
        client = connect("127.0.0.1", lst.port, cfg)
        th.join()
        if "err" in box:
            client.close(timeout=1)
            raise box["err"]  # type: ignore[misc]
        server: Channel = box["ch"]  # type: ignore[assignment]
        try:
            yield client, server
        finally:
            client.close(timeout=5)
            server.close(timeout=5)
