"""Sweeps: one scenario run over a grid of parameter values, resumable, one folder per point.

A sweep file names a base scenario and the fields to vary by their dotted path in
the resolved scenario (`topology.wan.0.delay`, `transport.streams`,
`workload.parallelism.dp`, `bubbletea.requests.rate`; `*` selects every item of a
list, e.g. `topology.wan.*.delay`). Values are a list, `{values: [...]}` or a range
`{from: 10ms, to: 200ms, steps: 4, scale: linear|log}`. Swapping the whole topology
or workload for another file (`topology: [../topologies/2dc.yaml, ...]`) sweeps the
number of DCs or the model.

Every point is built and validated *before* anything runs, so a typo in a path, a
value of the wrong type, an empty or oversized grid, or a point whose placement is
infeasible (checked as `testbed run` does, testbed/run/preflight.py) is refused with
the file, the field and what is allowed, instead of surfacing an hour into the sweep.

Each point runs in `OUT/<id>/` (id: index and values, e.g.
`p003-delay=50ms-streams=8`) holding its fully resolved scenario, `point.json`
(parameters, seed, status, error, duration), `provenance.json` and the runner's
outputs. Where OUT is: a new folder every time by default
(`results/<sweep name>-<UTC time>`, `default_out_dir`), so that a reproduction never
lands in, or skips its points because of, a kept result (`results/<sweep name>/`,
written only by `--keep`). Resuming is explicit (`--resume OUT`, `choose_out_dir`): it
skips points whose status is ok and whose configuration is unchanged, and reruns the
rest.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator

from testbed.progress import Progress
from testbed.provenance import collect_provenance, read_provenance, write_provenance
from testbed.run.scenario import (
    ProgramScenario,
    Scenario,
    ScenarioDoc,
    ScenarioError,
    apply_override,
    resolve_scenario,
    validate_any,
)
from testbed_core.atomic import write_text_atomic
from testbed_core.configfile import ConfigModel, format_validation_error, read_yaml_mapping
from testbed_core.contracts.summary import ProgramSummary, Summary
from testbed_core.contracts.sweep import PointRecord, SweepParameter, SweepPointRef, SweepRecord

Runner = Callable[[Scenario, ScenarioDoc, Path, Progress | None], Summary]
"""Runs one point: (scenario, resolved scenario, point folder, progress) -> its summary
(written to the folder as summary.json by the runner, or else by the sweep)."""
FILE_FIELDS = ("topology", "workload")  # parameters whose string values are files to read in
POINT_FILE = "point.json"
SWEEP_FILE = "sweep.json"
RESOLVED_FILE = "scenario.resolved.yaml"
MAX_POINTS = 10_000  # runs of one sweep (points x repeats), each a whole `testbed run`
MAX_REPEAT = 1000


class SweepError(ScenarioError):
    """A sweep that cannot run; the message names the file, the field and what is allowed."""


# ---------------------------------------------------------------------------- file model


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RangeSpec(_Model):
    start: Any = Field(alias="from", description="first value, a number or a number with a unit (10ms)")
    to: Any = Field(description="last value, same unit as from")
    steps: int = Field(ge=2, le=MAX_POINTS, description="number of values, from and to included")
    # linear: evenly spaced values; log: evenly spaced logarithms
    scale: Literal["linear", "log"] = "linear"
    # the parameter's short name in point ids and tables (default: the path's last part)
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9_.]+$")


class ValuesSpec(_Model):
    values: list[Any] = Field(min_length=1)  # the values, in order
    # the parameter's short name in point ids and tables (default: the path's last part)
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9_.]+$")


_Specs = TypeVar("_Specs", bound=Mapping[str, object])


class SweepFile(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", description="letters, digits, . _ -")
    description: str = ""  # what the sweep asks, in words
    base: str = Field(description="the scenario file, relative to the sweep file")
    parameters: dict[str, Any] = Field(description="dotted path -> list of values or a range")
    # grid: every combination of the parameters' values; zip: their values side by side
    mode: Literal["grid", "zip"] = "grid"
    repeat: int | list[int] = Field(1, description="runs per point: a count (seeds seed, seed+1, ...) or a list of seeds")
    set: dict[str, Any] = Field(default_factory=dict, description="fixed overrides for every point")

    @field_validator("parameters")
    @classmethod
    def _some(cls, value: _Specs) -> _Specs:
        if not value:
            raise ValueError(
                "the grid is empty: give at least one parameter to vary, e.g. 'topology.wan.0.delay: [10ms, 50ms]'"
            )
        return value

    @field_validator("repeat")
    @classmethod
    def _repeat(cls, value: int | list[int]) -> int | list[int]:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"repeat must be a count of at least 1 or a list of seeds, got {value}")
        if isinstance(value, int) and value > MAX_REPEAT:
            raise ValueError(f"repeat: at most {MAX_REPEAT} runs per point, got {value}")
        if isinstance(value, list):
            if not value:
                raise ValueError("repeat: an empty list of seeds; give a count or at least one seed")
            if len(set(value)) != len(value):
                raise ValueError(f"repeat: seeds must be distinct, got {value}")
        return value


# ---------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Parameter:
    path: str
    label: str
    values: list[Any]


@dataclass
class SweepPoint:
    index: int
    id: str
    values: dict[str, Any]  # parameter path -> value as written in the sweep file
    seed: int
    resolved: ScenarioDoc
    config_hash: str

    def ref(self) -> SweepPointRef:
        """The point as sweep.json lists it."""
        return SweepPointRef(id=self.id, parameters=self.values, seed=self.seed)


@dataclass
class SweepPlan:
    name: str
    description: str
    source: Path
    base: Path
    mode: str
    repeat: int | list[int]
    parameters: list[Parameter]
    fixed: dict[str, Any]
    cli_overrides: dict[str, Any]
    points: list[SweepPoint] = field(default_factory=list)

    def labels(self) -> dict[str, str]:
        return {p.path: p.label for p in self.parameters}

    def describe(self, updated_at: str | None = None) -> SweepRecord:
        """What sweep.json records: enough for `testbed report` to rebuild everything."""
        return SweepRecord(
            name=self.name, description=self.description, sweep_file=str(self.source), base=str(self.base),
            mode=self.mode,  # type: ignore[arg-type]  # SweepFile.mode: grid or zip
            repeat=self.repeat,
            parameters=[SweepParameter(path=p.path, label=p.label, values=p.values) for p in self.parameters],
            fixed=self.fixed, cli_set=self.cli_overrides, points=[pt.ref() for pt in self.points],
            updated_at=updated_at,
        )


_NUMBER_UNIT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/%]*)\s*$")


def _number_unit(value: Any, where: str, key: str) -> tuple[float, str, bool]:
    if isinstance(value, bool) or value is None:
        raise SweepError(f"{where}.{key}: {value!r} is not a number (e.g. 10, 0.5 or 10ms)")
    if isinstance(value, (int, float)):
        return float(value), "", isinstance(value, int)
    m = _NUMBER_UNIT.match(str(value))
    if not m:
        raise SweepError(f"{where}.{key}: {value!r} is not a number with an optional unit (e.g. 10ms, 500Mbit)")
    return float(m.group(1)), m.group(2), False


def range_values(spec: RangeSpec, where: str) -> list[Any]:
    """The values of `{from, to, steps, scale}`, keeping the unit they were written in."""
    a, unit_a, int_a = _number_unit(spec.start, where, "from")
    b, unit_b, int_b = _number_unit(spec.to, where, "to")
    if unit_a != unit_b:
        raise SweepError(
            f"{where}: from ({spec.start!r}) and to ({spec.to!r}) must be written in the same unit"
        )
    if spec.scale == "log" and (a <= 0 or b <= 0):
        raise SweepError(f"{where}: scale log needs from and to above zero, got {spec.start!r} and {spec.to!r}")
    n = spec.steps
    if spec.scale == "log":
        xs = [a * (b / a) ** (i / (n - 1)) for i in range(n)]
    else:
        xs = [a + (b - a) * i / (n - 1) for i in range(n)]
    if int_a and int_b and not unit_a:
        if spec.scale == "log" or all(abs(x - round(x)) < 1e-9 for x in xs):
            out: list[Any] = []
            for x in xs:
                if round(x) not in out:
                    out.append(int(round(x)))
            return out
        return [round(x, 9) for x in xs]
    if not unit_a:
        return [round(x, 9) for x in xs]
    return [f"{float(f'{x:.6g}'):g}{unit_a}" for x in xs]


def parameter_values(path: str, spec: Any, where: str) -> tuple[list[Any], str | None]:
    """Values (and an optional label) of one `parameters` entry; errors say what is allowed."""
    allowed = "a list of values, {values: [...]} or a range {from: 10ms, to: 200ms, steps: 4}"
    if isinstance(spec, list):
        if not spec:
            raise SweepError(f"{where}: an empty list of values; give at least one, e.g. [10ms, 50ms]")
        return list(spec), None
    if isinstance(spec, dict):
        if "values" in spec:
            model: type[_Model] = ValuesSpec
        elif "from" in spec or "to" in spec or "steps" in spec:
            model = RangeSpec
        else:
            raise SweepError(f"{where}: expected {allowed}; got a mapping with keys {', '.join(map(str, spec))}")
        try:
            parsed = model.model_validate(spec)
        except ValidationError as exc:
            file, _, prefix = where.partition(": ")
            raise SweepError(format_validation_error(file, exc, "sweep", prefix=prefix)) from None
        if isinstance(parsed, ValuesSpec):
            return list(parsed.values), parsed.label
        return range_values(parsed, where), parsed.label
    hint = " (a single fixed value belongs under 'set:')" if spec is not None else ""
    raise SweepError(f"{where}: expected {allowed}; got {spec!r}{hint}")


def default_labels(paths: list[str], explicit: dict[str, str | None]) -> dict[str, str]:
    """Short names for folder names and table headers: the last field of each path,
    lengthened leftwards until unique (`delay`, or `wan.0.delay` and `wan.1.delay`)."""
    parts = {p: p.split(".") for p in paths}

    def suffix(path: str, k: int) -> str:
        items = parts[path]
        while k < len(items) and (items[-k].isdigit() or items[-k] == "*"):
            k += 1
        return ".".join(items[-k:])

    width = {p: 1 for p in paths}
    labels = {p: explicit.get(p) or suffix(p, 1) for p in paths}
    for _ in range(64):
        seen: dict[str, list[str]] = {}
        for p, lab in labels.items():
            seen.setdefault(lab, []).append(p)
        clashes = [ps for ps in seen.values() if len(ps) > 1]
        if not clashes:
            return labels
        for group in clashes:
            for p in group:
                if explicit.get(p):
                    continue
                width[p] += 1
                labels[p] = suffix(p, width[p])
    return labels


def _slug(text: str, limit: int = 40) -> str:
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "_", text).strip("_")
    return text[:limit] or "x"


def format_value(path: str, value: Any, position: int) -> str:
    """How a value appears in a point id."""
    if path in FILE_FIELDS and isinstance(value, str):
        return _slug(Path(value).stem)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return _slug(f"{value:g}")
    if isinstance(value, (int, str)):
        return _slug(str(value))
    return f"v{position + 1}"


def expand_path(data: ScenarioDoc, path: str) -> list[str]:
    """Concrete paths for `path`, with each `*` standing for every index of a list."""
    parts = path.split(".")
    if "*" not in parts:
        return [path]
    results = [([], data)]
    for part in parts:
        nxt = []
        for prefix, node in results:
            if part == "*" and isinstance(node, list):
                nxt.extend((prefix + [str(i)], item) for i, item in enumerate(node))
            elif isinstance(node, dict) and part in node:
                nxt.append((prefix + [part], node[part]))
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                nxt.append((prefix + [part], node[int(part)]))
            else:
                nxt.append((prefix + [part], None))  # apply_override will say what is wrong
        results = nxt
    if not results:
        raise SweepError(f"{path}: '*' matches no item (the list is empty)")
    return [".".join(p) for p, _ in results]


def config_hash(data: ScenarioDoc) -> str:
    canon = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def _read_file_value(value: str, sweep_dir: Path, kind: str, where: str) -> ScenarioDoc:
    path = Path(value) if Path(value).is_absolute() else sweep_dir / value
    try:
        data = read_yaml_mapping(path, kind, SweepError)
    except SweepError as exc:
        raise SweepError(f"{where}: {exc}") from None
    data["_source"] = str(path)
    return data


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


class _Builder:
    """Applies a point's overrides to the resolved base, in a fixed order: whole-file
    swaps first, then the sweep's `set`, then `--set`, then the swept fields."""

    def __init__(self, source: Path, base: ScenarioDoc, fixed: dict[str, Any], cli: dict[str, Any]) -> None:
        self.source = source
        self.base = base
        self.fixed = fixed
        self.cli = cli

    def build(self, values: dict[str, Any], seed: int | None) -> ScenarioDoc:
        data = copy.deepcopy(self.base)
        where = f"{self.source}: parameters"
        for path, value in values.items():
            if path in FILE_FIELDS and isinstance(value, str):
                data[path] = _read_file_value(value, self.source.parent, path, f"{where}.{path}")
        for path, value in self.fixed.items():
            for concrete in expand_path(data, path):
                apply_override(data, concrete, copy.deepcopy(value), source=f"{self.source}: set")
        for path, value in self.cli.items():
            for concrete in expand_path(data, path):
                apply_override(data, concrete, copy.deepcopy(value), source="--set")
        for path, value in values.items():
            if path in FILE_FIELDS and isinstance(value, str):
                continue
            for concrete in expand_path(data, path):
                apply_override(data, concrete, copy.deepcopy(value), source=where)
        if seed is not None:
            data["seed"] = seed
        return data


def load_sweep(path: str | Path, cli_overrides: dict[str, Any] | None = None) -> SweepPlan:
    """Reads, expands and validates a sweep; every point is a valid scenario or this raises."""
    source = Path(path)
    raw = read_yaml_mapping(source, "sweep", SweepError)
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as exc:
        raise SweepError(format_validation_error(str(source), exc, "sweep")) from None
    cli = dict(cli_overrides or {})

    params_in = []
    for p, s in spec.parameters.items():
        values, label = parameter_values(p, s, f"{source}: parameters.{p}")
        params_in.append((p, values, label))
    for where, mapping in (("set", spec.set), ("--set", cli)):
        for p in mapping:
            if p in spec.parameters:
                raise SweepError(
                    f"{source}: {where}: {p} is also a swept parameter; fix it in one place only"
                )
    if "seed" in spec.parameters and spec.repeat != 1:
        raise SweepError(f"{source}: repeat: cannot be combined with a swept 'seed' parameter; use one or the other")
    if spec.mode == "zip":
        lengths = {p: len(v) for p, v, _ in params_in}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{p}: {n}" for p, n in lengths.items())
            raise SweepError(
                f"{source}: mode: zip pairs the i-th values of every parameter, so all lists must be "
                f"equally long; got {detail} (or use mode: grid)"
            )
    runs = len(spec.repeat) if isinstance(spec.repeat, list) else spec.repeat
    points = max(len(v) for _, v, _ in params_in)
    if spec.mode == "grid":
        points = 1
        for _, values, _ in params_in:
            points *= len(values)
    if points * runs > MAX_POINTS:
        sizes = " x ".join(str(len(v)) for _, v, _ in params_in) + (f" x {runs} repeats" if runs > 1 else "")
        raise SweepError(
            f"{source}: parameters: the sweep has {points * runs} runs ({sizes}), more than {MAX_POINTS}; "
            "sweep fewer values, split it into several sweeps, or use mode: zip"
        )
    labels = default_labels([p for p, _, _ in params_in], {p: lab for p, _, lab in params_in})
    parameters = [Parameter(p, labels[p], v) for p, v, _ in params_in]

    base_path = Path(spec.base) if Path(spec.base).is_absolute() else source.parent / spec.base
    try:
        base = resolve_scenario(base_path)
    except ScenarioError as exc:
        raise SweepError(f"{source}: base: {exc}") from None
    builder = _Builder(source, base, spec.set, cli)

    def check(data_values: dict[str, Any], seed: int | None, what: str) -> tuple[ScenarioDoc, Scenario | ProgramScenario]:
        try:
            data = builder.build(data_values, seed)
        except SweepError:
            raise
        except ScenarioError as exc:  # an unknown path: the message already names file and field
            raise SweepError(str(exc)) from None
        try:
            return data, validate_any(data)  # a program scenario too (testbed/run/program.py)
        except ScenarioError as exc:
            raise SweepError(f"{what} is not a valid scenario:\n{_indent(str(exc))}") from None

    # Each value alone first, so an error names the parameter and value at fault.
    for param in parameters:
        for value in param.values:
            check({param.path: value}, None, f"{source}: parameters.{param.path}: value {value!r}")

    if spec.mode == "grid":
        combos = list(itertools.product(*[range(len(p.values)) for p in parameters]))
    else:
        combos = [tuple([i] * len(parameters)) for i in range(len(parameters[0].values))]
    seeds: list[int | None]
    if isinstance(spec.repeat, list):
        seeds = list(spec.repeat)
    elif spec.repeat > 1:
        first = builder.build({}, None).get("seed", Scenario.model_fields["seed"].default)
        seeds = [int(first) + i for i in range(spec.repeat)]
    else:
        seeds = [None]
    total = len(combos) * len(seeds)
    width = max(3, len(str(total)))
    plan = SweepPlan(
        name=spec.name, description=spec.description, source=source, base=base_path, mode=spec.mode,
        repeat=spec.repeat, parameters=parameters, fixed=spec.set, cli_overrides=cli,
    )
    # every point's placements and variants, as `testbed run` checks them (once per distinct shape)
    from testbed.run.preflight import (
        available_memory_bytes,
        point_memory_problem,
        preflight,
        shape_key,
    )

    available = available_memory_bytes()

    verdicts: dict[str, list[str]] = {}
    index = 0
    for combo in combos:
        values = {p.path: p.values[i] for p, i in zip(parameters, combo, strict=True)}
        tag = "-".join(f"{p.label}={format_value(p.path, p.values[i], i)}" for p, i in zip(parameters, combo, strict=True))
        for seed in seeds:
            index += 1
            pid = f"p{index:0{width}d}-{tag}" + (f"-seed={seed}" if len(seeds) > 1 else "")
            described = ", ".join(f"{k}={v!r}" for k, v in values.items())
            data, scenario = check(values, seed, f"{source}: point {pid} ({described})")
            if not isinstance(scenario, Scenario):  # a program: nothing to place or predict
                plan.points.append(SweepPoint(index, pid, values, scenario.seed, data, config_hash(data)))
                continue
            key = shape_key(scenario)
            if key not in verdicts:
                verdicts[key] = preflight(scenario, machine=False, memory=False)
            problems = verdicts[key] or [p for p in [point_memory_problem(scenario, available)] if p]
            if problems:
                raise SweepError(f"{source}: point {pid} ({described}) cannot run (nothing was built):\n"
                                 + "\n".join(f"  - {p}" for p in problems))
            plan.points.append(SweepPoint(index, pid, values, scenario.seed, data, config_hash(data)))
    return plan


# ---------------------------------------------------------------------------- running


@dataclass
class PointOutcome:
    id: str
    status: str  # ok | failed | interrupted | skipped
    duration_s: float | None = None
    error: str | None = None


def default_runner(scenario: Scenario, resolved: ScenarioDoc, out_dir: Path, progress: Progress | None) -> Summary:
    """`testbed run`'s scenario runner, imported only when a point runs (a program
    scenario's: testbed/run/program.py)."""
    if not isinstance(scenario, Scenario):
        from testbed.run.program import run_program_scenario

        return run_program_scenario(scenario, resolved, out_dir, progress)  # type: ignore[return-value]
    from testbed.run.runner import run_scenario

    return run_scenario(scenario, resolved, out_dir, progress=progress)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_point(folder: Path) -> PointRecord | None:
    """The point's record (point.json); None when there is none, or it is unreadable or
    not a point record (the point then runs again)."""
    try:
        return PointRecord.model_validate_json((folder / POINT_FILE).read_text())
    except (OSError, ValidationError):
        return None


def _write_json(path: Path, record: PointRecord | SweepRecord) -> None:
    write_text_atomic(path, json.dumps(record.to_data(), indent=2, default=str) + "\n")


def is_finished(folder: Path, point: SweepPoint) -> bool:
    """Done already: status ok, same configuration, and its summary is there."""
    record = read_point(folder)
    return bool(
        record
        and record.status == "ok"
        and record.config_hash == point.config_hash
        and (folder / "summary.json").exists()
    )


def execute_point(point: SweepPoint, folder: Path, runner: Runner, progress: Progress | None = None) -> PointOutcome:
    """Runs one point in `folder`, recording everything; exceptions become a failed point."""
    folder = Path(folder)
    previous = read_point(folder) if folder.exists() else None
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    resolved = point.resolved
    (folder / RESOLVED_FILE).write_text(yaml.safe_dump(resolved, sort_keys=False))
    record = PointRecord(
        id=point.id, index=point.index, parameters=point.values, seed=point.seed, status="running", error=None,
        started_at=_now(), finished_at=None, duration_s=None,
        attempts=(previous.attempts if previous is not None else 0) + 1, config_hash=point.config_hash,
        pid=os.getpid(),
    )
    _write_json(folder / POINT_FILE, record)
    write_provenance(folder / "provenance.json", collect_provenance(seed=point.seed))
    began = time.monotonic()
    status, error = "ok", None
    try:
        scenario = validate_any(resolved)
        summary = runner(scenario, resolved, folder, progress)  # type: ignore[arg-type]
        if not isinstance(summary, (Summary, ProgramSummary)):
            raise RuntimeError(f"the runner returned {type(summary).__name__}, not a Summary "
                               "(testbed_core/contracts/summary.py)")
        if not (folder / "summary.json").exists():
            (folder / "summary.json").write_text(summary.to_json())
        if summary.delay_backend:
            prov = read_provenance(folder / "provenance.json")
            write_provenance(folder / "provenance.json", prov.model_copy(update={"delay_backend": summary.delay_backend}))
    except Exception as exc:  # a failed point is recorded and the sweep goes on
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        (folder / "traceback.txt").write_text(traceback.format_exc())
    except BaseException:  # Ctrl-C, SystemExit: record, then let the sweep stop
        _write_json(folder / POINT_FILE, record.model_copy(update=dict(
            status="interrupted", error="interrupted", finished_at=_now(),
            duration_s=round(time.monotonic() - began, 3))))
        raise
    duration = time.monotonic() - began
    _write_json(folder / POINT_FILE, record.model_copy(update=dict(
        status=status, error=error, finished_at=_now(), duration_s=round(duration, 3))))
    return PointOutcome(point.id, status, duration, error)


def _child_main(point: SweepPoint, folder: str, runner: Runner) -> None:
    from testbed_runtime.lifetime import die_with_parent

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:  # the sweep killed: so is this point's run (SIGKILL, as
        die_with_parent(parent.pid)  # the sweep was: `testbed clean` then removes both at once, nothing races it)
    outcome = execute_point(point, Path(folder), runner, None)
    raise SystemExit(0 if outcome.status == "ok" else 3)


def prepare_out_dir(plan: SweepPlan, out_dir: Path) -> list[str]:
    """Creates or reuses `out_dir`; returns ids of point folders no longer in the plan."""
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = out_dir / SWEEP_FILE
    if existing.exists():
        old = _sweep_name(existing)
        if old not in (None, plan.name):
            raise SweepError(
                f"{out_dir}: holds the results of sweep {old!r}, not {plan.name!r}; choose another --out"
            )
    elif any(p for p in out_dir.iterdir() if not p.name.startswith(".")):
        raise SweepError(
            f"{out_dir}: not empty and not a sweep result folder (no {SWEEP_FILE}); choose an empty or new --out"
        )
    _write_json(existing, plan.describe(updated_at=_now()))
    write_provenance(out_dir / "provenance.json", collect_provenance())
    wanted = {pt.id for pt in plan.points}
    return sorted(
        p.name for p in out_dir.iterdir() if p.is_dir() and (p / POINT_FILE).exists() and p.name not in wanted
    )


def _sweep_name(path: Path) -> str | None:
    """The name of the sweep whose sweep.json is at `path` (None: unreadable JSON, which
    this sweep overwrites); a JSON file that is not a sweep's is refused."""
    try:
        return SweepRecord.model_validate_json(path.read_text()).name
    except OSError:
        return None
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return None
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise SweepError(f"{path}: not the sweep.json of a `testbed sweep` ({where}); choose another --out "
                         "or remove the file") from None


def run_sweep(
    plan: SweepPlan,
    out_dir: str | Path,
    *,
    jobs: int = 1,
    runner: Runner | None = None,
    progress: Progress | None = None,
    lock: str | Path | None = None,
) -> list[PointOutcome]:
    """Runs every unfinished point of `plan` under `out_dir`; returns one outcome per point.
    With `lock`, each point holds an exclusive flock on that file while it runs (and the
    sweep waits for it between points), so that emulations started by others on a shared
    machine with the same lock (`flock FILE testbed run ...`) never run beside a point."""
    out_dir = Path(out_dir)
    runner = runner or default_runner
    jobs = max(1, int(jobs))
    if lock is not None and jobs > 1:
        raise SweepError(f"--lock {lock} holds one lock per point, so points run one at a time: drop --jobs {jobs}")
    if jobs > 1:
        try:
            pickle.dumps(runner)
        except Exception as exc:
            raise SweepError(f"--jobs {jobs} runs points in separate processes, so the runner must be "
                             f"importable by name ({exc})") from None
    stale = prepare_out_dir(plan, out_dir)
    own_progress = progress is None
    progress = progress or Progress(len(plan.points), f"sweep {plan.name}", jobs=jobs)
    if stale:
        progress.log(f"{len(stale)} result folder(s) in {out_dir} are not points of this sweep any more "
                     f"and are left out of the report: {', '.join(stale[:5])}{' ...' if len(stale) > 5 else ''}")
    outcomes: dict[str, PointOutcome] = {}
    todo: list[SweepPoint] = []
    for point in plan.points:
        if is_finished(out_dir / point.id, point):
            outcomes[point.id] = PointOutcome(point.id, "skipped")
            progress.skip(point.id)
        else:
            todo.append(point)
    try:
        if jobs == 1:
            for k, point in enumerate(todo):
                if lock is not None and k:
                    time.sleep(LOCK_GAP_S)  # let an emulation waiting for the lock take it first
                with point_lock(lock, progress):
                    progress.start(point.id)
                    child = progress.child(point.id)
                    result = execute_point(point, out_dir / point.id, runner, child)
                    child.close()
                outcomes[point.id] = result
                progress.done(point.id, ok=result.status == "ok", duration=result.duration_s,
                              note=_short(result.error))
        else:
            _run_parallel(todo, out_dir, runner, jobs, progress, outcomes)
    finally:
        if own_progress:
            progress.close()
    return [outcomes[p.id] for p in plan.points if p.id in outcomes]


LOCK_GAP_S = 2.0
"""With --lock, the pause between one point's release of the lock and the next point's
request: a flock is not fair, and a sweep asking again at once would keep taking it ahead
of an emulation that waited through the whole point."""


@contextlib.contextmanager
def point_lock(path: str | Path | None, progress: Progress):
    """An exclusive flock on `path` (created if missing) for one point; nothing without one."""
    if path is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise SweepError(f"--lock {path}: cannot open the lock file ({exc.strerror}); name a file in a "
                         "writable folder, e.g. /tmp/emulation.lock") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.log(f"waiting for the lock {path} (another emulation holds it)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def _short(error: str | None, limit: int = 100) -> str:
    if not error:
        return ""
    line = error.splitlines()[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _run_parallel(
    todo: list[SweepPoint], out_dir: Path, runner: Runner, jobs: int, progress: Progress,
    outcomes: dict[str, PointOutcome],
) -> None:
    """One fresh process per point (its own emulation, its own prefix), `jobs` at a time."""
    ctx = multiprocessing.get_context("spawn")
    queue = list(todo)
    live: dict[Any, tuple[SweepPoint, Any, float]] = {}
    try:
        while queue or live:
            while queue and len(live) < jobs:
                point = queue.pop(0)
                proc = ctx.Process(
                    target=_child_main, args=(point, str(out_dir / point.id), runner),
                    name=f"sweep-{point.id}", daemon=False,
                )
                progress.start(point.id)
                proc.start()
                live[proc.sentinel] = (point, proc, time.monotonic())
            ready = multiprocessing.connection.wait(list(live), timeout=1.0)
            progress.tick()
            for sentinel in ready:
                point, proc, began = live.pop(sentinel)
                proc.join()
                outcome = _outcome_from_disk(out_dir / point.id, point, proc.exitcode, time.monotonic() - began)
                outcomes[point.id] = outcome
                progress.done(point.id, ok=outcome.status == "ok", duration=outcome.duration_s,
                              note=_short(outcome.error))
    finally:
        for point, proc, began in live.values():
            proc.terminate()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
            record = read_point(out_dir / point.id)
            if record and record.status == "running":
                _write_json(out_dir / point.id / POINT_FILE, record.model_copy(update=dict(
                    status="interrupted", error="interrupted", finished_at=_now(),
                    duration_s=round(time.monotonic() - began, 3))))


def _outcome_from_disk(folder: Path, point: SweepPoint, exitcode: int | None, elapsed: float) -> PointOutcome:
    record = read_point(folder)
    if record and record.status in ("ok", "failed"):
        return PointOutcome(point.id, record.status, record.duration_s, record.error)
    error = f"the point's process exited with code {exitcode} before recording a result (killed or crashed)"
    folder.mkdir(parents=True, exist_ok=True)
    done = dict(status="failed", error=error, finished_at=_now(), duration_s=round(elapsed, 3))
    if record is None:
        record = PointRecord(id=point.id, index=point.index, parameters=point.values, seed=point.seed,
                             config_hash=point.config_hash, attempts=1, **done)  # type: ignore[arg-type]
    else:
        record = record.model_copy(update=done)
    _write_json(folder / POINT_FILE, record)
    return PointOutcome(point.id, "failed", elapsed, error)


KEPT_MARK = "kept.json"  # testbed/report/keep.py writes it in every kept folder


def default_out_dir(plan: SweepPlan, now: datetime | None = None) -> Path:
    """A new folder for this run: results/<sweep name>-<UTC time>, e.g.
    results/sweep-rtt-20261204-212000Z (a suffix -2, -3 ... if that one exists). Never
    the kept folder results/<sweep name>/, which only --keep writes."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%SZ")
    base = Path("results") / f"{plan.name}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def choose_out_dir(plan: SweepPlan, out: Path | None, resume: Path | None) -> Path:
    """The folder a `testbed sweep` writes to: `--resume DIR` continues the sweep in DIR
    (which must hold this sweep's results and not be a kept result), `--out DIR` starts
    one in a new or empty DIR, neither starts one in `default_out_dir`. SweepError
    saying which option to use otherwise."""
    if out is not None and resume is not None:
        raise SweepError("--out and --resume both name the result folder: --resume DIR continues the sweep in "
                         "DIR, --out DIR starts a new one there; give one of them")
    if resume is not None:
        if not (resume / SWEEP_FILE).is_file():
            what = "does not exist" if not resume.exists() else f"holds no {SWEEP_FILE}"
            raise SweepError(f"--resume {resume}: {what}, so there is no sweep to resume; give the folder an "
                             "earlier `testbed sweep` wrote (it printed `-> DIR`), or drop --resume to start anew")
        if (resume / KEPT_MARK).exists():
            raise SweepError(f"--resume {resume}: this is a kept result ({KEPT_MARK}), which a run never writes "
                             "into; run the sweep into a new folder (drop --resume) and keep it with --keep")
        old = _sweep_name(resume / SWEEP_FILE)
        if old not in (None, plan.name):
            raise SweepError(f"--resume {resume}: holds the results of sweep {old!r}, not {plan.name!r}; "
                             "give the folder of this sweep, or drop --resume to start anew")
        return resume
    if out is None:
        return default_out_dir(plan)
    if (out / KEPT_MARK).exists():
        raise SweepError(f"--out {out}: this is a kept result ({KEPT_MARK}), which a run never writes into; "
                         "choose a new folder (or leave --out out: a new results/<sweep>-<time>/) and keep "
                         "the result with --keep")
    if (out / SWEEP_FILE).exists():
        raise SweepError(f"--out {out}: holds a sweep's results already; to continue that sweep pass "
                         f"--resume {out}, to start afresh choose a new folder (or leave --out out)")
    return out


def sweep_size_text(plan: SweepPlan) -> str:
    shape = " x ".join(f"{len(p.values)} {p.label}" for p in plan.parameters)
    reps = plan.repeat if isinstance(plan.repeat, int) else len(plan.repeat)
    seeds = f" x {reps} seeds" if reps > 1 else ""
    joiner = "zipped" if plan.mode == "zip" and len(plan.parameters) > 1 else ""
    return f"{len(plan.points)} points ({joiner + ' ' if joiner else ''}{shape}{seeds})"


__all__ = [
    "PointOutcome", "Parameter", "RangeSpec", "Runner", "SweepError", "SweepFile", "SweepPlan", "SweepPoint",
    "ValuesSpec", "choose_out_dir", "config_hash", "default_out_dir", "default_runner", "execute_point", "is_finished", "load_sweep",
    "parameter_values", "range_values", "read_point", "run_sweep", "sweep_size_text",
]
