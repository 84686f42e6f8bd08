"""Markdown tables as Python-Markdown's `tables` extension reads them: a row splits on a
pipe that is neither escaped (an odd number of backslashes before it) nor inside a code
span; `row_cells` counts them, so that a test can fail on a row whose cells do not match
its header (Python-Markdown pads or drops cells silently, so the built HTML cannot tell)."""

from __future__ import annotations

import re

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.S | re.M)
SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def row_cells(line: str) -> list[str]:
    """The cells of one table row."""
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    cells, current, i, code = [], [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if ch == "`":
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            if code == 0 and text.find("`" * run, i + run) != -1:
                code = run
            elif code == run:
                code = 0
            current.append("`" * run)
            i += run
            continue
        if ch == "|" and not code:
            cells.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    tail = "".join(current).strip()
    if tail or not line.rstrip().endswith("|"):
        cells.append(tail)
    return cells


def bad_rows(text: str) -> list[str]:
    """Rows of `text`'s tables whose cell count differs from their header's."""
    bad = []
    lines = FENCE.sub("", text).splitlines()
    for n, line in enumerate(lines):
        if n == 0 or not SEPARATOR.match(line) or "|" not in lines[n - 1]:
            continue
        width = len(row_cells(lines[n - 1]))
        for row in lines[n + 1:]:
            if "|" not in row or not row.strip():
                break
            if len(row_cells(row)) != width:
                bad.append(f"{len(row_cells(row))} cells, header {width}: {row[:120]}")
    return bad
