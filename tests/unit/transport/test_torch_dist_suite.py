"""scripts/torch_dist_suite.py (`make torch-suite`, PyTorch's distributed suite against
atlas) without running the suite: which tests it selects, the torch lines it quotes as a
test's gate, how it tells torch's gates from atlas's failures, its errors, and that
`make test` never collects tests/torch_suite."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    name = "torch_dist_suite"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "torch_dist_suite.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # pydantic resolves the models' annotations in their module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def suite():
    m = _script()
    return m, {t.name: t for t in m.suite_tests(m.distributed_test_path())}


def test_selection_by_category(suite):
    m, tests = suite
    assert len(tests) > 250  # torch 2.13's _DistTestBase has 292
    assert tests["test_send_recv_any_source"].category == "p2p"
    assert tests["test_all_reduce_coalesced_sum"].category == "collectives"
    assert tests["test_all_gather_object_default_pg"].category == "collectives"
    assert tests["test_DistributedDataParallelCPU"].category == "ddp"
    assert tests["test_accumulate_gradients_no_sync"].category == "ddp"
    assert tests["test_get_rank"].category == "other"
    chosen = {t.name for t in m.select_tests(list(tests.values()), m.DEFAULT_SELECT, None)}
    assert "test_get_rank" not in chosen and "test_broadcast" in chosen
    narrowed = m.select_tests(list(tests.values()), "p2p", "any_source")
    assert [t.name for t in narrowed] == ["test_send_recv_any_source",
                                          "test_send_recv_any_source_autograd_profiler",
                                          "test_send_recv_any_source_torch_profiler"]


def test_unknown_category_is_named(suite):
    m, tests = suite
    with pytest.raises(SystemExit, match=r"unknown categories \['colectives'\]"):
        m.select_tests(list(tests.values()), "colectives", None)


def test_the_gate_quoted_is_the_line_that_skipped(suite):
    m, tests = suite
    source = m.distributed_test_path().read_text().splitlines()
    gate = m.gates_for("Test requires backend atlas to be one of {'gloo'}",
                       tests["test_all_reduce_coalesced_sum"].gates)
    assert len(gate) == 1 and 'require_backend_is_available({"gloo"})' in gate[0]
    lineno = int(gate[0].split(":")[0].removeprefix("L"))
    assert "require_backend_is_available" in source[lineno - 1]
    gate = m.gates_for("get_future is only supported on mpi, nccl and gloo",
                       tests["test_accumulate_gradients_no_sync"].gates)
    assert len(gate) == 1 and 'BACKEND != "gloo"' in gate[0]


def test_compare_tells_gates_from_failures(suite):
    m, tests = suite
    picked = [tests[n] for n in ("test_broadcast", "test_all_reduce_coalesced_sum",
                                 "test_sparse_all_reduce_sum", "test_isend", "test_irecv")]

    def row(backend, test, outcome, message=""):
        return m.TestOutcome(test=test, category=tests[test].category, backend=backend,
                             world_size=3, outcome=outcome, message=message)

    outcomes = [
        row("gloo", "test_broadcast", "passed"), row("atlas", "test_broadcast", "passed"),
        row("gloo", "test_all_reduce_coalesced_sum", "passed"),
        row("atlas", "test_all_reduce_coalesced_sum", "skipped",
            "Test requires backend atlas to be one of {'gloo'}"),
        row("gloo", "test_sparse_all_reduce_sum", "passed"),
        row("atlas", "test_sparse_all_reduce_sum", "failed", "TypeError: only dense tensors"),
        row("gloo", "test_isend", "passed"), row("atlas", "test_isend", "hung", "no progress"),
        row("gloo", "test_irecv", "skipped", "x"), row("atlas", "test_irecv", "passed"),
    ]
    comp = m.compare(picked, outcomes, "atlas")
    assert comp.both_pass == {"3": 1}
    kinds = {e.test: e.kind for e in comp.exceptions}
    assert kinds == {"test_all_reduce_coalesced_sum": "torch gate by backend name",
                     "test_sparse_all_reduce_sum": "atlas failure",
                     "test_isend": "atlas failure"}
    assert comp.atlas_only_pass == {"3": ["test_irecv"]}
    table = m.markdown(m.Summary(run=m.RunInfo(
        command="c", started="s", finished="f", commit="0", dirty_paths=[], torch_version="t",
        python="p", select="all", pattern=None, timeout_s=1, start_method="forkserver",
        atlas_features=[], backends=["gloo", "atlas"], world_sizes=[3]),
        counts={}, comparisons={"atlas": comp}))
    assert "| `test_sparse_all_reduce_sum` | collectives | 3 | failed | atlas failure |" in table


def test_make_test_collects_nothing_there():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                          "-p", "no:cacheprovider", "tests/torch_suite"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "no tests collected" in out.stdout, out.stdout + out.stderr
