"""A/B of atlas_transport's SO_RCVLOWAT on large reads, inside one loopback channel.

    .venv/bin/python scripts/rcvlowat_ab.py [--transfers 24] [--mark BYTES]

One stream, 256 MiB transfers; the receiving process alternates
`atlas_transport.sockets.RCVLOWAT_BYTES` between 0 (off) and the mark before each
transfer, so both settings see the same load drift. Prints, per setting, the median
goodput, both ends' CPU per GiB and the receiver's voluntary context switches per GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

import atlas_transport.sockets as S
from atlas_transport.config import TransportConfig
from atlas_transport.endpoints import connect, listen

SIZE = 256 << 20
GIB = SIZE / 2**30


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw


def serve(transfers: int, mark: int) -> None:
    cfg = TransportConfig(streams=1, secret="ab")
    with listen("127.0.0.1", 0, cfg) as lst:
        print(lst.port, flush=True)
        with lst.accept(timeout=30) as ch:
            buf = torch.zeros(SIZE, dtype=torch.uint8)
            rows = []
            for i in range(transfers + 2):  # the first two warm up
                S.RCVLOWAT_BYTES = mark if i % 2 else 0
                c0, s0 = _usage()
                ch.recv_into(buf, 1, timeout=120)
                c1, s1 = _usage()
                if i >= 2:
                    rows.append((S.RCVLOWAT_BYTES, c1 - c0, s1 - s0))
                ch.send(torch.ones(1), 2, timeout=120)
            print(json.dumps(rows), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transfers", type=int, default=24)
    ap.add_argument("--mark", type=int, default=S.RCVLOWAT_BYTES)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.transfers, a.mark)
        return 0
    srv = subprocess.Popen([sys.executable, __file__, "--serve", "--transfers", str(a.transfers),
                            "--mark", str(a.mark)], stdout=subprocess.PIPE, text=True)
    assert srv.stdout is not None
    port = int(srv.stdout.readline())
    data = torch.randint(0, 255, (SIZE,), dtype=torch.uint8)
    sent = []
    with connect("127.0.0.1", port, TransportConfig(streams=1, secret="ab")) as ch:
        for i in range(a.transfers + 2):
            c0, _ = _usage()
            t0 = time.perf_counter()
            ch.send(data, 1)
            dt = time.perf_counter() - t0
            c1, _ = _usage()
            if i >= 2:
                sent.append((dt, c1 - c0))
            ch.recv(2, timeout=120)
    rows = json.loads(srv.stdout.readline())
    srv.wait()
    for mark in (0, a.mark):
        sel = [(o, r) for o, r in zip(sent, rows, strict=True) if r[0] == mark]
        print(json.dumps({
            "rcvlowat": mark, "transfers": len(sel),
            "gbit_median": round(statistics.median(SIZE * 8 / o[0] / 1e9 for o, _ in sel), 2),
            "both_cpu_ms_per_gib": round(sum(r[1] + o[1] for o, r in sel) * 1e3 / (GIB * len(sel))),
            "receiver_vol_csw_per_gib_median": round(statistics.median(r[2] for _, r in sel) / GIB)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
