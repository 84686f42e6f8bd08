"""Two atlas channels on the emulated 2dc WAN, 8 MiB tensors taking turns, each stream's
TCP state after every tensor: the reproduction of issue 40's one slow WAN channel
(prefill-service-2dc, bubbletea-soak) and of its fix.

Channel c0 joins dc1 host 0 and dc2 host 0, c1 dc1 host 1 and dc2 host 1; each end of
each channel sends `--tensors` 8 MiB tensors (8 streams, chunk 4 MiB, paced, as those
scenarios' workers do), one every `--period` s, c1 half a period after c0, so the two
channels take turns on each direction of the WAN, as a temporal plan has them; neither
is warmed first (modelled workers are not). After each tensor (isend to the peer's DONE)
the sender records each stream's bytes, retransmissions, cwnd, ssthresh and the peer's
window (TCP_INFO); after the run every host's HyStart and retransmission counters
(nstat). Writes OUT/<channel>-<end>.jsonl, OUT/nstat-<dc>-<i>.txt and prints, per
channel end, the tensors' times and the streams' ssthresh.

    sudo flock /tmp/emulation.lock .venv/bin/python scripts/slow_start_repro.py --out DIR
    sudo flock /tmp/emulation.lock .venv/bin/python scripts/slow_start_repro.py --out DIR --no-restart

``--no-restart`` turns TransportConfig.restart_cut_slow_start off (the transport before
the fix). Needs root (the emulated network); about 25 s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TENSOR = 8 << 20
NSTAT = ["TcpExtTCPHystart*", "TcpRetransSegs", "TcpExtTCPLossProbes", "TcpExtTCPSpuriousRTOs"]


def _info(sock: socket.socket) -> dict[str, int]:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    u32 = lambda off: struct.unpack_from("I", raw, off)[0]  # noqa: E731
    return {"ca": raw[1], "cwnd": u32(80), "ssthresh": u32(76), "retrans": u32(100),
            "sent": struct.unpack_from("Q", raw, 200)[0], "peer_window": u32(228) if len(raw) >= 232 else -1}


def worker(a: argparse.Namespace) -> None:
    """One end of one channel: send a tensor in each slot, receive the peer's."""
    import torch

    from atlas_transport import TransportConfig, connect, listen

    cfg = TransportConfig(streams=8, chunk_bytes=4 << 20, pacing_rate_mbps=10_000.0, secret=b"repro",
                          restart_cut_slow_start=not a.no_restart)
    if a.role == "listen":
        with listen(a.ip, a.port, cfg) as lst:
            ch = lst.accept(timeout=60)
    else:
        deadline = time.time() + 30
        while True:
            try:
                ch = connect(a.ip, a.port, cfg)
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    socks = [s.sock for s in ch._streams]
    rx = threading.Thread(target=lambda: [ch.irecv(1).wait(120) for _ in range(a.tensors)], daemon=True)
    rx.start()
    x = torch.zeros(TENSOR, dtype=torch.uint8)
    prev = [_info(s) for s in socks]
    for k in range(a.tensors):
        delay = a.t0 + k * a.period + a.offset - time.time()
        if delay > 0:
            time.sleep(delay)
        t = time.time()
        ch.isend(x, 1).wait(60)
        took = time.time() - t
        cur = [_info(s) for s in socks]
        streams = [{**c, "sent": c["sent"] - p["sent"], "retrans": c["retrans"] - p["retrans"]}
                   for c, p in zip(cur, prev, strict=True)]
        print(json.dumps({"k": k, "took_s": took, "streams": streams}), flush=True)
        prev = cur
    rx.join(120)
    print(json.dumps({"end": True, "slow_start_restarts": ch.slow_start_restarts}), flush=True)
    ch.close(5)


def drive(a: argparse.Namespace) -> None:
    from testbed.emulation.network import Emulation

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = str(ROOT / ".venv" / "bin" / "python")
    with Emulation.from_file(ROOT / "topologies" / "2dc.yaml") as emu:
        for h in emu.hosts():  # as `testbed run` has them (runner.slow_start_after_idle: false)
            h.run(["sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"], check=True, timeout=10)
        t0 = time.time() + 12
        procs = []
        for i in range(2):
            near, far = emu.host("dc1", i), emu.host("dc2", i)
            for role, host, end in (("listen", far, "dc2"), ("connect", near, "dc1")):
                argv = [py, __file__, "--worker", role, "--ip", far.ip, "--port", str(7000 + i), "--t0", str(t0),
                        "--tensors", str(a.tensors), "--period", str(a.period), "--offset", str(i * a.period / 2)]
                if a.no_restart:
                    argv.append("--no-restart")
                procs.append(host.popen(argv, stdout=open(out / f"c{i}-{end}.jsonl", "w"),
                                        stderr=open(out / f"c{i}-{end}.err", "w"), cwd=str(ROOT)))
        for p in procs:
            p.wait(timeout=max(1.0, t0 - time.time()) + a.tensors * a.period + 60)
        for j, h in enumerate(emu.hosts()):
            r = h.run(["nstat", "-az", *NSTAT], timeout=10)
            (out / f"nstat-{h.dc}-{j}.txt").write_text(r.stdout)
    report(out)


def report(out: Path) -> None:
    for f in sorted(out.glob("c*-*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        sends = [r for r in rows if "k" in r]
        end = next((r for r in rows if r.get("end")), {})
        if not sends:
            print(f"{f.stem}: no tensors (see {f.with_suffix('.err')})")
            continue
        ms = [round(r["took_s"] * 1000) for r in sends]
        first, last = sends[0]["streams"], sends[-1]["streams"]
        print(f"{f.stem}: median {statistics.median(ms[1:]):.0f} ms, tensors {ms}; "
              f"ssthresh after the first {[s['ssthresh'] for s in first]}, peer window "
              f"{[s['peer_window'] // 1448 for s in first]} segments; cwnd at the end {[s['cwnd'] for s in last]}; "
              f"retransmitted {sum(s['retrans'] for r in sends for s in r['streams'])}; "
              f"restarts {end.get('slow_start_restarts')}")
    for f in sorted(out.glob("nstat-*.txt")):
        print(f.stem, " ".join(" ".join(line.split()[:2]) for line in f.read_text().splitlines()[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for the records")
    ap.add_argument("--tensors", type=int, default=30, help="tensors each end sends (default 30)")
    ap.add_argument("--period", type=float, default=0.3, help="seconds between one channel's tensors (default 0.3)")
    ap.add_argument("--no-restart", action="store_true", help="TransportConfig.restart_cut_slow_start off")
    ap.add_argument("--report", action="store_true", help="only print what --out holds")
    ap.add_argument("--worker", choices=("listen", "connect"), dest="role", help=argparse.SUPPRESS)
    for name, kind in (("--ip", str), ("--port", int), ("--t0", float), ("--offset", float)):
        ap.add_argument(name, type=kind, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        sys.path.insert(0, str(ROOT))
        worker(a)
    elif a.out is None:
        ap.error("--out DIR is needed")
    elif a.report:
        report(a.out)
    else:
        if os.geteuid() != 0:
            ap.error("builds the emulated 2dc network: run as root (sudo)")
        drive(a)


if __name__ == "__main__":
    main()
