"""PyTorch's distributed suite against atlas and gloo (`make torch-suite`, run by
scripts/torch_dist_suite.py): collected only when that script starts pytest here
(ATLAS_TORCH_SUITE=1), never by `make test` (the suite spawns 2-3 processes per test
and runs for many minutes).

With ATLAS_TORCH_SUITE_RECORD=<file>, each test appends JSON lines to that file: one
when it starts ({"event": "start", "test": name}) and one with its outcome ({"event":
"end", "test", "outcome": passed|failed|skipped, "duration_s", "message"}), so that the
script knows which test was running if the process is stopped, and reads every test's
outcome and reason without parsing pytest's output."""

from __future__ import annotations

import json
import os
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


def _message(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    text = report.longreprtext or ""
    # the last lines name the error; keep them, not the whole traceback
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ") or "Error" in ln or "Exception" in ln]
    return "\n".join((errors or lines)[-12:])[-3000:]


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
        entry["message"] = _message(report)
    if report.when == "teardown":
        entry["duration_s"] = round(time.monotonic() - _started.get(name, time.monotonic()), 2)
        _write(entry)
