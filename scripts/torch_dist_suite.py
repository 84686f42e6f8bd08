#!/usr/bin/env python3
"""PyTorch's own distributed test suite as the judge of the atlas backend (issue 37).

    .venv/bin/python scripts/torch_dist_suite.py                      (make torch-suite)
    .venv/bin/python scripts/torch_dist_suite.py --backends atlas --world-sizes 3 -k any_source
    .venv/bin/python scripts/torch_dist_suite.py --list               (the selection, by category)
    .venv/bin/python scripts/torch_dist_suite.py --table results/torch-dist-suite   (tables again)

Runs the tests of `torch.testing._internal.distributed.distributed_test` (class
DistributedTest._DistTestBase, the suite PyTorch's CI runs for gloo on CPU through
test/distributed/test_distributed_spawn.py) through tests/torch_suite/, once per backend
and world size, on CPU. For atlas, that module imports `atlas_transport.torch` and
declares atlas in `DistTestCases.backend_feature` ("plugin", "ddp", "subgroup", "gpu",
"cuda": torch's own door for a third-party backend, each a claim the backend makes);
nothing else differs from the gloo run.

The selection (`--select`, default "collectives,p2p,ddp") goes by test name, each test in
the first category whose pattern matches (`CATEGORIES`); "all" takes every test, the
rest under "other". `-k REGEX` narrows it further.

Each (backend, world size) is one pytest process over the selected tests; each test
appends its outcome to a record file (tests/torch_suite/conftest.py). Torch's own per-test
timeout (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, `--timeout`) ends a test whose ranks hang;
should the pytest process itself stop making progress, it is killed with its ranks, the
test it was in is recorded as "hung", and a new process takes the rest.

Writes under --out: ``outcomes.csv`` (one row per test, backend and world size),
``suite-counts.json`` (the counts, and each test that passes with gloo but not with atlas with
its reason: atlas's error, or torch's gate by backend name quoted from
distributed_test.py with its line), ``run.json`` (command, date, commit, torch version)
and the pytest logs under ``logs/``. The tables print at the end.
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
SUITE_MODULE = "tests/torch_suite/test_distributed_spawn.py"
DEFAULT_OUT = REPO / "results" / "torch-dist-suite"

# The categories, by test name; a test belongs to the first whose pattern matches.
CATEGORIES: dict[str, str] = {
    "p2p": r"^test_(send_recv|isend|irecv|batch_isend_irecv)",
    "collectives": (r"^test_(broadcast|reduce|all_reduce|sparse_all_reduce|scatter|gather"
                    r"|all_gather|all_to_all|barrier|monitored_barrier|coalescing_manager"
                    r"|nccl_backend_bool)"),
    "ddp": (r"(?i)(ddp|distributeddataparallel|syncbatchnorm|sync_bn|accumulate_gradients"
            r"|post_localsgd|static_graph|grads_same_across_ranks|output_unused_in_loss"
            r"|undefined_grad_parity|different_graph_across_ranks|verify_model_across_rank"
            r"|compute_bucket_assignment|skip_all_reduce_unused_parameters"
            r"|get_data_parallel_params)"),
}
DEFAULT_SELECT = "collectives,p2p,ddp"

# the DistTestCases.backend_feature sets tests/torch_suite/test_distributed_spawn.py declares
# atlas in (ATLAS_FEATURES there; --atlas-features overrides)
ATLAS_FEATURES = ("plugin", "ddp", "subgroup", "gpu", "cuda")

# torch.distributed's own refusals of a backend by name (not the test's gates): e.g.
# `dist.monitored_barrier` raises "monitored_barrier is only implemented for GLOO backend."
TORCH_REFUSES = re.compile(r"(only|is) (implemented|supported) (for|on|with) (the )?(GLOO|gloo|NCCL|nccl)")

# torch's own longer per-test timeouts (common_distributed.TIMEOUT_OVERRIDE)
TORCH_TIMEOUT_OVERRIDE = {"test_ddp_uneven_inputs": 400, "test_DistributedDataParallel": 500}
# how long past a test's own timeout the script waits for any progress before it kills
WATCHDOG_MARGIN_S = 120

Outcome = Literal["passed", "failed", "skipped", "hung", "not_run"]


class SuiteTest(BaseModel):
    """One test of distributed_test.py: its category and the lines that gate it by backend."""

    name: str
    category: str
    line: int
    gates: list[str]  # "L<n>: <decorator or body line naming BACKEND or a backend set>"


class TestOutcome(BaseModel):
    test: str
    category: str
    backend: str
    world_size: int
    outcome: Outcome
    duration_s: float | None = None
    message: str = ""  # a skip's reason, or a failure's error lines
    detail: str = ""  # a failure's traceback tail


class Exception_(BaseModel):
    """A test that passes with gloo and does not with atlas, at one world size."""

    test: str
    category: str
    world_size: int
    atlas_outcome: Outcome
    kind: Literal["torch gate by backend name", "skipped by torch",
                  "torch.distributed refuses by backend name", "atlas failure"]
    reason: str
    detail: str = ""
    gates: list[str]
    # the same test's outcome in the atlas-gloo-gates run (atlas in gloo's place), if any
    in_gloo_place: Outcome | None = None


class Counts(BaseModel):
    selected: int
    passed: int
    failed: int
    skipped: int
    hung: int
    not_run: int


class RunInfo(BaseModel):
    command: str
    started: str
    finished: str
    commit: str  # HEAD when the run started
    dirty_paths: list[str]  # uncommitted changes under atlas_transport/, tests/torch_suite/ then
    commit_at_end: str | None = None  # HEAD when it finished, where another commit came between
    merged: list[RunInfo] = []  # runs of other backends added by --table --merge
    torch_version: str
    python: str
    select: str
    pattern: str | None
    timeout_s: int
    start_method: str
    atlas_features: list[str]
    backends: list[str]
    world_sizes: list[int]


class Comparison(BaseModel):
    """gloo against one atlas run ("atlas" or "atlas-gloo-gates"), per world size."""

    both_pass: dict[str, int]
    exceptions: list[Exception_]
    atlas_only_pass: dict[str, list[str]]


class Summary(BaseModel):
    run: RunInfo
    # counts[backend][world_size][category or "total"]
    counts: dict[str, dict[str, dict[str, Counts]]]
    # comparisons[atlas run]: "atlas" (torch's gates, as torch runs a third-party backend)
    # and "atlas-gloo-gates" (gloo's gates: the tests gloo runs, run on atlas)
    comparisons: dict[str, Comparison]


# ---------------------------------------------------------------- the suite's tests


def distributed_test_path() -> Path:
    """torch's distributed_test.py, found without importing torch (a few seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    found = (Path(spec.origin).parent / "testing" / "_internal" / "distributed" / "distributed_test.py"
             if spec is not None and spec.origin is not None else None)
    if found is None or not found.is_file():
        raise SystemExit("torch.testing._internal.distributed.distributed_test not found: "
                         "is torch installed in this interpreter (.venv/bin/python)?")
    return found


_GATE = re.compile(r"BACKEND|backend_feature|require_backend_is_available|skip_collective"
                   r"|skip_if_no_gloo|PROFILING_SUPPORTED_BACKENDS")


def category_of(name: str) -> str:
    for category, pattern in CATEGORIES.items():
        if re.search(pattern, name):
            return category
    return "other"


def suite_tests(source_path: Path) -> list[SuiteTest]:
    """The test methods of DistributedTest._DistTestBase, in file order, with their gates:
    the decorators that name BACKEND or a backend set, and the body lines that compare
    BACKEND (quoted with their line numbers in distributed_test.py)."""
    source = source_path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    base = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            base = node
            break
    if base is None:
        raise SystemExit(f"{source_path}: no class _DistTestBase (a torch this script does not know)")
    tests: list[SuiteTest] = []
    for node in base.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        gates: list[str] = []
        for dec in node.decorator_list:
            text = " ".join(ln.strip() for ln in lines[dec.lineno - 1:dec.end_lineno])
            if _GATE.search(text):
                gates.append(f"L{dec.lineno}: {text}")
        for lineno in range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1):
            text = lines[lineno - 1].strip()
            if re.search(r"BACKEND\s*(==|!=|in|not in)|backend_feature", text):
                gates.append(f"L{lineno}: {text}")
        tests.append(SuiteTest(name=node.name, category=category_of(node.name),
                               line=node.lineno, gates=gates))
    return tests


def select_tests(tests: list[SuiteTest], select: str, pattern: str | None) -> list[SuiteTest]:
    if select == "all":
        chosen = list(tests)
    else:
        wanted = [c.strip() for c in select.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in CATEGORIES and c != "other"]
        if unknown:
            raise SystemExit(f"--select: unknown categories {unknown}; use 'all' or a comma "
                             f"list of {[*CATEGORIES, 'other']}")
        chosen = [t for t in tests if t.category in wanted]
    if pattern:
        chosen = [t for t in chosen if re.search(pattern, t.name)]
    return chosen


# ---------------------------------------------------------------- running


# The runs a backend token names: BACKEND, the gates torch's decorators decide with, and
# the environment of the run. On one host every rank is in one site, where atlas hands
# its collectives to a gloo group of the site (ATLAS_INTRA_SITE=gloo, its default):
# "atlas-own" makes atlas carry them itself (its algorithms, its channels), "atlas-sites"
# puts every rank in a site of its own (ATLAS_SITE=rank<r>), so that every collective
# crosses atlas channels the way it crosses a WAN between DCs.
RUNS: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "gloo": ("gloo", None, {}),
    "atlas": ("atlas", None, {}),
    "atlas-gloo-gates": ("atlas", "gloo", {}),
    "atlas-own": ("atlas", None, {"ATLAS_INTRA_SITE": "atlas"}),
    "atlas-sites": ("atlas", None, {"ATLAS_TORCH_SUITE_SITE_PER_RANK": "1"}),
}


def _class_name(backend: str) -> str:
    return f"TestDistBackendWithSpawn{RUNS[backend][0].upper()}NoInitFile"


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written when the process was killed
            continue
    return out


def run_config(backend: str, world_size: int, tests: list[SuiteTest], args: argparse.Namespace,
               logs: Path) -> list[TestOutcome]:
    """All `tests` with one backend and world size; one pytest process, another after a hang."""
    by_name = {t.name: t for t in tests}
    outcomes: dict[str, TestOutcome] = {}
    remaining = [t.name for t in tests]
    attempt = 0
    while remaining:
        attempt += 1
        tag = f"{backend}-ws{world_size}" + (f"-{attempt}" if attempt > 1 else "")
        record = logs / f"{tag}.jsonl"
        record.unlink(missing_ok=True)
        temp_dir = Path(tempfile.mkdtemp(prefix=f"torch-suite-{backend}-{world_size}-"))
        (temp_dir / "barrier").mkdir()
        (temp_dir / "test_dir").mkdir()
        env = dict(os.environ)
        env.pop("INIT_METHOD", None)
        for name in ("ATLAS_TORCH_SUITE_GATES_AS", "ATLAS_INTRA_SITE", "ATLAS_SITE",
                     "ATLAS_TORCH_SUITE_SITE_PER_RANK"):
            env.pop(name, None)
        if RUNS[backend][1] is not None:
            env["ATLAS_TORCH_SUITE_GATES_AS"] = RUNS[backend][1]
        env.update(RUNS[backend][2])
        env.update({
            "BACKEND": RUNS[backend][0], "WORLD_SIZE": str(world_size), "TEMP_DIR": str(temp_dir),
            "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(args.timeout),
            "ATLAS_TORCH_SUITE": "1", "ATLAS_TORCH_SUITE_RECORD": str(record),
            "ATLAS_TORCH_SUITE_START": args.start,
            "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(REPO)) if p),
        })
        if args.atlas_features is not None:
            env["ATLAS_TORCH_SUITE_FEATURES"] = args.atlas_features
        node_ids = [f"{SUITE_MODULE}::{_class_name(backend)}::{n}" for n in remaining]
        cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
               "-q", "-o", "timeout=900", *node_ids]
        print(f"[{time.strftime('%H:%M:%S')}] {backend} world_size={world_size}: "
              f"{len(remaining)} tests (log {logs / (tag + '.log')})", flush=True)
        with open(logs / f"{tag}.log", "w", encoding="utf-8") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            current: str | None = None
            last_progress = time.monotonic()
            seen = 0
            hung: str | None = None
            while proc.poll() is None:
                time.sleep(1.0)
                records = _read_records(record)
                if len(records) > seen:
                    for r in records[seen:]:
                        current = r["test"] if r["event"] == "start" else None
                    seen = len(records)
                    last_progress = time.monotonic()
                limit = max(args.timeout, TORCH_TIMEOUT_OVERRIDE.get(current or "", 0))
                # the first test also waits for the forkserver to import torch and the suite
                limit += WATCHDOG_MARGIN_S + (120 if seen <= 1 else 0)
                if time.monotonic() - last_progress > limit:
                    hung = current
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
        shutil.rmtree(temp_dir, ignore_errors=True)
        records = _read_records(record)
        started = [r["test"] for r in records if r["event"] == "start"]
        for r in records:
            if r["event"] == "end" and r["test"] in by_name:
                outcomes[r["test"]] = TestOutcome(
                    test=r["test"], category=by_name[r["test"]].category, backend=backend,
                    world_size=world_size, outcome=r["outcome"], duration_s=r.get("duration_s"),
                    message=r.get("message", ""), detail=r.get("detail", ""))
        unfinished = [n for n in started if n not in outcomes]
        for name in unfinished:  # killed by the watchdog, or its process died under it
            why = (f"no progress for {limit} s: killed with its ranks by {Path(__file__).name}"
                   if name == hung else
                   f"the pytest process ended during this test (exit status {proc.returncode}); "
                   f"see {logs / (tag + '.log')}")
            outcomes[name] = TestOutcome(test=name, category=by_name[name].category,
                                         backend=backend, world_size=world_size,
                                         outcome="hung" if name == hung else "failed",
                                         message=why)
        before = len(remaining)
        remaining = [n for n in remaining if n not in outcomes]
        if remaining and len(remaining) == before:
            tail = (logs / f"{tag}.log").read_text(encoding="utf-8", errors="replace")[-2000:]
            for name in remaining:
                outcomes[name] = TestOutcome(test=name, category=by_name[name].category,
                                             backend=backend, world_size=world_size,
                                             outcome="not_run",
                                             message=f"pytest ran no test: {tail}")
            remaining = []
    return [outcomes[t.name] for t in tests]


# ---------------------------------------------------------------- comparing


def counts_of(rows: list[TestOutcome]) -> Counts:
    c = Counter(r.outcome for r in rows)
    return Counts(selected=len(rows), passed=c["passed"], failed=c["failed"],
                  skipped=c["skipped"], hung=c["hung"], not_run=c["not_run"])


def gates_for(message: str, gates: list[str]) -> list[str]:
    """The gate lines that gave this skip message: those quoting its text (f-strings and
    all), else torch's `require_backend_is_available` for its "Test requires backend"
    message; all the test's gates when none is recognised."""
    def words(text: str) -> str:
        return " ".join(w for w in re.split(r"[^A-Za-z_]+", text) if len(w) > 2)

    head = " ".join(words(message.split("{")[0]).split()[:4])
    matched = [g for g in gates if head and head in words(g)]
    if not matched and message.startswith("Test requires backend"):
        matched = [g for g in gates if "require_backend_is_available" in g]
    return matched or gates


def compare(tests: list[SuiteTest], outcomes: list[TestOutcome], label: str) -> Comparison:
    """gloo against the atlas run `label`: which pass with both, which with gloo only (and
    why), which with atlas only."""
    by_name = {t.name: t for t in tests}
    index = {(o.backend, o.world_size, o.test): o for o in outcomes}
    world_sizes = sorted({o.world_size for o in outcomes})
    both: dict[str, int] = {}
    exceptions: list[Exception_] = []
    atlas_only: dict[str, list[str]] = {}
    for ws in world_sizes:
        if not any(o.backend == label and o.world_size == ws for o in outcomes):
            continue
        both[str(ws)] = 0
        atlas_only[str(ws)] = []
        for t in tests:
            gloo = index.get(("gloo", ws, t.name))
            atlas = index.get((label, ws, t.name))
            if gloo is None or atlas is None:
                continue
            if gloo.outcome == "passed" and atlas.outcome == "passed":
                both[str(ws)] += 1
            elif gloo.outcome == "passed":
                gates = gates_for(atlas.message, by_name[t.name].gates)
                if atlas.outcome == "skipped" and gates and label != "atlas-gloo-gates":
                    kind = "torch gate by backend name"
                elif atlas.outcome == "skipped":
                    kind = "skipped by torch"
                elif TORCH_REFUSES.search(atlas.message):
                    kind = "torch.distributed refuses by backend name"
                else:
                    kind = "atlas failure"
                exceptions.append(Exception_(test=t.name, category=t.category, world_size=ws,
                                             atlas_outcome=atlas.outcome, kind=kind,
                                             reason=atlas.message, detail=atlas.detail,
                                             gates=gates))
            elif atlas.outcome == "passed":
                atlas_only[str(ws)].append(t.name)
    return Comparison(both_pass=both, exceptions=exceptions, atlas_only_pass=atlas_only)


def summarize(tests: list[SuiteTest], outcomes: list[TestOutcome], run: RunInfo) -> Summary:
    counts: dict[str, dict[str, dict[str, Counts]]] = {}
    for backend in run.backends:
        counts[backend] = {}
        for ws in run.world_sizes:
            rows = [o for o in outcomes if o.backend == backend and o.world_size == ws]
            if not rows:
                continue
            per = {"total": counts_of(rows)}
            for category in sorted({r.category for r in rows}):
                per[category] = counts_of([r for r in rows if r.category == category])
            counts[backend][str(ws)] = per
    comparisons = {label: compare(tests, outcomes, label) for label in run.backends
                   if label != "gloo" and "gloo" in run.backends}
    placed = {(o.world_size, o.test): o.outcome for o in outcomes if o.backend == "atlas-gloo-gates"}
    for e in comparisons.get("atlas", Comparison(both_pass={}, exceptions=[],
                                                 atlas_only_pass={})).exceptions:
        e.in_gloo_place = placed.get((e.world_size, e.test))
    return Summary(run=run, counts=counts, comparisons=comparisons)


def first_line(text: str) -> str:
    return " ".join(text.split())[:240]


def print_tables(summary: Summary) -> None:
    print("\nbackend            world  selected  passed  failed  skipped  hung  not_run")
    for backend, per_ws in summary.counts.items():
        for ws, per in per_ws.items():
            c = per["total"]
            print(f"{backend:<18} {ws:>5}  {c.selected:>8}  {c.passed:>6}  {c.failed:>6}  "
                  f"{c.skipped:>7}  {c.hung:>4}  {c.not_run:>7}")
    for label, comp in summary.comparisons.items():
        for ws, n in comp.both_pass.items():
            print(f"\n{label}, world_size {ws}: {n} pass with gloo and {label}")
            items = [e for e in comp.exceptions if str(e.world_size) == ws]
            print(f"{label}, world_size {ws}: {len(items)} pass with gloo but not with {label}")
            for e in items:
                print(f"  {e.test} [{e.category}] {e.atlas_outcome} ({e.kind}): "
                      f"{first_line(e.reason)}")
                if e.kind == "torch gate by backend name":
                    for g in e.gates[:2]:
                        print(f"      {g[:160]}")
            if comp.atlas_only_pass.get(ws):
                print(f"{label}, world_size {ws}: pass with {label}, not with gloo: "
                      f"{', '.join(comp.atlas_only_pass[ws])}")


def markdown(summary: Summary) -> str:
    """The counts and the gloo-only passes as Markdown tables (summary.md, for the docs page)."""
    cats = sorted({c for per_ws in summary.counts.values() for per in per_ws.values() for c in per}
                  - {"total"})
    out = ["| backend | ranks | selected | passed | failed | skipped | hung | "
           + " | ".join(f"{c} passed" for c in cats) + " |",
           "|---|---|---|---|---|---|---|" + "---|" * len(cats)]
    for backend, per_ws in summary.counts.items():
        for ws, per in sorted(per_ws.items()):
            c = per["total"]
            out.append(f"| {backend} | {ws} | {c.selected} | {c.passed} | {c.failed} | {c.skipped} "
                       f"| {c.hung} | " + " | ".join(
                           f"{per[k].passed} of {per[k].selected}" if k in per else "-" for k in cats)
                       + " |")
    for label, comp in summary.comparisons.items():
        out += ["", f"**gloo against {label}**: " + ", ".join(
            f"{n} pass with both at {ws} ranks" for ws, n in sorted(comp.both_pass.items())), ""]
        placed = label == "atlas" and any(e.in_gloo_place for e in comp.exceptions)
        listed = comp.exceptions
        if label != "atlas":  # torch's gates are the atlas table's; list the rest
            gated = [e for e in listed if e.kind == "torch gate by backend name"]
            listed = [e for e in listed if e.kind != "torch gate by backend name"]
            if gated:
                out += [f"{len(gated)} skipped by torch's gates by backend name over all world "
                        "sizes, as listed for atlas" + (":" if listed else "; no other exception."), ""]
        if listed:
            out += ["| test | category | ranks | " + label + " | kind | reason | torch's gate |"
                    + (" atlas in gloo's place |" if placed else ""),
                    "|---|---|---|---|---|---|---|" + ("---|" if placed else "")]
            rows: dict[tuple, list[int]] = {}  # one row for the world sizes that agree
            for e in sorted(listed, key=lambda e: (e.kind, e.test, e.world_size)):
                gate = e.gates[0] if e.gates and e.kind == "torch gate by backend name" else ""
                key = (e.test, e.category, e.atlas_outcome, e.kind, first_line(e.reason), gate,
                       e.in_gloo_place)
                rows.setdefault(key, []).append(e.world_size)
            for (test, category, outcome, kind, reason, gate, in_place), sizes in rows.items():
                gate, reason = gate.replace("|", "\\|"), reason.replace("|", "\\|")
                out.append(f"| `{test}` | {category} | {', '.join(map(str, sizes))} | {outcome} | "
                           f"{kind} | {reason} | {('`' + gate + '`') if gate else ''} |"
                           + (f" {in_place or '-'} |" if placed else ""))
        for ws, names in sorted(comp.atlas_only_pass.items()):
            if names:
                out.append(f"\nPass with {label} and not with gloo at {ws} ranks: "
                           + ", ".join(f"`{n}`" for n in names))
    return "\n".join(out) + "\n"


def readme(summary: Summary) -> str:
    """The kept folder's README.md: what ran, when, on which commit, and the files."""
    r = summary.run
    dirty = (f" with uncommitted changes in {', '.join(r.dirty_paths)}" if r.dirty_paths
             else " (no uncommitted change under atlas_transport/ or tests/torch_suite/)")
    if r.commit_at_end:
        dirty += f"; HEAD was {r.commit_at_end} when it finished"
    for m in r.merged:
        changed = f", uncommitted changes in {', '.join(m.dirty_paths)}" if m.dirty_paths else ""
        dirty += (f"\n- merged into it (`--table --merge`): runs {', '.join(m.backends)} at "
                  f"{', '.join(map(str, m.world_sizes))} ranks, by `{m.command}`, {m.started} to "
                  f"{m.finished}, commit {m.commit}{changed}")
    return f"""# PyTorch's distributed suite: gloo against atlas

PyTorch's `torch.testing._internal.distributed.distributed_test` run with gloo and atlas
(see docs/results/torch-suite.md for how, and what the runs mean).

- command: `{r.command}`
- ran: {r.started} to {r.finished} (UTC)
- commit when it started: {r.commit}{dirty}
- torch {r.torch_version}, Python {r.python}, ranks started by {r.start_method},
  torch's per-test timeout {r.timeout_s} s
- selection: `{r.select}`{f" and -k `{r.pattern}`" if r.pattern else ""};
  runs: {", ".join(r.backends)}; world sizes: {", ".join(map(str, r.world_sizes))}
- atlas declared in DistTestCases.backend_feature: {", ".join(r.atlas_features) or "none"}

Files: `outcomes.csv` / `outcomes.jsonl` (one row per test, run and world size: outcome,
seconds, the skip reason or the ranks' error), `suite-counts.json` and `summary.md` (the counts,
and each test that passes with gloo and not with atlas, with its reason and torch's gate
quoted from distributed_test.py with its line), `tests.json` (the selected tests, their
category and gates). The run also writes `logs/` (each run's pytest log and per-test
record), which is not kept in the repository: `outcomes.jsonl` has what they say of each test.
`.venv/bin/python scripts/torch_dist_suite.py --table <this folder>` rebuilds the summaries
from `outcomes.jsonl`.
"""


def write_outcomes(out: Path, outcomes: list[TestOutcome]) -> None:
    with open(out / "outcomes.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["test", "category", "backend", "world_size", "outcome", "duration_s", "message"])
        for o in outcomes:
            w.writerow([o.test, o.category, o.backend, o.world_size, o.outcome,
                        "" if o.duration_s is None else o.duration_s, first_line(o.message)])
    with open(out / "outcomes.jsonl", "w", encoding="utf-8") as f:
        for o in outcomes:
            f.write(o.model_dump_json() + "\n")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="gloo,atlas,atlas-gloo-gates",
                    help=f"a comma list of {list(RUNS)} (default %(default)s)")
    ap.add_argument("--world-sizes", default="2,3")
    ap.add_argument("--select", default=DEFAULT_SELECT,
                    help=f"'all' or a comma list of {[*CATEGORIES, 'other']} (default %(default)s)")
    ap.add_argument("-k", dest="pattern", default=None, help="only tests whose name matches this regex")
    ap.add_argument("--timeout", type=int, default=180,
                    help="torch's per-test timeout, seconds (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT)")
    ap.add_argument("--start", choices=("forkserver", "spawn"), default="forkserver",
                    help="how ranks start (tests/torch_suite/test_distributed_spawn.py)")
    ap.add_argument("--atlas-features", default=None,
                    help="override the DistTestCases.backend_feature sets atlas joins")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--list", action="store_true", help="print the selection and exit")
    ap.add_argument("--table", type=Path, default=None, help="print the tables of a kept run")
    ap.add_argument("--merge", type=Path, action="append", default=[],
                    help="with --table: add this run folder's outcomes (the backends and world "
                         "sizes the kept run lacks, same selection) to the kept run's")
    args = ap.parse_args(argv)

    if args.table is not None:
        # rebuilt from the kept outcomes, so that a kept run gets this script's comparisons
        kept = args.table
        run = RunInfo.model_validate(json.loads((kept / "suite-counts.json").read_text())["run"])
        tests = [SuiteTest.model_validate(t) for t in json.loads((kept / "tests.json").read_text())]
        outcomes = [TestOutcome.model_validate_json(line) for line in
                    (kept / "outcomes.jsonl").read_text().splitlines() if line.strip()]
        for other in args.merge:
            more = RunInfo.model_validate(json.loads((other / "suite-counts.json").read_text())["run"])
            if more.select != run.select or more.pattern != run.pattern:
                raise SystemExit(f"--merge {other}: selection {more.select!r} -k {more.pattern!r} "
                                 f"differs from {kept}'s {run.select!r} -k {run.pattern!r}")
            have = {(o.backend, o.world_size) for o in outcomes}
            added = [o for line in (other / "outcomes.jsonl").read_text().splitlines()
                     if line.strip() and ((o := TestOutcome.model_validate_json(line)).backend,
                                          o.world_size) not in have]
            outcomes += added
            run.backends += [b for b in more.backends if b not in run.backends]
            run.world_sizes = sorted({*run.world_sizes, *(o.world_size for o in added)})
            more.backends = sorted({o.backend for o in added})
            more.world_sizes = sorted({o.world_size for o in added})
            run.merged.append(more)
        write_outcomes(kept, outcomes)
        summary = summarize(tests, outcomes, run)
        (kept / "suite-counts.json").write_text(summary.model_dump_json(indent=1) + "\n", encoding="utf-8")
        (kept / "summary.md").write_text(markdown(summary), encoding="utf-8")
        (kept / "README.md").write_text(readme(summary), encoding="utf-8")
        print_tables(summary)
        return 0

    tests = select_tests(suite_tests(distributed_test_path()), args.select, args.pattern)
    if args.list:
        for category in sorted({t.category for t in tests}):
            names = [t.name for t in tests if t.category == category]
            print(f"{category} ({len(names)}): {' '.join(names)}")
        print(f"{len(tests)} selected")
        return 0
    if not tests:
        raise SystemExit(f"no test matches --select {args.select} -k {args.pattern}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in RUNS]
    if bad:
        raise SystemExit(f"--backends: {bad} not supported here; use {list(RUNS)}")
    try:
        world_sizes = [int(w) for w in args.world_sizes.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--world-sizes {args.world_sizes!r}: a comma list of ints >= 2") from None
    if not world_sizes or min(world_sizes) < 2:
        raise SystemExit(f"--world-sizes {args.world_sizes!r}: a comma list of ints >= 2")

    import torch

    out: Path = args.out
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    commit = _git("rev-parse", "HEAD")
    dirty = [ln.split(None, 1)[1] for ln in _git("status", "--porcelain", "--", "atlas_transport",
                                                 "tests/torch_suite").splitlines() if ln.strip()]
    outcomes: list[TestOutcome] = []
    for ws in world_sizes:
        for backend in backends:
            outcomes += run_config(backend, ws, tests, args, logs)
    features = (list(ATLAS_FEATURES) if args.atlas_features is None
                else [f for f in args.atlas_features.split(",") if f])
    run = RunInfo(
        command=" ".join([".venv/bin/python", "scripts/torch_dist_suite.py", *(argv or sys.argv[1:])]),
        started=started, finished=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        commit=commit, dirty_paths=dirty,
        commit_at_end=None if _git("rev-parse", "HEAD") == commit else _git("rev-parse", "HEAD"),
        torch_version=torch.__version__, python=sys.version.split()[0], select=args.select,
        pattern=args.pattern, timeout_s=args.timeout, start_method=args.start,
        atlas_features=features, backends=backends, world_sizes=world_sizes)
    summary = summarize(tests, outcomes, run)
    write_outcomes(out, outcomes)
    (out / "suite-counts.json").write_text(summary.model_dump_json(indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(markdown(summary), encoding="utf-8")
    (out / "README.md").write_text(readme(summary), encoding="utf-8")
    (out / "tests.json").write_text(json.dumps([t.model_dump() for t in tests], indent=1) + "\n",
                                    encoding="utf-8")
    print_tables(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
