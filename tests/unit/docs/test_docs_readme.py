"""README.md as the front door: short, every command in it runs as written on a fresh
clone, and every relative link in it and in docs/ resolves. The results pages name kept
results that exist, and `docs/results/paper.md` gives every claim a command and a kept
result."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from testbed.run.scenario import load_scenario, parse_set_options

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_README_LINES = 200
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
GROUPS = {"topo", "bench"}  # commands whose first argument is a subcommand


def readme_commands(text: str) -> list[str]:
    """Every command line of the README's sh code blocks, comments and `sudo` dropped."""
    out = []
    for lang, body in FENCE.findall(text):
        if lang not in ("sh", "bash", "console", ""):
            continue
        for line in body.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line.removeprefix("sudo ").strip())
    return out


@cache
def _help(*words: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", *words, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, f"testbed {' '.join(words)} --help exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


OUTPUT_OPTIONS = {"--out"}  # their value is made by the command


def _paths_named(tokens: list[str]) -> list[str]:
    outputs = {i + 1 for i, t in enumerate(tokens) if t in OUTPUT_OPTIONS}
    return [t for i, t in enumerate(tokens) if i not in outputs and "/" in t and not t.startswith("-")
            and "<" not in t and "=" not in t and "://" not in t]


def check_command(line: str) -> None:
    """The command's program and subcommand exist, its options are the command's own,
    every file it names is there, and its --set overrides apply to its scenario."""
    tokens = shlex.split(line)
    prog, args = tokens[0], tokens[1:]
    if prog == "make":
        missing = set(args) - _make_targets()
        assert not missing, f"{line!r}: no Makefile target {sorted(missing)}"
        return
    head = [prog]
    if "--" in args:  # testbed launch ... -- PROGRAM ARGS: the program's own files must be there too
        cut = args.index("--")
        args, program = args[:cut], args[cut + 1:]
        assert program, f"{line!r}: nothing after --"
        head += program
    for path in _paths_named(head + args):
        if path.startswith(".venv/") and not (ROOT / ".venv").is_dir():
            continue  # installed by `make install`
        assert (ROOT / path).exists(), f"{line!r}: {path} does not exist in the repository"
    if Path(prog).name != "testbed":
        return
    words = [args[0]] + ([args[1]] if args[0] in GROUPS and len(args) > 1 else [])
    text = _help(*words)
    for opt in (t.split("=", 1)[0] for t in args if t.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), \
            f"{line!r}: testbed {' '.join(words)} has no option {opt}"
    sets = [args[i + 1] for i, t in enumerate(args) if t == "--set" and i + 1 < len(args)]
    if sets and words[0] == "run":
        load_scenario(ROOT / args[1], parse_set_options(sets))


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; at most {MAX_README_LINES}"


def test_readme_names_the_two_commands_first():
    text = README.read_text()
    commands = readme_commands(text)
    assert commands[:2] == ["make demo", "make test"], commands[:2]


@pytest.mark.parametrize("line", readme_commands(README.read_text()))
def test_readme_command_runs_as_written(line):
    check_command(line)


def test_the_command_check_is_real():
    for bad in ("testbed no-such-command", "testbed run scenarios/no-such.yaml",
                "testbed run scenarios/quickstart.yaml --no-such-option",
                "testbed run scenarios/quickstart.yaml --set workload.no_such=1", "make no-such-target",
                "testbed launch topologies/2dc.yaml -- .venv/bin/python examples/no-such.py"):
        with pytest.raises((AssertionError, ValueError)):
            check_command(bad)


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
        assert (ROOT / path).exists() or path.startswith("results/whatif-scale"), \
            f"{page.name}: {path} is not in the repository"


def test_paper_page_gives_every_claim_a_command_and_a_kept_result():
    text = (ROOT / "docs" / "results" / "paper.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| claim")
            and not line.startswith("|---")]
    assert len(rows) >= 8, f"expected a row per claim, got {len(rows)}"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 6, f"row with {len(cells)} cells: {row[:80]}"
        claim, paper, measured, command, kept, conditions = cells
        assert paper and measured and conditions, f"{claim}: empty cell"
        commands = re.findall(r"`([^`]+)`", command)
        assert commands, f"{claim}: no command"
        for cmd in commands:
            check_command(cmd.removeprefix("sudo ").replace("testbed ", ".venv/bin/testbed ", 1))
        kept_paths = _backticked_paths(kept)
        assert kept_paths, f"{claim}: no kept result"
        for path in kept_paths:
            assert (ROOT / path).exists(), f"{claim}: kept result {path} is not in the repository"


@pytest.mark.parametrize("path", sorted((ROOT / "topologies").glob("*.yaml")) + sorted((ROOT / "scenarios").glob("*.yaml")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_file_is_documented(path: Path):
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert path.name in pages, f"{path.relative_to(ROOT)} is shipped but no page of docs/ mentions it"


TOUR_PAGES = ("getting-started.md", "launch.md")


@pytest.mark.parametrize("line", [line for page in TOUR_PAGES
                                  for line in readme_commands((ROOT / "docs" / page).read_text())])
def test_tour_command_runs_as_written(line):
    """The tour's and the launch page's commands are checked as the README's are."""
    check_command(line)
