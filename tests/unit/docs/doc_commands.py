"""The commands the documentation gives, and a check of each against the real click CLI.

`shell_commands(text)` takes every command of a page's shell code blocks (`sh`, `bash`,
`console` and untagged fences; comments, `\\` continuations and `&&`/`;`/`|` chains
handled) and `inline_commands(text)` every inline code span that is a command to paste
(`sudo ...`, `.venv/bin/testbed ...`, or `testbed ...` with a path argument).
`check_command(line, made)` parses a `testbed` line as click would, in-process: the
command and subcommand exist, every option is the command's own and gets its value, no
argument is left over, a required option or argument is there (unless the line elides
with `...`), every choice or number is one the option takes, and every file it names is in
the repository (outputs, and what an earlier command of the same block made, excepted). A
`make` line names Makefile targets; another program's paths must exist too.

One way to call the CLI everywhere: a pasted command reads `.venv/bin/testbed`, with
`sudo` where it needs root, as `make install` sets it up; a bare `testbed` is refused.
Placeholders (`DIR`, `SWEEP.yaml`, `<time>`, `...`) and synopsis brackets (`[--json]`)
are allowed: the flags inside brackets are checked, the placeholders' files are not.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^[ \t]*(```|~~~)([\w-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
SHELL_LANGS = {"sh", "bash", "shell", "console"}
CLI = ".venv/bin/testbed"
LIST_VALUE = re.compile(r"^[\w.-]+=\[[^\[\]]*\]$")
PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z0-9_]*(=[A-Z0-9_]+)?(\.[a-z]+)?)$")
WRAPPERS = {"sudo", "-E", "env", "time", "nice"}
OUTPUT_FLAGS = {"--out", "-o"}  # another program's output folder: made by the command


def is_placeholder(token: str) -> bool:
    return bool(PLACEHOLDER.match(token)) or "<" in token or "..." in token


def _segments(line: str) -> Iterator[list[str]]:
    """The simple commands of one shell line, as tokens (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    current: list[str] = []
    for tok in lexer:
        if tok and set(tok) <= set(";&|"):
            if current:
                yield current
            current = []
        elif tok == ">" or tok.startswith(">"):
            break
        else:
            current.append(tok)
    if current:
        yield current


def _strip_wrappers(tokens: list[str]) -> list[str]:
    i = 0
    while i < len(tokens) and (tokens[i] in WRAPPERS or re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[i])):
        i += 1
    return tokens[i:]


def shell_commands(text: str) -> list[list[str]]:
    """Every shell code block's commands, each a list of lines (one per simple command),
    the block's order kept: `[[line, ...], ...]` per block."""
    blocks = []
    for _, lang, body in FENCE.findall(text):
        if lang not in SHELL_LANGS and lang != "":
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        lines = []
        for raw in body.splitlines():
            raw = raw.strip()
            if raw.startswith("$ "):
                raw = raw[2:]
            if not raw or raw.startswith("#"):
                continue
            try:
                segments = list(_segments(raw))
            except ValueError:
                if lang:
                    lines.append(raw)  # unbalanced quotes: check_command says so
                continue
            for seg in segments:
                prog = _strip_wrappers(seg)
                if not prog:
                    continue
                if lang == "" and Path(prog[0]).name not in ("testbed", "make"):
                    continue  # an untagged block holds output as often as commands
                lines.append(shlex.join(seg))
        if lines:
            blocks.append(lines)
    return blocks


def inline_commands(text: str) -> list[str]:
    """Inline code spans that are commands to paste."""
    prose = FENCE.sub("", text)
    found = []
    for span in re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", prose):
        span = re.sub(r"<[^>]*>", lambda m: m.group(0).replace(" ", "_"), " ".join(span.split()))
        if span.startswith(("sudo ", CLI + " ")) and ("testbed" in span.split()[1] or span.startswith(CLI)):
            found.append(span)
        elif span.startswith((".venv/bin/python ", "sudo .venv/bin/python ")):
            found.append(span)
        elif span.startswith("testbed ") and any("/" in t and not t.startswith("-") for t in span.split()[2:]):
            found.append(span)
    return found


def named_commands(text: str) -> list[str]:
    """Inline spans that name a command, perhaps with some of its options (`testbed run
    --inventory`), not given to paste: written as the CLI line they stand for, elided
    (`... `), so that the command and its options are checked, not what is left out."""
    prose = FENCE.sub("", text)
    pasted = set(inline_commands(text))
    found = []
    for span in re.findall(r"(?<!`)`(testbed [a-z][^`\n]*)`(?!`)", prose):
        span = re.sub(r"<[^>]*>", lambda m: m.group(0).replace(" ", "_"), span)
        if span not in pasted:
            found.append(f"{CLI} {span.removeprefix('testbed ')} ...")
    return found


@cache
def _make_targets() -> frozenset[str]:
    return frozenset(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@cache
def _cli() -> click.Group:
    from testbed.cli import main

    return main


def _path_exists(token: str, made: set[str]) -> bool:
    path = token.rstrip("/")
    if any(path == m or path.startswith(m.rstrip("/") + "/") for m in made):
        return True
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    if path.startswith(".venv/"):
        return True  # made by `make install`
    return (ROOT / path).exists()


def _named_paths(tokens: list[str]) -> list[str]:
    """Tokens that name a file of the repository: a relative path whose first part is one
    of its top-level folders or files (a header like `Content-Type: a/b` is not)."""
    return [t for t in tokens if "/" in t and not t.startswith(("-", "/", "~")) and "=" not in t and "://" not in t
            and not is_placeholder(t) and (ROOT / t.split("/", 1)[0]).exists()]


def check_command(line: str, made: set[str] | None = None) -> None:
    """AssertionError saying what is wrong with `line` (see the module's docstring).
    `made`: paths earlier commands of the same block wrote (their --out), updated."""
    made = made if made is not None else set()
    tokens = _strip_wrappers(shlex.split(line))
    assert tokens, f"{line!r}: no command"
    prog, args = tokens[0], tokens[1:]
    if prog == "make":
        missing = set(args) - _make_targets()
        assert not missing, f"{line!r}: no Makefile target {sorted(missing)}"
        return
    if Path(prog).name != "testbed":
        outputs = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in OUTPUT_FLAGS}
        for out in outputs:
            _not_a_kept_result(line, out)
        for path in _named_paths([t for t in tokens if t not in outputs]):
            assert _path_exists(path, made), f"{line!r}: {path} does not exist in the repository"
        return
    assert prog == CLI, (f"{line!r}: call the CLI as {CLI} (with sudo where it needs root), as every page "
                         f"does: `make install` puts no `testbed` on root's PATH")
    _check_testbed(line, args, made)


def _check_testbed(line: str, args: list[str], made: set[str]) -> None:
    # `[--json]` is a synopsis bracket; `variants=[a,b]` (an --set value) is a literal
    bracketed = [(t.startswith("[") or t.endswith("]")) and not LIST_VALUE.match(t) for t in args]
    synopsis = any(bracketed)
    args = [t.strip("[]") if b else t for t, b in zip(args, bracketed, strict=True)]
    args = [t for t in args if t]
    elided = "..." in args or synopsis
    cmd: click.Command = _cli()
    words = ["testbed"]
    while isinstance(cmd, click.Group):
        if args and is_placeholder(args[0]):
            return  # the group named, its commands left out (`testbed <command> --help`)
        if not args or args[0].startswith("-"):
            assert args and args[0] in ("--help", "--version"), \
                f"{line!r}: `{' '.join(words)}` needs a command: {', '.join(cmd.list_commands(click.Context(cmd)))}"
            return
        sub = cmd.get_command(click.Context(cmd), args[0])
        assert sub is not None, (f"{line!r}: `{' '.join(words)}` has no command {args[0]!r} "
                                 f"(it has {', '.join(cmd.list_commands(click.Context(cmd)))})")
        words.append(args.pop(0))
        cmd = sub
    name = " ".join(words)
    options: dict[str, click.Option] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for opt in (*p.opts, *p.secondary_opts):
                options[opt] = p
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    given: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            positional += args[i:]
            break
        if tok in ("--help", "-h") and tok not in options:
            return
        if tok.startswith("-") and len(tok) > 1 and not re.match(r"^-\d", tok):
            opt, eq, value = tok.partition("=")
            param = options.get(opt)
            if param is None and not opt.startswith("--") and len(opt) > 2:
                opt, value, eq = opt[:2], opt[2:], "="  # -j4
                param = options.get(opt)
            assert param is not None, (f"{line!r}: `{name}` has no option {opt} "
                                       f"(it has {', '.join(sorted(o for o in options if o.startswith('--')))})")
            if param.is_flag or param.count:
                assert not eq or opt in param.secondary_opts or param.is_flag, f"{line!r}: {opt} takes no value"
                given.setdefault(param.name, []).append("true")
                continue
            if not eq:
                assert i < len(args), f"{line!r}: {opt} needs a value"
                value = args[i] if LIST_VALUE.match(args[i]) else args[i].strip("[]")
                i += 1
            _check_value(line, name, opt, param, value, made)
            given.setdefault(param.name, []).append(value)
            continue
        positional.append(tok)
    _check_positional(line, name, arguments, positional, elided, made)
    if name in ("testbed run", "testbed sweep") and "sets" in given and positional \
            and not is_placeholder(positional[0]) and "*" not in positional[0]:
        _check_sets(line, name, positional[0], given["sets"])
    if not elided:
        for p in cmd.params:
            if isinstance(p, click.Option) and p.required and p.name not in given:
                raise AssertionError(f"{line!r}: `{name}` needs {p.opts[-1]}")


def _check_sets(line: str, name: str, path: str, sets: list[str]) -> None:
    """The --set overrides apply to the file's scenario (or the sweep's every point)."""
    from testbed.run.scenario import load_scenario, parse_set_options
    from testbed_core.configfile import ConfigError

    try:
        overrides = parse_set_options(sets)
        if name == "testbed sweep":
            from testbed.sweep import load_sweep

            load_sweep(ROOT / path, overrides)
        else:
            load_scenario(ROOT / path, overrides)
    except ConfigError as exc:
        raise AssertionError(f"{line!r}: {exc}") from None


def _not_a_kept_result(line: str, out: str) -> None:
    """A command as the docs give it writes a new folder, never over a kept result."""
    path = out.rstrip("/")
    assert not (path.startswith("results/") and (ROOT / path).exists()), (
        f"{line!r}: writes into {path}, a kept result in the repository; a reproduction writes a new "
        "folder (say where the kept one is beside the command)")


def _is_output(param: click.Parameter) -> bool:
    return bool(param.name and (param.name.startswith("out") or param.name in ("keep_to",)))


def _check_value(line: str, name: str, opt: str, param: click.Parameter, value: str, made: set[str]) -> None:
    if is_placeholder(value) or value.startswith(("/", "~")):
        return
    if isinstance(param.type, click.Path):
        if _is_output(param):
            _not_a_kept_result(line, value)
            made.add(value)
            return
        assert "/" not in value or _path_exists(value, made), \
            f"{line!r}: {opt} {value}: does not exist in the repository"
        return
    if isinstance(param.type, (click.Choice, click.types.IntParamType, click.types.FloatParamType,
                               click.types.BoolParamType)):
        try:
            param.type.convert(value, param, None)
        except click.BadParameter as exc:
            raise AssertionError(f"{line!r}: `{name}` {opt} {value}: {exc.message}") from None


def _check_positional(line: str, name: str, arguments: list[click.Argument], values: list[str], elided: bool,
                      made: set[str]) -> None:
    values = [v for v in values if v != "..."]
    variadic = any(a.nargs == -1 for a in arguments)
    fixed = sum(a.nargs for a in arguments if a.nargs > 0)
    if not variadic:
        assert len(values) <= fixed, f"{line!r}: `{name}` takes {fixed} argument(s), got {values}"
    if not elided:
        needed = sum(a.nargs for a in arguments if a.required and a.nargs > 0)
        assert len(values) >= needed, (f"{line!r}: `{name}` needs "
                                       f"{' '.join(a.human_readable_name for a in arguments if a.required)}")
    outputs = {values[k] for k, a in enumerate(arguments[: len(values)]) if a.nargs == 1 and _is_output(a)}
    for v in _named_paths(values):
        if v in outputs:
            continue
        assert _path_exists(v, made), f"{line!r}: {v} does not exist in the repository"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
