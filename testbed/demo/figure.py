"""demo.png: the three results side by side, drawn from the table's rows alone.

Transport goodput bars (with the nominal link rate), iteration time bars per variant
in the registry's colours (testbed_core/variants.py) with Atlas's speedup, and device
utilization without and with BubbleTea (the training share of the latter shaded) with
the slowdown it cost. A result without figures draws its panel as n/a, with why.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.demo.rows import PAPER_UTILIZATION, SLOWDOWN_LIMIT, Row, find
from testbed_core.variants import colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PREFILL_COLOUR = "#2ca02c"  # BubbleTea's prefill work on top of training


def _na(ax: Axes, title: str, why: str) -> None:
    ax.set_title(title, fontsize=11)
    ax.text(0.5, 0.5, "n/a\n" + textwrap.fill(why or "not measured", 40), ha="center", va="center",
            fontsize=10, color="0.35", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _bars(ax: Axes, labels: list[str], values: list[float | None], colors: list[str], fmt: str) -> None:
    xs = list(range(len(labels)))
    heights = [float("nan") if v is None else v for v in values]
    bars = ax.bar(xs, heights, 0.62, color=colors, edgecolor="0.2", linewidth=0.6)
    top = max((h for h in heights if not math.isnan(h)), default=1.0)
    for bar, h in zip(bars, heights, strict=True):
        x = bar.get_x() + bar.get_width() / 2
        if math.isnan(h):
            ax.text(x, top * 0.03, "n/a", ha="center", va="bottom", fontsize=9, color="0.4")
        else:
            ax.annotate(fmt.format(h), (x, h), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=10, fontweight="bold")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot(rows: Sequence[Row], path: Path, *, streams: int = 8, link_mbps: float | None = None,
         subtitle: str = "") -> Path:
    """Three panels, one per result: goodput bars (with the nominal link rate),
    iteration time bars (with Atlas's speedup), utilization without/with BubbleTea
    (with the slowdown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6))

    # 1: transport
    ax = axes[0]
    title = f"1. Transport goodput across the WAN ({streams} streams)"
    picks = [("atlas, 1 stream", "atlas\n1 stream", "#9ecae1"),
             ("iperf3 -P 1", "iperf3\n-P 1", "#d9d9d9"),
             (f"atlas, {streams} streams", f"atlas\n{streams} streams", "#1f77b4"),
             (f"iperf3 -P {streams}", f"iperf3 -P {streams}\n(the link)", "#7f7f7f")]
    found = [(lab, find(rows, "transport", key), c) for key, lab, c in picks]
    found = [(lab, r, c) for lab, r, c in found if r is not None]
    if not any(r.value is not None for _, r, _ in found):
        _na(ax, title, next((r.note for _, r, _ in found if r.note), ""))
    else:
        _bars(ax, [lab for lab, _, _ in found], [r.value for _, r, _ in found], [c for _, _, c in found],
              "{:.0f}")
        if link_mbps:
            ax.axhline(link_mbps, color="0.3", linestyle=(0, (5, 3)), linewidth=1.2)
            ax.annotate(f"link rate {link_mbps:g} Mbit/s", xy=(0.99, link_mbps), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", ha="right", fontsize=9, color="0.25")
        top = max([r.value or 0 for _, r, _ in found] + [link_mbps or 0])
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel("goodput (Mbit/s)")
        ratios = [r for r in rows if r.result == "transport" and r.unit == "x" and r.value is not None]
        if ratios:
            ax.text(0.02, 0.97, "\n".join(f"{r.measure}: {r.shown()}" for r in ratios), transform=ax.transAxes,
                    va="top", fontsize=9, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        ax.set_title(title, fontsize=11)

    # 2: training
    ax = axes[1]
    title = "2. Training iteration time (lower is better)"
    names = ("baseline", "multi-tcp", "atlas")
    it = [(n, find(rows, "training", f"{n} iteration time")) for n in names]
    it = [(n, r) for n, r in it if r is not None and (r.value is not None or n != "multi-tcp")]
    if not any(r.value is not None for _, r in it):
        _na(ax, title, next((r.note for _, r in it if r.note), ""))
    else:
        _bars(ax, [n for n, _ in it], [r.value for _, r in it], [colour(n) for n, _ in it], "{:.2f} s")
        top = max(r.value or 0 for _, r in it)
        ax.set_ylim(0, top * 1.2)
        ax.set_ylabel("seconds per iteration")
        sp = find(rows, "training", "atlas / baseline")
        if sp is not None and sp.value:
            ax.text(0.98, 0.97, f"Atlas {1 / sp.value:.2f}x faster than baseline", transform=ax.transAxes,
                    ha="right", va="top", fontsize=10,
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        ax.set_title(title, fontsize=11)

    # 3: BubbleTea
    ax = axes[2]
    title = "3. Device utilization with BubbleTea"
    u0 = find(rows, "bubbletea", "utilization without")
    u1 = find(rows, "bubbletea", "utilization with ")
    sd = find(rows, "bubbletea", "training slowdown")
    if u0 is None or u1 is None or (u0.value is None and u1.value is None):
        _na(ax, title, (u1.note if u1 else "") or (u0.note if u0 else ""))
    else:
        tr = find(rows, "bubbletea", "  of which training")
        _bars(ax, ["atlas\nwithout BubbleTea", "atlas\nwith BubbleTea"], [u0.value, u1.value],
              [colour("atlas"), PREFILL_COLOUR], "{:.0%}")
        if tr is not None and tr.value is not None:  # the training share of the BubbleTea bar
            ax.bar([1], [tr.value], 0.62, color=colour("atlas"), edgecolor="0.2", linewidth=0.6)
            ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colour("atlas"), label="training work"),
                               plt.Rectangle((0, 0), 1, 1, color=PREFILL_COLOUR, label="prefill (BubbleTea)")],
                      loc="upper right", bbox_to_anchor=(1.0, 0.86), fontsize=9)
        ax.axhline(PAPER_UTILIZATION, color="0.3", linestyle=(0, (5, 3)), linewidth=1.2)
        ax.annotate(f"paper: up to {PAPER_UTILIZATION:.0%}", xy=(0.99, PAPER_UTILIZATION),
                    xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points", fontsize=9,
                    ha="right", color="0.25")
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylabel("mean device utilization (busy / wall time)")
        if sd is not None:
            txt = (f"training slowdown {sd.shown()} (limit {SLOWDOWN_LIMIT:+.0%})" if sd.value is not None
                   else f"training slowdown n/a: {textwrap.shorten(sd.note, 50)}")
            ax.text(0.02, 0.86, txt, transform=ax.transAxes, va="top", fontsize=10,
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        if u1.value is None:
            ax.text(0.75, 0.5, textwrap.fill(u1.note, 28), transform=ax.transAxes, ha="center", fontsize=8,
                    color="0.35")
        ax.set_title(title, fontsize=11)

    fig.suptitle("Geo-distributed training testbed: the three results" + (f" ({subtitle})" if subtitle else ""),
                 fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


