"""Every command the documentation gives runs as written: each shell block's and each
pasted inline command of README.md and docs/**/*.md parses against the real click CLI,
calls it one way (`.venv/bin/testbed`), and names files that are in the repository
(doc_commands.py says what is checked)."""

from __future__ import annotations

import pytest
from doc_commands import ROOT, check_command, inline_commands, named_commands, pages, shell_commands


def _cases() -> list[tuple[str, list[str]]]:
    cases = []
    for page in pages():
        text = page.read_text()
        rel = str(page.relative_to(ROOT))
        for n, block in enumerate(shell_commands(text)):
            cases.append((f"{rel}#block{n + 1}", block))
        spans = inline_commands(text) + named_commands(text)
        if spans:
            cases.append((f"{rel}#inline", [[s] for s in spans]))
    return cases


CASES = _cases()


@pytest.mark.parametrize("block", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_documented_commands_run_as_written(block) -> None:
    made: set[str] = set()
    errors = []
    for line in block:
        lines = line if isinstance(line, list) else [line]
        for one in lines:
            try:
                check_command(one, made if not isinstance(line, list) else set())
            except AssertionError as exc:
                errors.append(str(exc))
    assert not errors, "\n".join(errors)


def test_every_page_is_looked_at() -> None:
    names = {c[0].split("#")[0] for c in CASES}
    for page in ("README.md", "docs/getting-started.md", "docs/launch.md", "docs/results/paper.md"):
        assert page in names, f"{page}: no command found on it"
    assert sum(len(c[1]) for c in CASES) > 100


@pytest.mark.parametrize("bad, message", [
    ("testbed run scenarios/quickstart.yaml", "call the CLI as .venv/bin/testbed"),
    ("sudo testbed run scenarios/quickstart.yaml", "call the CLI as .venv/bin/testbed"),
    (".venv/bin/testbed no-such-command", "has no command 'no-such-command'"),
    (".venv/bin/testbed topo nope topologies/2dc.yaml", "`testbed topo` has no command 'nope'"),
    (".venv/bin/testbed run scenarios/no-such.yaml", "scenarios/no-such.yaml does not exist"),
    (".venv/bin/testbed run scenarios/quickstart.yaml --no-such-option", "`testbed run` has no option --no-such-option"),
    (".venv/bin/testbed run scenarios/quickstart.yaml --set workload.no_such=1", "workload.no_such"),
    (".venv/bin/testbed run", "`testbed run` needs SCENARIO_FILE"),
    (".venv/bin/testbed run scenarios/quickstart.yaml extra.yaml", "takes 1 argument(s)"),
    (".venv/bin/testbed plan --topology topologies/2dc.yaml", "`testbed plan` needs --workload"),
    (".venv/bin/testbed sweep scenarios/sweep-rtt.yaml --jobs 0", "--jobs 0"),
    (".venv/bin/testbed sweep scenarios/sweep-rtt.yaml --resume results/no-such-run", "does not exist"),
    (".venv/bin/testbed sweep scenarios/sweep-rtt.yaml --out", "--out needs a value"),
    ("make no-such-target", "no Makefile target"),
    (".venv/bin/testbed launch topologies/2dc.yaml -- .venv/bin/python examples/no-such.py", "examples/no-such.py"),
    (".venv/bin/python scripts/no-such.py", "scripts/no-such.py does not exist"),
    (".venv/bin/testbed whatif --grid scenarios/whatif-scale.yaml --out results/whatif-scale",
     "writes into results/whatif-scale, a kept result"),
    (".venv/bin/python scripts/bubbletea_runs.py --out results/bubbletea-ten-runs", "a kept result"),
    (".venv/bin/testbed run scenarios/quickstart.yaml --set 'variants=[baseline,no-such-variant]'", "no-such-variant"),
])
def test_the_check_is_real(bad: str, message: str) -> None:
    with pytest.raises(AssertionError, match=None) as info:
        check_command(bad)
    assert message in str(info.value), str(info.value)


def test_the_check_passes_what_runs() -> None:
    made: set[str] = set()
    for good in (".venv/bin/testbed run scenarios/quickstart.yaml --local --set transport.streams=4",
                 "sudo .venv/bin/testbed topo check topologies/2dc.yaml [--json] [--deep [--out DIR]] [--no-tcp]",
                 ".venv/bin/testbed whatif --grid scenarios/whatif-scale.yaml --out results/new-grid",
                 ".venv/bin/testbed report results/new-grid", ".venv/bin/testbed plan ... [--exact]",
                 "sudo .venv/bin/testbed launch topologies/2dc.yaml -- .venv/bin/python examples/ddp.py",
                 ".venv/bin/testbed run scenarios/quickstart.yaml --set 'variants=[baseline,atlas]'"):
        check_command(good, made)


def test_blocks_and_spans_are_found() -> None:
    text = ("Run `sudo .venv/bin/testbed run\nscenarios/atlas-2dc.yaml` or `testbed run` (a name).\n\n"
            "```sh\nmake install && sudo .venv/bin/testbed demo   # comment\n"
            ".venv/bin/testbed sweep a.yaml \\\n  --dry-run | head\n```\n\n```\noutput line results/x\n```\n")
    assert shell_commands(text) == [["make install", "sudo .venv/bin/testbed demo",
                                     ".venv/bin/testbed sweep a.yaml --dry-run", "head"]]
    assert inline_commands(text) == ["sudo .venv/bin/testbed run scenarios/atlas-2dc.yaml"]


def _reproductions() -> list[str]:
    """Every `testbed sweep` command of the results pages, as written."""
    found = []
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        text = page.read_text()
        lines = [line for block in shell_commands(text) for line in block] + inline_commands(text)
        found += [line for line in lines if " sweep " in line and "testbed" in line]
    return sorted(set(found))


@pytest.mark.parametrize("line", _reproductions())
def test_a_reproduction_on_a_clone_runs_its_points(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A results page's sweep, on a clone with the kept results, lists every point as to be
    run (its kept folder is never where it runs)."""
    import shlex

    from click.testing import CliRunner

    from testbed.cli import main

    monkeypatch.chdir(ROOT)
    args = shlex.split(line)
    args = args[args.index(next(a for a in args if a.endswith("testbed"))) + 1:]
    args = [a for a in args if a != "--keep"] + ["--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    points = result.stdout.splitlines()
    assert points and all(p.endswith("  to run") for p in points), f"{line}:\n{result.stdout}"
