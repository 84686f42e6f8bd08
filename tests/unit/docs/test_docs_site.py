"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor, a
page missing from the navigation, a failed include or reference fails it), offline, and
what it built renders: no `Sentinel` (click's internal default leaking into the CLI
reference), no `N/A`, no empty description in a format reference (the CLI's options:
test_docs_cli.py), and every table row with as many cells as its header (`html_problems`)."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may carry !!python/name tags; this test reads only plain keys."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


class _Tables(HTMLParser):
    """The tables of one HTML page: per table its header cells and its rows' cells (text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def html_problems(page: str, html: str) -> list[str]:
    """What renders wrong in one built page (see the module's docstring)."""
    problems = []
    if "Sentinel" in html:
        problems.append(f"{page}: 'Sentinel' (a click default that is not one)")
    parser = _Tables()
    parser.feed(html)
    for table in parser.tables:
        if not table:
            continue
        header = [c.lower() for c in table[0]]
        for row in table[1:]:
            if len(row) != len(header):
                problems.append(f"{page}: a row of {len(row)} cells under a header of {len(header)}: {row[:3]}")
            if "n/a" in (c.lower() for c in row):
                problems.append(f"{page}: N/A in {row[:2]}")
            if page.startswith("reference/formats/") and header[-1] == "description" and row and not row[-1]:
                problems.append(f"{page}: no description for {row[0]}")
    return problems


def test_the_html_check_is_real():
    good = "<table><tr><th>field</th><th>description</th></tr><tr><td>a</td><td>what a is</td></tr></table>"
    assert html_problems("reference/formats/x.html", good) == []
    bad = ("<p>Sentinel.UNSET</p><table><tr><th>field</th><th>description</th></tr>"
           "<tr><td>a</td><td></td></tr><tr><td>b</td><td>N/A</td></tr><tr><td>c</td></tr></table>")
    assert len(html_problems("reference/formats/x.html", bad)) == 4


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def test_site_is_built_offline():
    config = _config()
    assert config["theme"]["name"] == "material"
    assert config["theme"].get("font") is False, "theme.font must be false: no web fonts fetched at build time"
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])]
    for fetching in ("social", "privacy", "optimize"):
        assert not any(p.endswith(fetching) for p in plugins), f"plugin {fetching} downloads at build time"
    assert config.get("strict") is True


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{out[-4000:]}"
    assert "WARNING" not in out, out[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "results/paper.html", "reference/cli.html", "reference/api.html",
                 "reference/formats/scenario.html"):
        assert (site / page).is_file(), f"{page} not built"
    cli = (site / "reference" / "cli.html").read_text()
    assert "testbed run" in cli and "--set" in cli, "the CLI reference did not come from the click commands"
    api = (site / "reference" / "api.html").read_text()
    assert "TransportConfig" in api and "streams" in api, "the Python API did not come from the docstrings"
    atlas = (site / "atlas.html").read_text()
    assert "Wire protocol" in atlas, "atlas_transport/README.md was not included"
    problems = [p for html in sorted(site.rglob("*.html"))
                for p in html_problems(str(html.relative_to(site)), html.read_text())]
    assert not problems, "\n".join(problems)[:4000]
    paper = (site / "results" / "sweep-paper.html").read_text()
    assert 'src="../repo/results/sweep-paper/atlas_speedup.png"' in paper
    assert (site / "repo" / "results" / "sweep-paper" / "atlas_speedup.png").is_file()
