"""MkDocs hooks.

Links: the pages link the repository's own files (kept results under `results/`, source
files, the package READMEs' folders) with relative paths that work on a clone; the site
gets a copy of each linked file under `repo/` and the links are rewritten to it. A link
to a file that does not exist stays as written, so the strict build reports it.

The CLI reference: the line `<!-- testbed-cli -->` of a page becomes the reference of
every `testbed` command, generated from the click commands themselves at build time
(`cli_markdown`), so a command added to `testbed/cli.py` appears without anything to
regenerate: usage, help, each option with its value, its real default (never click's
internal `Sentinel.UNSET`), its allowed values or range, `required` where it is, and the
epilog (variants, examples, the environment contract) kept as written."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import click
from mkdocs.structure.files import File, Files

LINK = re.compile(r"(\]\(|src=\")([^)\"\s#]+)(#[^)\"\s]*)?")
PREFIX = "repo"


def _outside_targets(md_path: Path, docs_dir: Path, root: Path) -> dict[str, Path]:
    """Relative link targets of one page that leave docs/ and name a file of the repository."""
    out: dict[str, Path] = {}
    for match in LINK.finditer(md_path.read_text(encoding="utf-8")):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        resolved = (md_path.parent / target).resolve()
        if resolved.is_file() and root in resolved.parents and docs_dir not in resolved.parents:
            out[target] = resolved
    return out


def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    added: set[Path] = set()
    for md in sorted(docs_dir.rglob("*.md")):
        for resolved in _outside_targets(md, docs_dir, root).values():
            if resolved in added:
                continue
            added.add(resolved)
            rel = resolved.relative_to(root).as_posix()
            files.append(File.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(resolved)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    page_path = docs_dir / page.file.src_uri
    page_dir = Path(page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        resolved = (page_path.parent / target).resolve()
        if not (resolved.is_file() and root in resolved.parents and docs_dir not in resolved.parents):
            return match.group(0)
        copy = Path(PREFIX) / resolved.relative_to(root)
        new = os.path.relpath(copy, page_dir).replace(os.sep, "/")
        return f"{match.group(1)}{new}{match.group(3) or ''}"

    markdown = LINK.sub(rewrite, markdown)
    if CLI_MARK in markdown:
        from testbed.cli import main

        markdown = markdown.replace(CLI_MARK, cli_markdown(main, "testbed"))
    return markdown


# ------------------------------------------------------------------ the CLI reference

CLI_MARK = "<!-- testbed-cli -->"


def _unset(value: object) -> bool:
    """No default: None, an empty `multiple`, or click 8.2+'s internal sentinel."""
    return value is None or value == () or type(value).__name__ == "Sentinel" or repr(value).startswith("Sentinel.")


def _escape(text: str, pipes: bool = False) -> str:
    """`<`, `>` and `&` outside code spans as entities (`results/launch-<time>/` is no HTML
    tag); with `pipes`, a pipe outside code spans escaped once, as Python-Markdown's tables
    want it (a code span keeps its pipes there)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        if pipes:
            parts[i] = parts[i].replace("|", "\\|")
    return "`".join(parts)


def _cell(text: str) -> str:
    """One table cell: one line, escaped (`_escape`)."""
    return _escape(" ".join(text.split()), pipes=True)


def _blocks(text: str) -> str:
    """Click help text as Markdown: plain paragraphs, and `\\b` paragraphs (kept as
    written by click) as preformatted blocks."""
    text = text.split("\f", 1)[0]
    out = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        if para.lstrip().startswith("\b"):
            body = para.lstrip()[1:].strip("\n")
            lines = body.splitlines()
            title = lines[0] if lines and lines[0].rstrip().endswith(":") and not lines[0].startswith(" ") else ""
            rest = lines[1:] if title else lines
            if title:
                out.append(f"**{title.strip()}**")
            if not title and not any(line[:1].isspace() for line in rest):
                out.append(_escape(" ".join(" ".join(rest).split())))  # prose kept from rewrapping in --help
            else:
                out.append("```text\n" + textwrap.dedent("\n".join(rest)).rstrip() + "\n```")
        else:
            out.append(_escape(" ".join(para.split())))
    return "\n\n".join(out)


def _value(param: click.Option, ctx: click.Context) -> str:
    if param.is_flag and not param.secondary_opts:
        return ""
    if isinstance(param.type, click.Choice):
        return "{" + ", ".join(str(c) for c in param.type.choices) + "}"
    return param.make_metavar(ctx) if param.metavar else param.type.name.upper()


def _default(param: click.Option, ctx: click.Context) -> str:
    if param.required:
        return "**required**"
    if isinstance(param.show_default, str):
        return param.show_default
    value = param.get_default(ctx, call=False)
    if callable(value) or _unset(value):
        return ""
    if param.is_flag and not param.secondary_opts:
        return "on" if value else ""
    if param.is_flag:
        return (param.opts if value else param.secondary_opts)[0]
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _description(param: click.Option) -> str:
    text = param.help or ""
    if isinstance(param.type, click.types._NumberRangeBase):
        text += f" (range {param.type._describe_range()})"
    if param.multiple and "repeatable" not in text:
        text += " (repeatable)"
    if getattr(param, "envvar", None):
        text += f" (environment: {param.envvar})"
    return text.strip()


def _command_markdown(cmd: click.Command, ctx: click.Context, level: int) -> list[str]:
    name = ctx.command_path
    out = [f"{'#' * level} {name}", ""]
    usage = " ".join([name, *cmd.collect_usage_pieces(ctx)])
    out += [f"```text\nUsage: {usage}\n```", ""]
    if cmd.help:
        out += [_blocks(cmd.help), ""]
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    if arguments:
        shown = [f"`{p.make_metavar(ctx)}`" + ("" if p.required else " (optional)") for p in arguments]
        out += ["Arguments: " + ", ".join(shown) + ".", ""]
    rows = []
    params = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    for p in params:
        names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
        value = _value(p, ctx)
        option = names + (f" `{value}`" if value else "")
        rows.append(f"| {_cell(option)} | {_cell(_default(p, ctx))} | {_cell(_description(p))} |")
    if rows:
        out += ["| Option | Default | Description |", "|---|---|---|", *rows, ""]
    if cmd.epilog:
        out += [_blocks(cmd.epilog), ""]
    if isinstance(cmd, click.Group):
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = click.Context(sub, info_name=sub_name, parent=ctx)
            out += _command_markdown(sub, sub_ctx, level + 1)
    return out


def cli_markdown(group: click.Command, prog: str) -> str:
    """The reference of `group` and every command under it, as Markdown."""
    ctx = click.Context(group, info_name=prog)
    if isinstance(group, click.Group):
        listed = [f"[`{prog} {n}`](#{prog}-{n})" for n in group.list_commands(ctx)]
        head = ["Commands: " + ", ".join(listed) + ".", ""]
    else:
        head = []
    return "\n".join(head + _command_markdown(group, ctx, 2))
