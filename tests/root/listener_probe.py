"""Probe TCP listeners as a stranger to the run would (root tests; not collected).

``python tests/root/listener_probe.py '<json>'`` runs inside an emulated host (or in the
root namespace) and prints one JSON object. The argument names ``own_ip`` (the host's
address in the run, for listeners on every interface), optional ``targets`` ([[ip,
port], ...]; default: every TCP listener of this network namespace, from
/proc/net/tcp{,6}) and optional ``controller`` ({ip, port, token_file}: read its
status with the run's client token, and try it on loopback, an address the run does
not use). Each target gets an HTTP request without a token (``http``) and an atlas
handshake with another run's secret (``atlas``).
"""

from __future__ import annotations

import json
import socket
import sys
import time

TIMEOUT_S = 3.0
PADDING = "x" * 64  # longer than an atlas HELLO: a listener that reads one decides at once


def _ipv6(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listeners() -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket of this namespace."""
    out = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            rows = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            ip = _ipv6(addr) if v6 else socket.inet_ntoa(bytes.fromhex(addr)[::-1])
            out.append((ip, int(port, 16)))
    return sorted(set(out))


def http(ip: str, port: int, token: str | None = None, path: str = "/v1/prefill",
         timeout: float = TIMEOUT_S) -> tuple[str, bytes]:
    """What an HTTP request gets: 'http <status>', 'closed' (EOF, nothing sent back),
    'reset', 'refused' / 'unreachable' (no connection), 'silent' (open, no answer),
    'bytes' (something not HTTP); and the body read."""
    body = b'{"prompt_tokens": 64}'
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    method = "POST" if path == "/v1/prefill" else "GET"
    req = (f"{method} {path} HTTP/1.1\r\nHost: probe\r\nContent-Type: application/json\r\n{auth}"
           f"X-Padding: {PADDING}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    try:
        s = socket.create_connection((ip, port), timeout=timeout)
    except ConnectionRefusedError:
        return "refused", b""
    except OSError:
        return "unreachable", b""
    got = b""
    try:
        s.settimeout(timeout)
        s.sendall(req)
        while True:
            part = s.recv(65536)
            if not part:
                break
            got += part
    except ConnectionResetError:
        return ("reset" if not got else _kind(got)), got
    except OSError:
        return ("silent" if not got else _kind(got)), got
    finally:
        s.close()
    return ("closed" if not got else _kind(got)), got


def _kind(got: bytes) -> str:
    if got.startswith(b"HTTP/1."):
        return "http " + got.split(b" ", 2)[1].decode()
    return "bytes"


def atlas(ip: str, port: int, timeout: float = TIMEOUT_S) -> str:
    """An atlas channel opened with another run's secret: 'accepted' or why it was not."""
    from atlas_transport import TransportConfig, connect

    cfg = TransportConfig(streams=1, secret="not-this-runs-secret", connect_timeout_s=timeout)
    try:
        ch = connect(ip, port, cfg)
    except Exception as exc:  # noqa: BLE001 - every refusal is an answer here
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    ch.close(timeout=1.0)
    return "accepted"


def probe(own_ip: str, targets: list[tuple[str, int]] | None = None, controller: dict | None = None) -> dict:
    found = listeners() if targets is None else [tuple(t) for t in targets]
    rows = []
    for ip, port in found:
        to = own_ip if ip in ("0.0.0.0", "::") else ip
        kind, body = http(to, port)
        rows.append({"listen": [ip, port], "target": [to, port], "http": kind,
                     "http_body": body[-300:].decode(errors="replace"), "atlas": atlas(to, port)})
    out: dict = {"listeners": rows}
    if controller is not None:
        token = open(controller["token_file"]).read().strip()
        from bubbletea_agent.controller.auth import client_token

        other = client_token("another run's secret")  # a token replayed from another run
        out["other_run_token"] = http(controller["ip"], controller["port"], other)[0]
        out["loopback"] = http("127.0.0.1", controller["port"], token)[0]
        time.sleep(0.2)
        kind, body = http(controller["ip"], controller["port"], token, path="/v1/status")
        out["status"] = kind
        out["counts"] = json.loads(body.split(b"\r\n\r\n", 1)[1]) if kind == "http 200" else None
    return out


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(probe(args["own_ip"], args.get("targets"), args.get("controller"))))
