"""README.md as the front door: short, its tour starting with `make demo` and `make test`,
and every relative link in it and in docs/ resolves (test_docs_commands.py checks every
command of every page). The results pages name kept
results that exist, and `docs/results/paper.md` gives every claim a command and a kept
result."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import check_command, shell_commands

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_README_LINES = 200
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def readme_commands(text: str) -> list[str]:
    """Every command line of a page's shell code blocks, `sudo` dropped."""
    return [line.removeprefix("sudo ") for block in shell_commands(text) for line in block]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; at most {MAX_README_LINES}"


def test_readme_names_the_two_commands_first():
    text = README.read_text()
    commands = readme_commands(text)
    assert commands[:2] == ["make demo", "make test"], commands[:2]


def test_readme_runs_read_only_commands_for_real():
    """The tour's commands that need no root and write nothing run here as written."""
    for line in readme_commands(README.read_text()):
        tokens = shlex.split(line)
        if Path(tokens[0]).name == "testbed" and tokens[1:3] == ["topo", "show"]:
            proc = subprocess.run([sys.executable, "-m", "testbed.cli", *tokens[1:]], capture_output=True,
                                  text=True, timeout=120, cwd=ROOT)
            assert proc.returncode == 0, f"{line!r}: {proc.stderr[-2000:]}"
            assert "WAN links" in proc.stdout


def _md_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", _md_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"


# ---------------------------------------------------------------------------- results pages


def _backticked_paths(text: str) -> list[str]:
    return [p for p in re.findall(r"`((?:results|docs)/[^`\s]*)`", text) if "<" not in p and "*" not in p]


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "results").glob("*.md")), ids=lambda p: p.name)
def test_results_page_names_kept_results_that_exist(page: Path):
    text = page.read_text()
    if page.name not in ("index.md", "paper.md"):
        for part in ("**The question.**", "**Kept result", "**The command"):
            assert part in text, f"{page.name}: no {part} section"
    for path in _backticked_paths(text):
        if path.startswith("results/") and ("-<" in path or path.rstrip("/").count("/") == 0):
            continue
        assert (ROOT / path).exists(), \
            f"{page.name}: {path} is not in the repository"


PAPER = ROOT / "docs" / "results" / "paper.md"
GLANCE = re.compile(r"<!-- glance -->\n(.*?)\n<!-- /glance -->", re.S)


def test_readme_results_are_paper_md_s_number_for_number():
    """One source: the README's results table is paper.md's "At a glance", links aside."""
    readme, paper = GLANCE.search(README.read_text()), GLANCE.search(PAPER.read_text())
    assert readme and paper, "README.md and docs/results/paper.md each need their <!-- glance --> table"
    ours = readme.group(1).replace("](docs/results/", "](")
    assert ours == paper.group(1), "README.md's results table differs from docs/results/paper.md's At a glance"
    rows = [r for r in paper.group(1).splitlines()[2:] if r.startswith("|")]
    assert len(rows) >= 6
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5 and all(cells), f"a glance row needs claim, paper, measured, conditions, page: {row}"
        assert re.search(r"\brun|repeat|predicted|model", cells[3]), f"conditions say how often it ran: {row}"


def test_every_path_paper_md_names_exists():
    text = PAPER.read_text()
    named = [p for p in re.findall(r"`([^`\s]+)`", text) if "/" in p and not p.startswith(("/", "-", "http"))
             and "<" not in p and not p.startswith(".venv/")]
    outputs = set(re.findall(r"--out (\S+?)`", text))
    missing = [p for p in named if p not in outputs and not any(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"docs/results/paper.md names what is not in the repository: {missing}"


def test_paper_page_gives_every_claim_a_command_and_a_kept_result():
    text = PAPER.read_text().split("## Every claim", 1)[1]
    rows = [line for line in text.split("\n\n", 2)[1].splitlines() if line.startswith("| ")
            and not line.startswith("| claim") and not line.startswith("|---")]
    assert len(rows) >= 8, f"expected a row per claim, got {len(rows)}"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 6, f"row with {len(cells)} cells: {row[:80]}"
        claim, paper, measured, command, kept, conditions = cells
        assert paper and measured and conditions, f"{claim}: empty cell"
        commands = re.findall(r"`([^`]+)`", command)
        assert commands, f"{claim}: no command"
        for cmd in commands:
            check_command(cmd)
        kept_paths = _backticked_paths(kept)
        assert kept_paths, f"{claim}: no kept result"
        for path in kept_paths:
            assert (ROOT / path).exists(), f"{claim}: kept result {path} is not in the repository"


@pytest.mark.parametrize("path", sorted((ROOT / "topologies").glob("*.yaml")) + sorted((ROOT / "scenarios").glob("*.yaml")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_file_is_documented(path: Path):
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert path.name in pages, f"{path.relative_to(ROOT)} is shipped but no page of docs/ mentions it"
