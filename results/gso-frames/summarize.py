"""Print the table of results/gso-frames/README.md from the kept runs beside it:
    .venv/bin/python results/gso-frames/summarize.py"""

import json
from pathlib import Path

HERE = Path(__file__).parent
RUNS = {"q2": 2, "q44": 44, "c2": 2, "c44": 44, "a1": 2, "t16": 16, "t16b": 16, "t44": 44}

print("| run | scenario | tcp_min_tso_segs | variant | measured s | predicted s | run cores | WAN frames | bytes a frame | tail drops |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, segs in RUNS.items():
    summary = json.loads((HERE / name / "summary.json").read_text())
    for variant, v in summary["variants"].items():
        lines = [s for dirs in v["delay_line"].values() if isinstance(dirs, dict)
                 for s in dirs.values() if isinstance(s, dict)]
        frames = sum(s["rx_frames"] for s in lines)
        nbytes = sum(s["rx_bytes"] for s in lines)
        drops = sum(s["queue_drops"] for s in lines)
        measured, predicted = v["iteration_time_s"], v["predicted_iteration_time_s"]
        print(f"| {name} | {summary['scenario']} | {segs} | {variant} | {measured:.3f} | {predicted:.3f} | "
              f"{v['machine_cpu']['run_cores']:.2f} | {frames} | {nbytes // max(1, frames)} | {drops} |")
