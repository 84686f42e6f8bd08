"""Duplex probe between two hosts of an emulated topology, as testbed's calibration does:
rank 1 sends a tensor every GAP s after the previous was confirmed, rank 0 hands one back as each
arrives. Writes /tmp/exp/lanprobe-<tag>-rank<r>.json."""
import json, os, sys, time
import torch
from atlas_transport import TransportConfig, listen, connect

N = int(os.environ.get("NBYTES", 1 << 20)); GAP = float(os.environ.get("GAP", "0.1"))
COUNT = int(os.environ.get("COUNT", "16")); STREAMS = int(os.environ.get("STREAMS", "1"))
TAG = os.environ.get("TAG", "x"); PORT = 47123
rank = int(os.environ["RANK"]); cfg = TransportConfig(secret="p", streams=STREAMS, pacing_rate_mbps=float(os.environ["PACE"]) if os.environ.get("PACE") else None)
out = {}
if rank == 0:
    with listen("0.0.0.0", PORT, cfg) as lst:
        ch = lst.accept(timeout=30)
        back = torch.zeros(N, dtype=torch.uint8)
        ch.irecv(9).wait(30); w = ch.isend(torch.zeros(N, dtype=torch.uint8), 9); w.wait(30)
        arr, rs, rets = [], [], []
        for k in range(COUNT):
            h = ch.irecv(1); h.wait(30); arr.append(h.completed_at)
            rs.append(time.monotonic()); rets.append(ch.isend(back, 2))
        for r in rets: r.wait(30)
        out = {"arrived": arr, "returned_sent": rs}
        time.sleep(1); ch.close(timeout=5)
else:
    for _ in range(100):
        try:
            ch = connect(os.environ["MASTER_ADDR"], PORT, cfg); break
        except Exception:
            time.sleep(0.1)
    w = ch.irecv(9); ch.isend(torch.zeros(N, dtype=torch.uint8), 9).wait(30); w.wait(30)
    comebacks = [ch.irecv(2) for _ in range(COUNT)]
    payload = torch.zeros(N, dtype=torch.uint8)
    sent = []
    for k in range(COUNT):
        time.sleep(GAP)
        sent.append(time.monotonic()); ch.isend(payload, 1).wait(30)
    got = []
    for r in comebacks:
        r.wait(30); got.append(r.completed_at)
    out = {"sent": sent, "returned": got}
    time.sleep(0.5); ch.close(timeout=5)
json.dump(out, open(f"/tmp/exp/lanprobe-{TAG}-rank{rank}.json", "w"))
