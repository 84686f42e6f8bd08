"""The README's comparison table of the prefill service, from a run's summary.json:

    python -m bubbletea_agent.controller.table results/<run>/summary.json

One Markdown row per +bubbletea variant (its dispatch mode): requests served of those that
arrived (and their share: the variants' arrival windows differ a little with their iteration
times), the mean prompt length of those served (a dispatch that serves short prompts first
serves more of them), rejected by reason, TTFT p50/p99 (seconds), training slowdown against
the plain twin, training's wait on prefill, and whether every request was accounted for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(summary: dict[str, Any]) -> str:
    rows = ["| variant | dispatch | served / arrived | tokens per served | rejected by reason | TTFT p50 | "
            "TTFT p99 | training slowdown | training waited on prefill | accounted |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in summary.get("variants", {}).items():
        svc = v.get("prefill_service")
        if not svc:
            continue
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(svc.get("rejected_by_reason", {}).items())) or "-"
        share = f" ({svc['served'] / svc['arrived']:.0%})" if svc.get("arrived") else ""
        tokens = v.get("prefill_tokens_served")
        per = tokens / svc["served"] if tokens is not None and svc.get("served") else None
        rows.append(
            f"| {name} | {svc['dispatch']} | {svc['served']} / {svc['arrived']}{share} | {_f(per, '.0f')} | {reasons} | "
            f"{_f(svc.get('ttft_p50_s'), '.3f')} s | {_f(svc.get('ttft_p99_s'), '.3f')} s | "
            f"{_f(v.get('training_slowdown'), '+.1%')} | {_f(v.get('training_wait_on_prefill_s'), '.3f')} s | "
            f"{'yes' if svc.get('accounted') else 'NO'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bubbletea_agent.controller.table <run>/summary.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{path}: cannot read the run's summary ({exc})", file=sys.stderr)
        return 1
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
