"""The timeline picture of one variant: where each GPU worked, where it sat idle, and
what was on the WAN at the time.

One row per device (forward, backward, prefill and other work in their colours, idle
time showing as the pale red band behind them) and one row per WAN link direction
(each transfer from its first byte sent to its last byte on the wire, one lane per
pipeline so overlapping transfers stay visible, a thin line for the one-way flight
after it). The measured iterations are shown, with their common starts (dashed) and
ends (solid); time is in seconds from the first measured start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.run.metrics import TransferRecord
    from testbed_core.contracts.summary import FaultRecord
    from testbed_core.device_records import WorkRecord

KIND_COLORS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "prefill": "#55a868",
    "decode": "#8172b3",
    "optimizer": "#937860",
    "allreduce": "#937860",
}
OTHER_COLOR = "#8c8c8c"
REVOKED_COLOR = "#d62728"  # a BubbleTea hold training took back at its deadline (testbed_runtime/device.py)
IDLE_COLOR = "#fbe3e1"
PIPELINE_COLORS = ("#2a9d8f", "#e76f51", "#264653", "#e9c46a", "#8ab17d", "#9d4edd", "#f4a261", "#457b9d")


FAULT_COLOR = "#c62828"
MAX_ITERATION_LABELS = 12  # more iterations than this: every k-th labelled


def _device_sort_key(name: str) -> tuple:
    # names are "<host>-p<d>r<r>": order by pipeline, then rank
    tail = name.rsplit("-", 1)[-1]
    if tail.startswith("p") and "r" in tail:
        d, _, r = tail[1:].partition("r")
        if d.isdigit() and r.isdigit():
            return (int(d), int(r), name)
    return (1 << 30, 0, name)


def gantt_png(
    timelines: Mapping[str, Sequence[WorkRecord]],
    transfers: Sequence[TransferRecord],
    starts: Sequence[float],
    ends: Sequence[float],
    warmup: int,
    path: str | Path,
    *,
    title: str = "",
    faults: Sequence[FaultRecord] = (),
) -> Path:
    """Draw the measured iterations of a variant to `path` (PNG). Each fault injected on
    purpose (`FaultRecord`s, testbed/run/faults.py) that happened is a shaded band over
    its duration (a line for an instant one, like a killed worker) with its label; the
    chart then starts early enough to show it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    first = min(warmup, len(starts) - 1)
    happened = [f for f in faults if getattr(f, "started", None) is not None]
    for f in happened:  # a fault during a warm-up iteration: start the chart there
        first = min([first, *(i for i in f.iterations if i < len(starts))])
    t0 = starts[first]
    t1 = max(ends[first:]) if ends else t0 + 1
    span = max(t1 - t0, 1e-6)
    devices = sorted(timelines, key=_device_sort_key)
    links = sorted({d for t in transfers for d in getattr(t, "links", ())})
    pipelines = sorted({t.pipeline for t in transfers}) or [0]
    rows = len(devices) + len(links)
    fig_h = 2.0 + 0.55 * rows
    fig, ax = plt.subplots(figsize=(16, fig_h))
    labels = []
    y = 0

    # WAN rows on top
    for link in links:
        ax.add_patch(plt.Rectangle((0, y - 0.42), span, 0.84, color="#f2f2f2", zorder=0))
        lanes = len(pipelines)
        h = 0.84 / lanes
        for t in transfers:
            if link not in t.links or t.sent is None:
                continue
            wire = t.wire_span
            if wire is None or wire[1] < t0 or wire[0] > t1:
                continue
            lane = pipelines.index(t.pipeline) if t.pipeline in pipelines else 0
            yl = y - 0.42 + lane * h
            color = PIPELINE_COLORS[t.pipeline % len(PIPELINE_COLORS)]
            ax.add_patch(plt.Rectangle((wire[0] - t0, yl + 0.08 * h), wire[1] - wire[0], 0.84 * h,
                                       facecolor=color, edgecolor="white", linewidth=0.4, zorder=2,
                                       alpha=0.9 if t.direction == "fwd" else 0.55))
            if t.arrived is not None and t.arrived > wire[1]:
                ax.plot([wire[1] - t0, t.arrived - t0], [yl + 0.5 * h] * 2, color=color, linewidth=0.8, zorder=1)
        labels.append(f"WAN {link}")
        y += 1

    # device rows
    revoked = False
    for name in devices:
        ax.add_patch(plt.Rectangle((0, y - 0.4), span, 0.8, color=IDLE_COLOR, zorder=0))
        for r in timelines[name]:
            if r.end < t0 or r.start > t1:
                continue
            color = KIND_COLORS.get(r.kind, OTHER_COLOR)
            ax.add_patch(plt.Rectangle((r.start - t0, y - 0.4), r.end - r.start, 0.8, facecolor=color,
                                       edgecolor="white", linewidth=0.3, zorder=2))
            if getattr(r, "revoked_at", None) is not None:  # BubbleTea: training took the device back here
                ax.plot([r.revoked_at - t0] * 2, [y - 0.45, y + 0.45], color=REVOKED_COLOR, linewidth=1.6, zorder=4)
                revoked = True
            if (r.end - r.start) / span > 0.012 and r.label:
                ax.text((r.start + r.end) / 2 - t0, y, r.label.split("@")[0].split(":")[0], ha="center", va="center",
                        fontsize=6, color="white", zorder=3)
        labels.append(name)
        y += 1

    every = max(1, math.ceil((len(starts) - first) / MAX_ITERATION_LABELS))  # a soak's 100 would overlap
    for i in range(first, len(starts)):
        ax.axvline(starts[i] - t0, color="#333333", linestyle="--", linewidth=0.8, zorder=4)
        if i < len(ends):
            ax.axvline(ends[i] - t0, color="#333333", linestyle="-", linewidth=0.8, zorder=4)
        if i < len(ends) and (i - first) % every == 0:
            ax.text((starts[i] + ends[i]) / 2 - t0, -0.62, f"iteration {i}: {ends[i] - starts[i]:.3f} s",
                    ha="center", va="center", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0}, zorder=5)

    for f in happened:
        a = f.started - t0
        b = (f.ended if f.ended is not None else t1) - t0
        if b - a > 1e-3:
            ax.axvspan(a, b, color=FAULT_COLOR, alpha=0.22, zorder=0.5)
        else:
            ax.axvline(a, color=FAULT_COLOR, linewidth=2.0, zorder=4)
        label = f.description.split(" at iteration")[0]
        if getattr(f, "transport_resumed_s", None) is not None:
            label += f"; transfers resumed {f.transport_resumed_s:.2f} s after"
        if getattr(f, "caught_done_s", None) is not None:
            label += f", those caught done {f.caught_done_s:.2f} s after"
        if f.recovery_s is not None:
            label += f"; next iteration done {f.recovery_s:.2f} s after"
        elif f.outcome == "failed":
            label += "; the run failed"
        ax.text(a, rows - 0.5, label, ha="left", va="bottom", fontsize=8, color=FAULT_COLOR,
                bbox={"facecolor": "white", "edgecolor": FAULT_COLOR, "pad": 1.5, "alpha": 0.9}, zorder=6)

    ax.set_yticks(range(rows))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(rows - 0.4, -0.9)
    ax.set_xlim(-0.01 * span, span * 1.01)
    ax.set_xlabel("seconds since the start of the first measured iteration")
    handles = [Patch(color=KIND_COLORS["forward"], label="forward"),
               Patch(color=KIND_COLORS["backward"], label="backward")]
    kinds = {r.kind for recs in timelines.values() for r in recs}
    handles += [Patch(color=KIND_COLORS.get(k, OTHER_COLOR), label=k) for k in sorted(kinds - {"forward", "backward"})]
    handles.append(Patch(color=IDLE_COLOR, label="idle (bubble)"))
    if revoked:
        handles.append(Patch(color=REVOKED_COLOR, label="prefill lease revoked by training"))
    if happened:
        handles.append(Patch(color=FAULT_COLOR, alpha=0.3, label="fault injected on purpose"))
    if links:
        handles += [Patch(color=PIPELINE_COLORS[d % len(PIPELINE_COLORS)], label=f"WAN transfer, pipeline {d}")
                    for d in pipelines]
        handles.append(Patch(facecolor="#999999", alpha=0.55, label="(pale: gradients)"))
    legend_h = 0.45  # inches at the bottom for the legend
    fig.legend(handles=handles, loc="lower center", ncol=min(8, len(handles)), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout(rect=(0, legend_h / fig_h, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
