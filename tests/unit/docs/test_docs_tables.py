"""Every Markdown table of README.md, docs/ and the generated CLI reference has rows with
as many cells as its header (an enum's pipes escaped twice split its rows and pushed
the default and the description out of them)."""

from __future__ import annotations

import pytest
from doc_commands import ROOT, pages
from md_tables import bad_rows, row_cells


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_table_rows_have_their_headers_cells(page) -> None:
    bad = bad_rows(page.read_text())
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_the_cell_count_is_real() -> None:
    assert row_cells("| `a` | `\"x\"` \\| `\"y\"` | c |") == ["`a`", "`\"x\"` \\| `\"y\"`", "c"]
    assert row_cells("| `a|b` | c |") == ["`a|b`", "c"]
    assert len(row_cells("| `a` | `\"x\"` \\\\| `\"y\"` | c |")) == 4  # escaped twice: the row splits
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 \\\\| 2 | 3 |\n"
    assert bad_rows(table) == ["3 cells, header 2: | 1 \\\\| 2 | 3 |"]
