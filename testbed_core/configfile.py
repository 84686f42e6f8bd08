"""The one reading path of the files users write (topologies, workloads, scenarios,
sweeps, link and request traces), and the turning of pydantic's errors into messages
that name the file, the field as a dotted path, and what is allowed.

Every file is read by `read_text`, which refuses, with the file named, what is not a
file (missing, a directory, a device or pipe), what is too big, and what is not UTF-8
text, before anything parses it. YAML (and JSON, which YAML 1.2 reads) goes through
`StrictLoader`, PyYAML's safe loader made strict:

* scalars resolve as in YAML 1.2's core schema: only ``true``/``false`` are booleans
  (``yes``, ``no``, ``on``, ``off`` stay text, so ``rate: on`` is refused as "not a rate"
  instead of becoming 1 bit/s), ``012`` is twelve, ``1:30`` is text (YAML 1.1 read it as
  90), and there are no implicit dates;
* a key given twice in one mapping is refused (YAML 1.1 loaders keep the last);
* nesting deeper than `MAX_DEPTH` is refused while scanning (PyYAML's scanner is
  quadratic in the flow nesting depth, so a line of ``[[[[`` would otherwise hang it);
* aliases are allowed, but the document they expand to is capped at `MAX_NODES` nodes
  (a "billion laughs" file is refused instead of eating the memory of whatever walks
  it), and a recursive alias is refused;
* merge keys (``<<``, YAML 1.1 only) are refused with a hint.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError
from yaml.scanner import ScannerError

MAX_CONFIG_BYTES = 1 << 20  # a topology, workload, scenario or sweep file
MAX_TRACE_BYTES = 64 << 20  # a link or request trace
MAX_DEPTH = 32  # nested mappings and lists
MAX_NODES = 100_000  # nodes of a document once its aliases are expanded
MAX_NUMBER_DIGITS = 100  # digits of one integer literal


class ConfigError(ValueError):
    """A user-written file that cannot be used; the message says where and why."""


def _size_text(nbytes: int) -> str:
    from testbed_core.units import format_size

    return format_size(nbytes)


# ---------------------------------------------------------------------------- reading


def read_text(path: str | Path, kind: str, error: type[Exception] = ConfigError,
              max_bytes: int = MAX_CONFIG_BYTES, missing_hint: str = "") -> str:
    """The UTF-8 text of a `kind` file (a UTF-8 byte-order mark is dropped). Raises
    `error` naming the file for a missing file, a directory, anything not a regular
    file, a file over `max_bytes`, binary data and text that is not UTF-8."""
    path = Path(path)
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise error(f"{path}: no such {kind} file{missing_hint}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {kind} file ({exc.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{path}: is a directory; a {kind} file is expected here")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: not a regular file (a device, pipe or socket); a {kind} file is expected here")
    too_big = f"{path}: too big for a {kind} file (at most {_size_text(max_bytes)})"
    if info.st_size > max_bytes:
        raise error(f"{too_big}; it has {_size_text(info.st_size)}")
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read the {kind} file ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise error(too_big)
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{path}: binary data (a NUL byte at offset {nul}); a {kind} file is UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); save the {kind} file as UTF-8"
        ) from None


# ---------------------------------------------------------------------------- strict YAML


def _yaml_problem(message: str, mark: Any = None) -> NoReturn:
    raise ConstructorError(None, None, message, mark)


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core scalars, duplicate keys refused and the
    nesting depth capped while scanning (see the module docstring)."""

    def _check_depth(self) -> None:
        depth = len(self.indents) + self.flow_level
        if depth > MAX_DEPTH:
            raise ScannerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", self.get_mark())

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 (PyYAML's name)
        super().fetch_flow_collection_start(TokenClass)
        self._check_depth()

    def add_indent(self, column: int) -> bool:
        added = super().add_indent(column)
        if added:
            self._check_depth()
        return added

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):
            _yaml_problem(f"expected a mapping, found {node.id}", node.start_mark)
        mapping: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or (
                    isinstance(key_node, ScalarNode) and key_node.value == "<<" and key_node.style is None):
                _yaml_problem("merge keys ('<<') are not supported: write the fields out", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                _yaml_problem("a mapping key must be a plain value, not a list or mapping", key_node.start_mark)
            if key in mapping:
                _yaml_problem(f"duplicate key {key!r} (first given on line {lines[key] + 1}); "
                              "give each field once", key_node.start_mark)
            mapping[key] = self.construct_object(value_node, deep=deep)
            lines[key] = key_node.start_mark.line
        return mapping


def _construct_int(loader: StrictLoader, node: Node) -> int:
    text = loader.construct_scalar(node)
    digits = text.lstrip("+-")
    if len(digits) > MAX_NUMBER_DIGITS:
        _yaml_problem(f"a number of more than {MAX_NUMBER_DIGITS} digits", node.start_mark)
    sign = -1 if text.startswith("-") else 1
    if digits.startswith("0o"):
        return sign * int(digits[2:], 8)
    if digits.startswith("0x"):
        return sign * int(digits[2:], 16)
    return sign * int(digits, 10)


def _construct_float(loader: StrictLoader, node: Node) -> float:
    text = loader.construct_scalar(node)
    lower = text.lower()
    if lower in (".nan", "+.nan", "-.nan"):
        return float("nan")
    if lower.endswith(".inf"):
        return float("-inf") if lower.startswith("-") else float("inf")
    return float(text)


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), replacing 1.1's
_DROPPED_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                 "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"}
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))
StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _expanded_size(root: Node) -> int:
    """Nodes of the document with every alias expanded, stopping past `MAX_NODES`;
    raises on a recursive alias, and when aliases nest the document deeper than
    `MAX_DEPTH` (a chain of aliases, each adding levels, would otherwise build a
    document too deep for anything that walks it). Memoised, so a shared subtree is
    walked once."""
    seen: dict[int, tuple[int, int]] = {}  # node -> (expanded size, expanded depth)
    open_nodes: set[int] = set()

    def walk(node: Node) -> tuple[int, int]:
        key = id(node)
        if key in seen:
            return seen[key]
        if key in open_nodes:
            _yaml_problem("an alias refers to the mapping or list that contains it (a recursive structure)",
                          node.start_mark)
        open_nodes.add(key)
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        total, depth = 1, 0
        for child in children:
            size, child_depth = walk(child)
            total += size
            depth = max(depth, child_depth)
        depth += 1 if children else 0
        open_nodes.discard(key)
        seen[key] = (total, depth)
        if total > MAX_NODES:
            _yaml_problem(f"the document expands to more than {MAX_NODES} values (its aliases repeat "
                          "too much)", node.start_mark)
        if depth > MAX_DEPTH:
            _yaml_problem(f"its aliases nest the document deeper than {MAX_DEPTH} levels", node.start_mark)
        return total, depth

    return walk(root)[0]


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{problem}"
    if context and context not in problem:
        text += f" ({context})"
    return text


def load_yaml_text(text: str, source: str, kind: str, error: type[Exception] = ConfigError) -> Any:
    """The document in `text` read with `StrictLoader`; any problem raises `error`
    naming `source` and, where known, the line."""
    try:
        loader = StrictLoader(text)
    except ReaderError as exc:  # the whole text is checked for control characters first
        raise error(f"{source}: not valid YAML for a {kind} file: {_describe_reader_error(exc, text)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except ReaderError as exc:
        raise error(f"{source}: not valid YAML for a {kind} file: {_describe_reader_error(exc, text)}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML for a {kind} file: {_describe_yaml_error(exc)}") from None
    except (ValueError, RecursionError) as exc:  # a scalar a constructor could not take
        raise error(f"{source}: not valid YAML for a {kind} file: {exc}") from None
    finally:
        loader.dispose()


def _describe_reader_error(exc: ReaderError, text: str) -> str:
    line = text[: exc.position].count("\n") + 1
    return f"line {line}: control character #x{exc.character:04x} is not allowed in YAML text"


def read_yaml(path: str | Path, kind: str, error: type[ConfigError] = ConfigError,
              missing_hint: str = "") -> Any:
    """The document of a YAML or JSON file, read by `read_text` and `load_yaml_text`."""
    text = read_text(path, kind, error, missing_hint=missing_hint)
    return load_yaml_text(text, str(path), kind, error)


def read_yaml_mapping(path: str | Path, kind: str, error: type[ConfigError] = ConfigError,
                      missing_hint: str = "") -> dict[str, Any]:
    """The top-level mapping of a YAML file; anything else raises `error` naming the
    file and the `kind` of file expected."""
    data = read_yaml(path, kind, error, missing_hint)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {_type_name(data)}"
        raise error(f"{path}: a {kind} file must be a YAML mapping of fields, got {got}")
    return data


# ---------------------------------------------------------------------------- models


class ConfigModel(BaseModel):
    """Base of the models of user-written files: unknown fields refused, no infinities
    or NaNs, and no true/false where the field is not a yes/no field (pydantic would
    take ``true`` as the number 1)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _accepts_bool(field.annotation):
                raise ValueError(f"{str(value).lower()} is a yes/no value; this field takes "
                                 f"{_expected(field.annotation)}")
        return value


def _base_types(annotation: Any) -> set[Any]:
    """The plain types a field annotation is made of (through unions, Annotated, Literal)."""
    from typing import Literal, get_args, get_origin

    if get_origin(annotation) is Literal:
        return {type(arg) for arg in get_args(annotation)}
    args = get_args(annotation)
    if args and get_origin(annotation) not in (list, tuple, dict, set):
        out: set[Any] = set()
        for arg in args:
            if isinstance(arg, type) or get_origin(arg) is not None or arg is Any:
                out |= _base_types(arg)
        return out or {annotation}
    return {get_origin(annotation) or annotation}


def _accepts_bool(annotation: Any) -> bool:
    types = _base_types(annotation)
    return bool(types & {bool, Any, object})


def _expected(annotation: Any) -> str:
    types = _base_types(annotation)
    if types & {int, float}:
        return "a number" + (" or text (e.g. 25ms or 1Gbit)" if str in types else "")
    if str in types:
        return "text"
    if types & {list, tuple}:
        return "a list"
    return "a mapping of fields" if any(isinstance(t, type) and issubclass(t, BaseModel) for t in types) else \
        "a value of another type"


# ---------------------------------------------------------------------------- errors


_UNION_TAG = re.compile(
    r"^(?:function-(?:before|after|wrap|plain)\[|literal\[|is-instance\[|json-or-python\[|nullable\[|"
    r"constrained-|lax-or-strict\[|tagged-union\[|(?:int|float|str|bool|none|list|tuple|dict|set|bytes)$|"
    r"(?:list|tuple|dict|set)\[)"
)
_TYPE_NAMES = {dict: "mapping", list: "list", str: "text", int: "number", float: "number",
               bool: "yes/no value", type(None): "null"}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


FORMAT_PAGES = {"topology": "topology", "workload": "workload", "scenario": "scenario", "sweep": "sweep",
                "inventory": "inventory", "servers section": "servers", "what-if grid": "whatif-grid",
                "grid point": "whatif-grid"}


def format_page(kind: str) -> str:
    """The docs page (generated from the models) that describes file format `kind`."""
    page = FORMAT_PAGES.get(kind)
    return f"docs/reference/formats/{page}.md" if page else "docs/reference/formats/"


def _message(err: Any, kind: str) -> str:
    etype = err["type"]
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = err.get("input")
    if etype == "missing":
        return "required field is missing"
    if etype == "extra_forbidden":
        return f"unknown field (check the spelling; the {kind} format: {format_page(kind)})"
    if etype in ("model_type", "model_attributes_type", "dict_type", "mapping_type"):
        return f"expected a mapping of fields, got {_type_name(value)} {_short(value)}"
    if etype in ("list_type", "tuple_type", "set_type", "iterable_type"):
        return f"expected a list, got {_type_name(value)} {_short(value)}"
    if etype == "finite_number":
        return f"must be a finite number, got {_short(value)}"
    if etype in ("value_error", "assertion_error"):
        return msg
    if isinstance(value, (str, int, float, bool)) or value is None:
        return f"{msg} (got {_short(value)})"
    return msg


def format_validation_error(source: str, exc: ValidationError, kind: str, prefix: str = "") -> str:
    """pydantic's errors as one message: the file, then one line per field with the
    field as a dotted path (after `prefix`, for a section validated on its own) and
    pydantic's wording made plainer; the alternatives of a union field (``queue: auto``
    or a size) are joined on one line, and pydantic's internal names of union members
    (validator functions, literal tags) never appear."""
    by_loc: dict[str, list[str]] = {}
    for err in exc.errors(include_url=False):
        parts = [str(p) for p in (prefix.split(".") if prefix else []) + list(err["loc"])]
        loc = ".".join(p for p in parts if not _UNION_TAG.match(p))
        msg = _message(err, kind)
        msgs = by_loc.setdefault(loc, [])
        if msg not in msgs:
            msgs.append(msg)
    count = len(by_loc)
    lines = [f"{source}: invalid {kind} ({count} problem{'s' if count > 1 else ''}):"]
    for loc, msgs in by_loc.items():
        lines.append(f"  - {loc or '(top level)'}: {'; or '.join(msgs)}")
    return "\n".join(lines)
