"""The demo's folder: writing demo.json, demo.csv, demo.txt and demo.png, and
rebuilding the table from the folder alone (`load_rows`), no live system needed."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.demo.figure import plot
from testbed.demo.rows import Row, build_rows, format_table
from testbed.progress import format_duration
from testbed.report.loading import read_json, read_model_file, read_summary_file
from testbed_core.atomic import write_text_atomic
from testbed_core.contracts.demo import DemoDoc, DemoMeta


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


def _read_json(path: Path) -> Any:
    return read_json(path, lambda exc: DemoError(f"{path}: cannot be read as JSON ({exc})"))


def load_rows(out: Path) -> tuple[list[Row], DemoMeta]:
    """The demo table rebuilt from a demo folder: `transport/results.json`,
    `quickstart/summary.json` and the notes kept in `demo.json`."""
    out = Path(out)
    doc = read_model_file(out / "demo.json", DemoDoc, "the demo.json of a `testbed demo`", DemoError)
    meta = doc.meta if doc is not None else DemoMeta()
    notes = meta.notes
    bench_doc = _read_json(out / "transport" / "results.json")
    summary = read_summary_file(out / "quickstart" / "summary.json", DemoError)
    if bench_doc is None and summary is None and doc is None:
        raise DemoError(f"{out}: no demo results here (expected transport/results.json or quickstart/summary.json)")
    rows = build_rows(
        None if bench_doc is None else bench_doc.get("results"), summary,
        streams=meta.streams, link_mbps=meta.link_mbps,
        bench_note=notes.get("transport", "" if bench_doc else "no transport/results.json"),
        run_note=notes.get("training", "" if summary is not None else "no quickstart/summary.json"),
        bubbletea_note=notes.get("bubbletea", ""),
    )
    return rows, meta


CSV_FIELDS = ["result", "measure", "value", "unit", "shown", "target", "verdict", "note"]


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """demo.csv: one line per row, the value unrounded beside how the table shows it."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r.record().model_dump(), "value": "" if r.value is None else f"{r.value:.6g}"})


def write_json(rows: Sequence[Row], meta: DemoMeta, path: Path) -> None:
    """demo.json: the rows and what the demo ran (`meta`, with the notes `load_rows` needs)."""
    doc = DemoDoc(rows=[r.record() for r in rows], meta=meta)
    write_text_atomic(path, json.dumps(doc.model_dump(), indent=2, default=str) + "\n")


def subtitle(meta: DemoMeta) -> str:
    """'2dc, 1000 Mbit/s WAN, 50 ms RTT, delay: relay': what the results were measured on."""
    parts = []
    topo = Path(meta.topology or "").stem
    if topo:
        parts.append(topo)
    if meta.link_mbps:
        parts.append(f"{meta.link_mbps:g} Mbit/s WAN")
    if meta.rtt_ms:
        parts.append(f"{meta.rtt_ms:g} ms RTT")
    if meta.delay_backend:
        parts.append(f"delay: {meta.delay_backend}")
    return ", ".join(parts)


def write_outputs(rows: Sequence[Row], meta: DemoMeta, out: Path) -> list[Path]:
    """demo.json, demo.csv, demo.txt (the table) and demo.png in `out`."""
    out = Path(out)
    write_json(rows, meta, out / "demo.json")
    write_csv(rows, out / "demo.csv")
    head = f"testbed demo ({subtitle(meta)})" if subtitle(meta) else "testbed demo"
    if meta.duration_s is not None:
        head += f", {format_duration(meta.duration_s)}"
    (out / "demo.txt").write_text(head + "\n\n" + format_table(rows) + "\n")
    plot(rows, out / "demo.png", streams=meta.streams, link_mbps=meta.link_mbps,
         subtitle=subtitle(meta))
    return [out / "demo.json", out / "demo.csv", out / "demo.txt", out / "demo.png"]

