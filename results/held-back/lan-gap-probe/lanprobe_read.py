import json, sys, statistics as st
tag = sys.argv[1]
a = json.load(open(f"/tmp/exp/lanprobe-{tag}-rank0.json")); b = json.load(open(f"/tmp/exp/lanprobe-{tag}-rank1.json"))
fwd = [(x - s) * 1e3 for s, x in zip(b["sent"], a["arrived"])][2:]
bwd = [(x - s) * 1e3 for s, x in zip(a["returned_sent"], b["returned"])][2:]
print(f"{tag}: fwd median {st.median(fwd):.2f} ms [{' '.join(f'{x:.1f}' for x in fwd)}]  bwd median {st.median(bwd):.2f} ms [{' '.join(f'{x:.1f}' for x in bwd)}]")
