"""A/B of atlas_transport's zero-copy sends (vmsplice + splice) against sendmsg, on
loopback, one stream, both settings alternated so they see the same load drift.

    .venv/bin/python scripts/zero_copy_ab.py [--rounds 4] [--size-mib 256]

Each round opens one channel per setting (`TransportConfig.zero_copy` False, then
True) and times 3 transfers into a pre-posted, reused destination after one warm-up.
Prints each round's goodputs, then per setting the median goodput and the CPU both
ends (one process) spent per GiB, and the ratio; `--json` prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from atlas_transport import TransportConfig
from atlas_transport.loopback import loopback_pair


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    n = a.size_mib << 20
    x = torch.randint(0, 255, (n,), dtype=torch.uint8)
    rate: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for r in range(a.rounds):
        for zero_copy in (False, True):
            cfg = TransportConfig(streams=1, secret="ab", zero_copy=zero_copy)
            with loopback_pair(cfg) as (tx, rx):
                dst = torch.zeros(n, dtype=torch.uint8)
                for i in range(4):
                    h = rx.irecv_into(dst, 1)
                    c0, t0 = os.times(), time.perf_counter()
                    tx.send(x, 1, timeout=60)
                    h.wait(60)
                    dt, c1 = time.perf_counter() - t0, os.times()
                    if i:  # the first transfer warms the channel (chunk size, page tables)
                        rate[zero_copy].append(n * 8 / dt / 1e9)
                        cpu[zero_copy].append((c1.user + c1.system - c0.user - c0.system) / (n / 2**30) * 1e3)
                spliced = sum(s.pages.spliced_bytes for s in tx._streams)
                if not torch.equal(dst, x):
                    raise SystemExit("the received tensor differs from the sent one")
            if not a.json:
                name = "zero-copy" if zero_copy else "sendmsg  "
                print(f"round {r + 1} {name} Gbit/s {[round(v, 1) for v in rate[zero_copy][-3:]]}"
                      f" (spliced {spliced >> 20} MiB)", flush=True)
    out = {("zero_copy" if z else "sendmsg"): {"gbit_s": round(statistics.median(rate[z]), 1),
                                               "cpu_ms_per_gib": round(statistics.median(cpu[z]))}
           for z in (False, True)}
    out["ratio"] = round(out["zero_copy"]["gbit_s"] / out["sendmsg"]["gbit_s"], 2)
    if a.json:
        print(json.dumps(out))
    else:
        for k in ("sendmsg", "zero_copy"):
            print(f"{k}: median {out[k]['gbit_s']} Gbit/s, {out[k]['cpu_ms_per_gib']} ms CPU per GiB (both ends)")
        print(f"zero-copy / sendmsg: {out['ratio']}x")


if __name__ == "__main__":
    main()
