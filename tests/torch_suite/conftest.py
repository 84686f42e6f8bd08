"""PyTorch's distributed suite against atlas and gloo (`make torch-suite`, run by
scripts/torch_dist_suite.py): collected only when that script starts pytest here
(ATLAS_TORCH_SUITE=1), never by `make test` (the suite spawns 2-3 processes per test
and runs for many minutes).

With ATLAS_TORCH_SUITE_RECORD=<file>, each test appends JSON lines to that file: one
when it starts ({"event": "start", "test": name}) and one with its outcome ({"event":
"end", "test", "outcome": passed|failed|skipped, "duration_s", "message": the skip's
reason or the failure's error lines, "detail": the failure's traceback tail}), so that the
script knows which test was running if the process is stopped, and reads every test's
outcome and reason without parsing pytest's output."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

_ENABLED = os.environ.get("ATLAS_TORCH_SUITE") == "1"

collect_ignore_glob = [] if _ENABLED else ["*.py"]

_RECORD = os.environ.get("ATLAS_TORCH_SUITE_RECORD")
_started: dict[str, float] = {}
_outcomes: dict[str, dict] = {}


def _write(entry: dict) -> None:
    if _RECORD:
        with open(_RECORD, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


_BOILERPLATE = re.compile(r"To execute this test|test_distributed_spawn\.py Test|"
                         r"PYTORCH_PRINT_REPRO_ON_FAILURE|^\S+\.py:\d+: \w+$")
_ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Timeout)\w*: .+")


def _message(report: pytest.TestReport) -> tuple[str, str]:
    """(message, detail): a skip's reason, or a failure's error lines (the ranks'
    exceptions, which torch forwards in the test's RuntimeError) and the traceback's tail."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: "), ""
    lines = [ln[1:].strip() if ln.startswith("E ") else ln.rstrip()
             for ln in (report.longreprtext or "").splitlines()]
    lines = [ln for ln in lines if ln.strip() and not _BOILERPLATE.search(ln)]
    errors: list[str] = []
    for ln in lines:
        ln = ln.strip()
        if _ERROR_LINE.match(ln) and not ln.startswith("RuntimeError: Process ") and ln not in errors:
            errors.append(ln)
    message = " | ".join(errors[-3:]) or (lines[-1].strip() if lines else "")
    return message[:1500], "\n".join(lines[-40:])[-4000:]


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if not _ENABLED:
        return
    name = nodeid.rsplit("::", 1)[-1]
    _started[name] = time.monotonic()
    _write({"event": "start", "test": name, "t": time.time()})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _ENABLED:
        return
    name = report.nodeid.rsplit("::", 1)[-1]
    entry = _outcomes.setdefault(name, {"event": "end", "test": name, "outcome": "passed",
                                        "message": ""})
    # setup, call and teardown each report; the first that did not pass decides
    if report.outcome != "passed" and entry["outcome"] == "passed":
        entry["outcome"] = report.outcome
        entry["phase"] = report.when
        entry["message"], entry["detail"] = _message(report)
    if report.when == "teardown":
        entry["duration_s"] = round(time.monotonic() - _started.get(name, time.monotonic()), 2)
        _write(entry)
