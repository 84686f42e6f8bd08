"""Kill anywhere, clean everything (issue 32): a `testbed` command killed with SIGKILL
in a given phase, then `testbed clean`, and at once nothing of it is left: no process
(descended from it, marked with its run, naming it as owner, or in its namespaces), no
record, temporary folder or socket, link, cgroup or changed sysctl.

The trials are those of scripts/kill_trials.py (which runs many more, seeded, and
prints the table). `make test` runs two quick ones (the topology check killed while it
measures, the quickstart killed in its calibration); `make test-long` one per command
and phase that matter most (BubbleTea variants, a sweep of two runs at once, the
transport bench, the demo)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _trials():
    spec = importlib.util.spec_from_file_location("kill_trials", REPO / "scripts" / "kill_trials.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trials():
    return _trials()


def check(trials, command: str, phase: str, work: Path, seed: int = 0) -> None:
    trial = trials.run_trial(trials.commands(work)[command], seed, work, phase)
    print("\n" + trials.table([trial]))
    assert trial.prefixes, f"no run prefix seen in the output of {command}:\n{trial.log_tail}"
    ours = [line for line in trial.clean_output.splitlines()
            if line.startswith("failed") and any(p in line for p in trial.prefixes)]
    assert ours == [], trial.clean_output
    assert trial.leftovers == [], trial.clean_output


def test_topo_check_killed_while_it_measures(trials, tmp_path):
    check(trials, "topo-check", "rtt", tmp_path)


def test_quickstart_killed_in_its_calibration(trials, tmp_path):
    """The issue's own trial: the warm-start fork server and its workers were left."""
    check(trials, "run-quickstart", "calibration", tmp_path)


@pytest.mark.long
@pytest.mark.parametrize(("command", "phase"), [
    ("run-quickstart", "build"), ("run-quickstart", "baseline"), ("run-quickstart", "teardown"),
    ("run-bubbletea", "bubbletea-idle"), ("run-bubbletea", "bubbletea"),
    ("sweep", "calibration"), ("sweep", "variant"),
    ("topo-check", "build"), ("topo-check", "blast"),
    ("bench-transport", "atlas"), ("bench-transport", "iperf3"),
    ("demo", "bench-measure"), ("demo", "calibration"), ("demo", "bubbletea"),
])
def test_killed_in_phase_then_clean_leaves_nothing(trials, command, phase, tmp_path):
    check(trials, command, phase, tmp_path)
