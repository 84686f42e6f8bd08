"""The CLI reference, generated at build time from the click commands (docs/hooks.py):
every command there, real defaults (never click's `Sentinel.UNSET`), required options
marked, epilogs kept, tables whose rows have their header's cells."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import click
import pytest
from doc_commands import ROOT
from md_tables import bad_rows

from testbed.cli import main


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_hooks"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(hooks) -> str:
    return hooks.cli_markdown(main, "testbed")


def _commands(group: click.Group, path: str) -> list[str]:
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        out.append(f"{path} {name}")
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{path} {name}")
    return out


def test_the_page_asks_for_the_generated_reference(hooks) -> None:
    assert hooks.CLI_MARK in (ROOT / "docs" / "reference" / "cli.md").read_text()


def test_every_command_is_there(reference) -> None:
    commands = _commands(main, "testbed")
    assert "testbed topo show" in commands
    for name in commands:
        assert f"\n{'#' * (name.count(' ') + 2)} {name}\n" in reference, f"{name} is not in the CLI reference"


def test_defaults_required_options_and_epilogs(reference) -> None:
    assert "Sentinel" not in reference and "N/A" not in reference
    plan = reference.split("\n### testbed plan\n", 1)[1].split("\n### ", 1)[0]
    assert "| `--topology` `FILE` | **required** |" in plan
    assert "| `--baseline-placement` `{atlas, in-order, even, round-robin}` | even |" in plan
    assert "**Variants:**" in plan and "dp-across-dc:" in plan
    launch = reference.split("\n### testbed launch\n", 1)[1].split("\n### ", 1)[0]
    assert "**Examples:**" in launch and "OMP_NUM_THREADS=1 and PYTHONUNBUFFERED=1" in launch
    assert "| `--nproc-per-host` `N` | 1 |" in launch
    assert "(range 1&lt;=x&lt;=65535)" in launch  # escaped, not an HTML tag
    sweep = reference.split("\n### testbed sweep\n", 1)[1].split("\n### ", 1)[0]
    assert "| `--jobs`, `-j` `INTEGER RANGE` | 1 |" in sweep
    assert "--runner" not in sweep  # hidden
    assert "| `--set` `PATH=VALUE` |  |" in sweep and "(repeatable)" in sweep


def test_tables_render(reference) -> None:
    assert not bad_rows(reference)


def test_a_new_command_is_picked_up(hooks) -> None:
    @click.group()
    def tool() -> None:
        """A tool."""

    @tool.command(epilog="\b\nNotes:\n  one | two")
    @click.option("--mode", type=click.Choice(["a", "b"]), required=True, help="the <mode>")
    @click.option("--n", type=int, default=3, show_default=True)
    def new(mode: str, n: int) -> None:
        """Does new things."""

    text = hooks.cli_markdown(tool, "tool")
    assert "\n### tool new\n" in text and "Does new things." in text
    assert "| `--mode` `{a, b}` | **required** | the &lt;mode&gt; |" in text
    assert "| `--n` `INTEGER` | 3 |" in text
    assert "**Notes:**\n\n```text\none | two\n```" in text


def _options_without_help(group: click.Group, path: str) -> set[tuple[str, str]]:
    ctx = click.Context(group)
    out = set()
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        if isinstance(cmd, click.Group):
            out |= _options_without_help(cmd, f"{path} {name}")
        out |= {(f"{path} {name}", p.opts[0]) for p in cmd.params
                if isinstance(p, click.Option) and not p.hidden and not p.help}
    return out


def test_every_option_has_a_help_text() -> None:
    # the CLI reference shows each option's help as its description: a new option comes with one
    new = _options_without_help(main, "testbed")
    assert not new, f"options without help=...: {sorted(new)}; the CLI reference shows their description"
