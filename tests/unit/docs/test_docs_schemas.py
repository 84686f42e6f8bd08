"""The JSON Schemas under schemas/ against the pydantic models they come from, the shipped
YAML files against their schemas, and a generic JSON-Schema validator against the
toolkit's own errors (both must name the same field)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from docs_generator import load_generator
from jsonschema.exceptions import best_match
from pydantic import BaseModel

from testbed.run.scenario import ScenarioError, load_scenario
from testbed_core.configfile import read_yaml

ROOT = Path(__file__).resolve().parents[3]


def test_committed_schemas_and_references_match_the_models(gen):
    stale = gen.stale(gen.expected_files())
    names = [str(p.relative_to(ROOT)) for p in stale]
    assert not stale, (f"out of date with the models: {names}; run .venv/bin/python scripts/gen_schemas.py "
                       "and commit the result")


def test_every_file_format_has_a_committed_schema(gen, schemas):
    expected = {"topology", "workload", "scenario", "sweep", "whatif-grid", "inventory", "servers", "summary"}
    assert expected <= set(schemas), f"formats without a model-generated schema: {expected - set(schemas)}"
    for name in schemas:
        path = ROOT / "schemas" / f"{name}.schema.json"
        assert path.is_file(), f"{path} is missing"
        doc = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(doc)
        assert doc["$schema"] == gen.DIALECT


def test_a_changed_model_is_caught(gen):
    """The staleness check is real: a schema that differs from its model is reported."""
    expected = gen.expected_files()
    path = ROOT / "schemas" / "topology.schema.json"
    changed = dict(expected)
    changed[path] = expected[path].replace('"dcs"', '"datacenters"', 1)
    assert path in gen.stale(changed)


@pytest.mark.parametrize("path", sorted(load_generator().shipped_files()),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_yaml_names_its_schema_and_validates(path: Path, gen, schemas):
    fmt = gen.shipped_files()[path]
    first, second = (path.read_text().splitlines() + [""])[:2]
    assert first == gen.modeline(path, fmt), f"{path}: first line must be {gen.modeline(path, fmt)!r}"
    assert not second.startswith(gen.MODELINE), f"{path}: names its schema twice"
    schema_path = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert schema_path == (ROOT / "schemas" / f"{fmt}.schema.json").resolve()
    data = read_yaml(path, fmt)
    errors = sorted(jsonschema.Draft202012Validator(schemas[fmt]).iter_errors(data), key=str)
    assert not errors, f"{path}: {[(list(e.absolute_path), e.message) for e in errors[:3]]}"


def test_kept_summaries_validate_against_the_summary_schema(schemas):
    kept = sorted(ROOT.glob("docs/**/*summary.json")) + sorted(ROOT.glob("results/*/p*/summary.json"))
    assert kept
    for path in kept:
        doc = json.loads(path.read_text())
        fmt = "program-summary" if doc.get("kind") == "program" else "summary"
        errors = list(jsonschema.Draft202012Validator(schemas[fmt]).iter_errors(doc))
        assert not errors, f"{path}: {[(list(e.absolute_path), e.message[:200]) for e in errors[:3]]}"


# ---------------------------------------------------------------------------- same field named


def _schema_fields(schema: dict, data: dict) -> set[str]:
    """The dotted fields a JSON-Schema validator finds wrong in `data`."""
    out: set[str] = set()
    for top in jsonschema.Draft202012Validator(schema).iter_errors(data):
        err = best_match([top])  # into an anyOf (a path or a mapping): the branch that fits best
        where = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            out |= {f"{where}.{k}" if where else k for k in extra}
        else:
            out.add(where)
    return out


def _toolkit_fields(path: Path) -> set[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    lines = [line.strip() for line in str(info.value).splitlines() if line.strip().startswith("- ")]
    return {line[2:].split(":", 1)[0] for line in lines}


def _shipped_scenario() -> dict:
    path = ROOT / "scenarios" / "quickstart.yaml"
    data = read_yaml(path, "scenario")
    for key in ("topology", "workload"):
        if isinstance(data[key], str):
            data[key] = str((path.parent / data[key]).resolve())
    return data


@pytest.mark.parametrize("dotted, value, field", [
    ("runner.no_such_setting", 1, "runner.no_such_setting"),  # an unknown key
    ("not_a_field", True, "not_a_field"),
    ("transport.streams", "many", "transport.streams"),  # a wrong type
    ("seed", "one", "seed"),
    ("runner.calibration_transfers", "four", "runner.calibration_transfers"),
    ("workload.iterations", "two", "workload.iterations"),
    ("bubbletea.requests.rate", [40], "bubbletea.requests.rate"),
])
def test_a_malformed_scenario_fails_both_ways_naming_the_same_field(tmp_path, schemas, dotted, value, field):
    good = _shipped_scenario()
    assert not _schema_fields(schemas["scenario"], good)
    bad = copy.deepcopy(good)
    node = bad
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(bad))
    assert _schema_fields(schemas["scenario"], bad) == {field}
    assert _toolkit_fields(path) == {field}


def test_units_as_text_and_host_counts_validate(schemas):
    """Where a file accepts more than a field's type (units as text, a host count), so does
    the schema; text that is not a number with a unit does not."""
    validator = jsonschema.Draft202012Validator(schemas["topology"])
    topo = {"name": "t", "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": ["x"]}],
            "wan": [{"between": ["a", "b"], "rate": "2.5Gbps", "delay": "25ms", "loss": "0.1%", "queue": "4MB"}]}
    assert not list(validator.iter_errors(topo))
    topo["wan"][0]["rate"] = "fast"
    assert [list(e.absolute_path) for e in validator.iter_errors(topo)] == [["wan", 0, "rate"]]


# Every field of every model has a description: `Field(description=...)`, an attribute
# docstring, or a comment on its line or right above it (scripts/gen_schemas.py
# `field_notes`). A new field comes with its description.


def _undescribed(schema: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    parts = [(schema.get("title", ""), schema)] + [(d.get("title", n), d) for n, d in schema.get("$defs", {}).items()]
    for name, part in parts:
        missing = sum(1 for p in part.get("properties", {}).values() if not p.get("description"))
        if missing:
            out[name] = out.get(name, 0) + missing
    return out


# The formats' names, not `available()`: that generates every schema (about 3 CPU seconds,
# the models' sources read for their field notes) in each process that collects this file.
@pytest.mark.parametrize("fmt", sorted(f.name for f in load_generator().FORMATS))
def test_every_field_has_a_description(fmt: str, schemas) -> None:
    if fmt not in schemas:  # its model does not import: test_every_file_format_has_a_committed_schema names it
        pytest.skip(f"{fmt}: its model does not import")
    top_title = schemas[fmt].get("title", "")
    found = _undescribed(schemas[fmt])
    model = load_generator().FORMATS[[f.name for f in load_generator().FORMATS].index(fmt)].model().__name__
    if top_title in found:  # the top level is named by its model's class
        found[model] = found.pop(top_title) + found.get(model, 0)
    assert not found, (f"{fmt}: fields without a description, per model: {found}; give each one "
                       "(Field(description=...), an attribute docstring, or a comment beside it)")


def test_the_description_check_is_real() -> None:
    schema = {"title": "T", "properties": {"a": {"type": "int"}, "b": {"description": "b"}},
              "$defs": {"X": {"title": "X", "properties": {"c": {}}}}}
    assert _undescribed(schema) == {"T": 1, "X": 1}


class _NoDocstring(BaseModel):
    # the comment above a class's first field
    first: int = 0
    second: int = 0  # a comment at the end of its line


class _WithDocstring(BaseModel):
    """A docstring."""

    # above the first field, after the docstring
    first: int = 0
    second: int = 0
    """an attribute docstring"""


def test_field_notes_read_each_place_a_description_is_written(gen) -> None:
    assert gen.field_notes(_NoDocstring) == {"first": "the comment above a class's first field",
                                             "second": "a comment at the end of its line"}
    assert gen.field_notes(_WithDocstring) == {"first": "above the first field, after the docstring",
                                               "second": "an attribute docstring"}
