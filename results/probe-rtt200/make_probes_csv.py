"""Rebuild probes.csv from the kept runs' summaries: python3 make_probes_csv.py (in this folder)."""

import csv
import json

PROBE = {**{r: "cold one-way, 3 untimed (29684143)" for r in "abc"}, **{r: "duplex, 3 untimed" for r in "de"},
         **{r: "duplex, 8 untimed (a23fa57a)" for r in "fghij"},
         **{r: "probes clamped 512 KiB (experiment)" for r in "kl"},
         **{r: "probes clamped 600 KB (experiment)" for r in "mn"},
         **{r: "probes and run clamped 512 KiB (experiment)" for r in "op"}}

rows = []
for r in "abcdefghijklmnop":
    s = json.load(open(f"runs/rtt200-{r}.summary-record.json"))
    rates = s["calibration"]["channel_rate_mbps"]
    for name, v in s["variants"].items():
        rows.append(dict(run=f"rtt200-{r}", probe=PROBE[r], stream1_mbps=round(rates.get("1", 0), 1),
                         stream8_mbps=round(rates.get("8", 0), 1),
                         stream32_mbps=round(rates["32"], 1) if "32" in rates else "", variant=name,
                         streams=v["streams"], sharing=v["sharing"], predicted_s=round(v["predicted_iteration_time_s"], 3),
                         measured_s=round(v["iteration_time_s"], 3), error=f"{v['prediction_error']:+.1%}",
                         mean_wan_transfer_s=round(v["mean_wan_transfer_s"], 3)))
with open("probes.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
