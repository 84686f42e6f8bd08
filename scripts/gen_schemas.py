"""JSON Schemas and the file-format reference, generated from the pydantic models.

Every file the toolkit reads or writes has a pydantic model; this script turns each
model into a JSON Schema (``schemas/<format>.schema.json``, the model's
``model_json_schema()`` in validation mode) and a Markdown reference page
(``docs/reference/formats/<format>.md``), so neither is written by hand. Where a file
accepts more than the model's field types say, the schema says so too:

* a number with a unit (``25ms``, ``1Gbit``, ``4MiB``) wherever a field parses units;
* ``hosts: 2`` (a count) as well as a list of host names;
* a scenario's ``topology:`` and ``workload:`` as a file path or an inline mapping.

Editors read the schemas through the first line of every shipped YAML file
(``# yaml-language-server: $schema=...``), which this script also checks and writes.

    .venv/bin/python scripts/gen_schemas.py           # write schemas/, the reference pages, the YAML first lines
    .venv/bin/python scripts/gen_schemas.py --check   # exit 1, naming the files, when any is out of date

No root, no network: it imports the models and writes files.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "schemas"
REFERENCE_DIR = ROOT / "docs" / "reference" / "formats"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
MODELINE = "# yaml-language-server: $schema="

# A number, optionally with a unit: what testbed_core/units.py parses (25ms, 1Gbit, 2.5Gbps,
# 4MiB, 0.1%). Loose on the unit: the toolkit's own error lists the units it knows.
UNIT_PATTERN = r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*[A-Za-z/%]*\s*$"
UNIT_TEXT = {"type": "string", "pattern": UNIT_PATTERN,
             "description": "a number with a unit, e.g. 25ms, 1Gbit, 4MiB, 0.1%"}


# The `before` validators that parse a number with a unit out of text (by qualified name).
UNIT_PARSERS = ("unit_validator.<locals>.convert", "Server._rate", "WanLink._queue")


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n", 1)[0].split())


@functools.cache
def _class_notes(cls: type) -> dict[str, str]:
    """What the source of `cls` says about each of its own fields: the attribute's
    docstring (a string right after it), else the comment at the end of its line(s), else
    the comment lines right above it. The models document many fields this way; the
    reference shows it as the field's description where the field has none of its own."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):
        return {}
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    notes: dict[str, str] = {}
    previous_end = tree.body[0].lineno if body else 0  # the `class` line: comments above the first field count
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            after = body[i + 1] if i + 1 < len(body) else None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                notes[name] = _first_paragraph(after.value.value)
            else:
                end = node.end_lineno or node.lineno
                trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments
                            and not lines[n - 1].lstrip().startswith("#")]
                above = []
                n = node.lineno - 1
                while n > previous_end and lines[n - 1].lstrip().startswith("#"):
                    above.insert(0, comments.get(n, ""))
                    n -= 1
                text = " ".join(trailing) or " ".join(above)
                text = text.strip()
                if text and not set(text) <= set("-=# "):
                    notes[name] = text
        previous_end = node.end_lineno or node.lineno
    return notes


def field_notes(cls: type) -> dict[str, str]:
    """`_class_notes` of `cls` and of the classes it inherits fields from (its own win)."""
    merged: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or klass.__module__.startswith("pydantic"):
            continue
        merged.update(_class_notes(klass))
    return merged


class FileSchema(GenerateJsonSchema):
    """pydantic's schema generator, taught what the files accept before a field's own
    type: the `before` validators that widen the input (units as text, a host count), and
    each field's description from its model's source where it has no `description=`
    (`field_notes`)."""

    def model_schema(self, schema: Any) -> dict[str, Any]:
        out = super().model_schema(schema)
        cls = schema.get("cls")
        props = out.get("properties") if isinstance(out, dict) else None
        if cls is None or not props:
            return out
        notes = field_notes(cls)
        for name, info in getattr(cls, "model_fields", {}).items():
            key = info.validation_alias if isinstance(info.validation_alias, str) else (info.alias or name)
            prop = props.get(key)
            if prop is not None and not prop.get("description") and notes.get(name):
                prop["description"] = notes[name]
        return out

    def function_before_schema(self, schema: Any) -> dict[str, Any]:
        inner = super().function_before_schema(schema)
        func = schema.get("function", {}).get("function")
        name = getattr(func, "__qualname__", "")
        if name.endswith(UNIT_PARSERS) or (name, getattr(func, "__module__", "")) == ("_no_bool", "testbed.run.faults"):
            return {"anyOf": [inner, dict(UNIT_TEXT)]}
        if name.endswith("Datacenter._expand_count"):
            count = {"type": "integer", "minimum": 1, "maximum": 64, "description": "a host count: hosts h1, h2, ..."}
            return {"anyOf": [count, inner]}
        return inner


@dataclass(frozen=True)
class Format:
    name: str  # schemas/<name>.schema.json, docs/reference/formats/<name>.md
    title: str
    model: Callable[[], type[BaseModel]]
    what: str  # one sentence for the reference page: who reads or writes it
    shipped: tuple[str, ...] = ()  # globs of shipped files in this format
    adapt: Callable[[dict[str, Any]], None] | None = None


def _topology() -> type[BaseModel]:
    from testbed_core.topology import Topology
    return Topology


def _workload() -> type[BaseModel]:
    from testbed_core.workload import Workload
    return Workload


def _scenario() -> type[BaseModel]:
    from testbed.run.scenario import Scenario
    return Scenario


def _program_scenario() -> type[BaseModel]:
    from testbed.run.scenario import ProgramScenario
    return ProgramScenario


def _sweep() -> type[BaseModel]:
    from testbed.sweep import SweepFile
    return SweepFile


def _grid() -> type[BaseModel]:
    from testbed_core.whatif.grid import Grid
    return Grid


def _inventory() -> type[BaseModel]:
    from testbed_core.inventory import Inventory
    return Inventory


def _servers() -> type[BaseModel]:
    from testbed_core.servers import ServerPlan
    return ServerPlan


def _summary() -> type[BaseModel]:
    from testbed_core.contracts.summary import Summary
    return Summary


def _program_summary() -> type[BaseModel]:
    from testbed_core.contracts.summary import ProgramSummary
    return ProgramSummary


def _sweep_record() -> type[BaseModel]:
    from testbed_core.contracts.sweep import SweepRecord
    return SweepRecord


def _point_record() -> type[BaseModel]:
    from testbed_core.contracts.sweep import PointRecord
    return PointRecord


def _kept_record() -> type[BaseModel]:
    from testbed_core.contracts.sweep import KeptRecord
    return KeptRecord


def _demo() -> type[BaseModel]:
    from testbed_core.contracts.demo import DemoDoc
    return DemoDoc


def _provenance() -> type[BaseModel]:
    from testbed.provenance import Provenance
    return Provenance


def _launch() -> type[BaseModel]:
    from testbed.launch.models import LaunchReport
    return LaunchReport


def _profile() -> type[BaseModel]:
    from testbed_core.program.profile import ProgramProfile
    return ProgramProfile


def _transport_calibration() -> type[BaseModel]:
    from testbed_core.program.transport import TransportCalibration
    return TransportCalibration


def _adapt_scenario(schema: dict[str, Any]) -> None:
    """A scenario file names its topology and workload as a file (relative to the
    scenario) or inline; `source` and `workload_source` are filled in by the loader."""
    props = schema["properties"]
    for key, ref, what in (("topology", "Topology", "a topology file"), ("workload", "Workload", "a workload file")):
        props[key] = {"anyOf": [{"type": "string", "description": f"{what}, relative to the scenario file"},
                                {"$ref": f"#/$defs/{ref}"}],
                      "description": f"{what} (a path relative to the scenario file) or the same fields inline"}
    for key in ("source", "workload_source"):
        props.pop(key, None)
    schema["required"] = sorted(set(schema.get("required", [])) | {"topology", "workload"})


def _adapt_program_scenario(schema: dict[str, Any]) -> None:
    """A program scenario names its topology as a file or inline, as a scenario does."""
    props = schema["properties"]
    props["topology"] = {"anyOf": [{"type": "string", "description": "a topology file, relative to the scenario file"},
                                   {"$ref": "#/$defs/Topology"}],
                         "description": "a topology file (a path relative to the scenario file) or the same fields inline"}
    props.pop("source", None)


def _adapt_sweep(schema: dict[str, Any]) -> None:
    """A sweep's parameter values are lists or ranges ({from, to, steps}); the model reads
    them as Any and checks them once the base scenario is resolved."""
    from testbed.sweep import RangeSpec, ValuesSpec

    defs = schema.setdefault("$defs", {})
    for model in (RangeSpec, ValuesSpec):
        defs[model.__name__] = model.model_json_schema(mode="validation", schema_generator=FileSchema)
    schema["properties"]["parameters"]["additionalProperties"] = {
        "anyOf": [{"type": "array", "minItems": 1}, {"$ref": "#/$defs/RangeSpec"}, {"$ref": "#/$defs/ValuesSpec"}],
        "description": "a list of values, {values: [...]}, or a range {from, to, steps, scale}",
    }


FORMATS: tuple[Format, ...] = (
    Format("topology", "Topology file", _topology,
           "The datacenters and WAN links (`topologies/*.yaml`); read by `testbed topo`, `run`, `plan`, `whatif`.",
           ("topologies/*.yaml",)),
    Format("workload", "Workload file", _workload,
           "The model, its parallelism and the GPU (`scenarios/workloads/*.yaml`); named by scenarios and grids.",
           ("scenarios/workloads/*.yaml",)),
    Format("scenario", "Scenario file", _scenario,
           "What `testbed run` plays: a topology, a workload, the variants and how to run them (`scenarios/*.yaml`).",
           (), _adapt_scenario),
    Format("program-scenario", "Program scenario file", _program_scenario,
           "A scenario whose subject is your own program (`program:` instead of `workload:`), its variants "
           "environment sets; run by `testbed run` through `testbed launch`.",
           (), _adapt_program_scenario),
    Format("sweep", "Sweep file", _sweep,
           "A scenario over a grid of parameters (`scenarios/sweep-*.yaml`), for `testbed sweep`.",
           ("scenarios/sweep-*.yaml",), _adapt_sweep),
    Format("whatif-grid", "What-if grid file", _grid,
           "A paper-scale prediction grid (`scenarios/whatif-scale.yaml`), for `testbed whatif --grid`.",
           ("scenarios/whatif-*.yaml",)),
    Format("inventory", "Inventory file", _inventory,
           "Real machines for `testbed run --inventory`: which machine holds which hosts, how to log in."),
    Format("servers", "Servers file", _servers,
           "Several servers for one emulated topology (`--servers FILE`, or a topology's `servers:` section)."),
    Format("summary", "summary.json", _summary,
           "What `testbed run` writes per run (`results/<scenario>-<time>/summary.json`); read back by "
           "`report`, `sweep` and `demo` through the same model."),
    Format("program-summary", "summary.json of a program scenario", _program_summary,
           "What `testbed run` writes for a program scenario (`kind: program`): per variant the seconds per "
           "step rank 0 printed, the launch's outcome and the WAN bytes."),
    Format("launch", "launch.json", _launch,
           "What `testbed launch` writes: the command, each rank's outcome and the WAN bytes."),
    Format("profile", "profile.json", _profile,
           "What `testbed launch --profile` writes beside launch.json: each rank's communications and steps, "
           "read by `testbed whatif --program DIR`."),
    Format("transport-calibration", "transport-calibration.json", _transport_calibration,
           "What `testbed launch --profile` writes beside profile.json where atlas crossed DCs: the atlas "
           "transport's own cost per transfer on this machine, read by `testbed whatif --program DIR`."),
    Format("sweep-record", "sweep.json", _sweep_record,
           "What `testbed sweep` writes in its result folder: the plan it ran (parameters, points, overrides); "
           "read back by `report` and by the sweep itself when it resumes."),
    Format("point", "point.json", _point_record,
           "What `testbed sweep` writes per point (`<out>/<point>/point.json`), as the point starts and ends; "
           "read back by `report` and by the sweep to skip finished points."),
    Format("kept", "kept.json", _kept_record,
           "What `testbed report --keep` writes beside kept sweep results (`results/<sweep>/kept.json`): where "
           "they came from, when, and every kept file's size."),
    Format("provenance", "provenance.json", _provenance,
           "What `testbed sweep` writes beside its plan and in every point's folder: the machine, the software "
           "versions, the git commit, the seed and the delay backend of the run."),
    Format("demo", "demo.json", _demo,
           "What `testbed demo` writes: the table's rows as shown and what the demo ran (its settings and the "
           "notes of the parts that did not run); read back when the table is rebuilt from the folder."),
)


def schema_of(fmt: Format) -> dict[str, Any]:
    model = fmt.model()
    schema = model.model_json_schema(mode="validation", schema_generator=FileSchema)
    if fmt.adapt is not None:
        fmt.adapt(schema)
    out = {"$schema": DIALECT, "$id": f"{fmt.name}.schema.json", "title": fmt.title}
    out.update({k: v for k, v in schema.items() if k != "title"})
    out.setdefault("description", fmt.what)
    return out


def available() -> dict[str, dict[str, Any]]:
    """Every format's schema; a format whose model does not import yet is left out
    (printed on stderr), so the others can still be generated."""
    out: dict[str, dict[str, Any]] = {}
    for fmt in FORMATS:
        try:
            out[fmt.name] = schema_of(fmt)
        except ImportError as exc:
            print(f"gen_schemas: {fmt.name}: model not importable ({exc}); left out", file=sys.stderr)
    return out


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- shipped YAML


def shipped_files() -> dict[Path, str]:
    """Every shipped YAML file and the format it is in."""
    out: dict[Path, str] = {}
    for fmt in FORMATS:
        for pattern in fmt.shipped:
            for path in sorted(ROOT.glob(pattern)):
                out[path] = fmt.name
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        program = re.search(r"^program:", path.read_text(), re.M) is not None
        out.setdefault(path, "program-scenario" if program else "scenario")
    return out


def modeline(path: Path, fmt: str) -> str:
    rel = Path("..") if path.parent.parent == ROOT else Path("../..")
    return f"{MODELINE}{(rel / 'schemas' / f'{fmt}.schema.json').as_posix()}"


def with_modeline(path: Path, fmt: str) -> str:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith(MODELINE):  # one first line, however many there were
        lines = lines[1:]
    return modeline(path, fmt) + "\n" + "".join(lines)


# ---------------------------------------------------------------------------- reference pages


def _type_text(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    for key in ("anyOf", "oneOf"):
        if key in prop:
            parts = [_type_text(p) for p in prop[key]]
            return " or ".join(dict.fromkeys(p for p in parts if p))
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items") or prop.get("prefixItems")
        if isinstance(items, list):
            return "[" + ", ".join(_type_text(i) for i in items) + "]"
        return f"list of {_type_text(items)}" if items else "list"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return f"map of {_type_text(extra)}" if isinstance(extra, dict) else "mapping"
    if kind == "string" and prop.get("pattern") == UNIT_PATTERN:
        return "text with a unit"
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "any"


def _bounds(prop: dict[str, Any]) -> str:
    marks = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<",
             "minLength": "length >=", "maxLength": "length <=", "minItems": "items >=", "maxItems": "items <="}
    found = [f"{sign} {prop[key]:g}" if isinstance(prop[key], float) else f"{sign} {prop[key]}"
             for key, sign in marks.items() if key in prop]
    if "pattern" in prop and prop["pattern"] != UNIT_PATTERN:
        found.append(f"pattern `{prop['pattern']}`")
    for branch in prop.get("anyOf", []):
        if "$ref" not in branch:
            inner = _bounds(branch)
            if inner:
                found.append(inner)
    return ", ".join(found)


def _default_text(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    text = json.dumps(prop["default"])
    if isinstance(prop["default"], dict) and len(text) > 40:
        return "each field's default"  # a section: its own table lists them
    return f"`{text}`"


def _cell(text: str) -> str:
    """One table cell: one line; `<`, `>`, `&` outside code spans as entities (a
    description's `<variant>` is no HTML tag); a pipe outside code spans escaped once, as
    Python-Markdown's tables want it (`\\|`; escaped twice, the row splits)."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans (Python-Markdown keeps a code span's pipes)
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return "`".join(parts)


def _table(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    if not props:
        return ["(no fields)", ""]
    required = set(schema.get("required", []))
    lines = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, prop in props.items():
        default = "required" if name in required else _default_text(prop)
        lines.append(f"| `{name}` | {_cell(_type_text(prop))} | {_cell(default)} | {_cell(_bounds(prop))} | "
                     f"{_cell(prop.get('description', ''))} |")
    return lines + [""]


def reference_page(fmt: Format, schema: dict[str, Any]) -> str:
    lines = [
        "<!-- Generated by scripts/gen_schemas.py from the pydantic models: do not edit by hand. -->",
        f"# {fmt.title}", "",
        fmt.what, "",
        f"JSON Schema: [`schemas/{fmt.name}.schema.json`](../../../schemas/{fmt.name}.schema.json), "
        f"generated from the model `{fmt.model().__module__}.{fmt.model().__name__}`.", "",
    ]
    if fmt.shipped or fmt.name == "scenario":
        lines += [f"Editors validate and complete a file that starts with `{modeline(ROOT / 'x' / 'f.yaml', fmt.name)}`.",
                  ""]
    doc = (schema.get("description") or "").strip()
    if doc and doc != fmt.what:
        lines += [doc, ""]
    lines += ["## Top level", ""] + _table(schema)
    for name, sub in sorted(schema.get("$defs", {}).items()):
        lines += [f"## {name}", ""]
        if sub.get("description"):
            lines += [_cell(sub["description"]), ""]
        if "enum" in sub:
            lines += ["One of " + ", ".join(f"`{v}`" for v in sub["enum"]) + ".", ""]
        else:
            lines += _table(sub)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------- Python API page

API_PAGE = ROOT / "docs" / "reference" / "api.md"


def api_page() -> str:
    """The mkdocstrings page of `atlas_transport`'s public names (its lazy export table,
    grouped by module) and of its torch backend `atlas_transport.torch` where it exists."""
    import atlas_transport

    by_module: dict[str, list[str]] = {}
    for name, module in atlas_transport._TRANSPORT_EXPORTS.items():
        by_module.setdefault(module, []).append(name)
    lines = [
        "<!-- Generated by scripts/gen_schemas.py from atlas_transport's export table: do not edit by hand. -->",
        "# Python API", "",
        "The public names of `atlas_transport`, from their docstrings. Import them from the package "
        "(`from atlas_transport import connect, listen, TransportConfig`); the module each lives in is shown "
        "for reference. How to use them: [Atlas](../atlas.md).", "",
    ]
    for module, names in by_module.items():
        lines += [f"## `atlas_transport.{module}`", ""]
        for name in names:
            lines += [f"::: atlas_transport.{module}.{name}", "    options:", "      heading_level: 3", ""]
    if (ROOT / "atlas_transport" / "torch" / "__init__.py").is_file():
        lines += ["## `atlas_transport.torch`: the `atlas` torch.distributed backend", "",
                  "::: atlas_transport.torch", "    options:", "      heading_level: 3", "      show_submodules: false",
                  ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------- main


def expected_files() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    out: dict[Path, str] = {}
    schemas = available()
    for fmt in FORMATS:
        if fmt.name not in schemas:
            continue
        out[SCHEMA_DIR / f"{fmt.name}.schema.json"] = schema_text(schemas[fmt.name])
        out[REFERENCE_DIR / f"{fmt.name}.md"] = reference_page(fmt, schemas[fmt.name])
    out[API_PAGE] = api_page()
    for path, fmt in shipped_files().items():
        if fmt in schemas:
            out[path] = with_modeline(path, fmt)
    return out


def stale(expected: dict[Path, str]) -> list[Path]:
    return [path for path, text in expected.items() if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale files")
    args = parser.parse_args(argv)
    expected = expected_files()
    out_of_date = stale(expected)
    if args.check:
        for path in out_of_date:
            print(f"out of date: {path.relative_to(ROOT)} (run .venv/bin/python scripts/gen_schemas.py)")
        return 1 if out_of_date else 0
    for path in out_of_date:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())


__all__ = ["FORMATS", "FileSchema", "expected_files", "schema_of", "shipped_files", "stale"]
