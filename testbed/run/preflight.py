"""What would make `testbed run` fail once the emulation is built, found before anything
is built, as `testbed plan` does: the runner's own requirements (pp >= 2), the variants
(``--variants`` or the scenario's), each variant's placement on the topology and its
prediction, the workload's compute model (a gpu.profile file), and, for an emulated
run, DCs given as GPU counts and a machine that cannot build (root, Mininet).

Used by `testbed run` (every problem listed, no result folder created) and by sweeps
(every point checked when the sweep is loaded, once per distinct shape)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.run.runner import check_runnable
from testbed.run.scenario import Scenario
from testbed.run.variants import plan_variant, run_variants
from testbed_core.configfile import ConfigError


def preflight(scenario: Scenario, only: Sequence[str] | None = None, progress: Progress | None = None, *,
              machine: bool = True) -> list[str]:
    """The problems that would stop the run, one line each; empty when it can start.
    `machine`: also check that this machine can build the emulation (not for local runs)."""
    progress = progress or Progress(stream=io.StringIO(), tty=False)
    try:
        check_runnable(scenario, progress)
        runs = run_variants(scenario, only)
    except (RunnerError, ConfigError) as exc:
        return [str(exc)]
    problems = []
    try:
        scenario.workload.effective(scenario.workload_dir)
    except (ConfigError, ValueError) as exc:
        problems.append(f"{scenario.workload_source or 'workload'}: {exc}")
    for run in runs:
        try:
            plan_variant(run, scenario, scenario.workload, scenario.workload_dir, None, None, scenario.runner.local)
        except (RunnerError, ValueError) as exc:
            text = str(exc)
            prefix = f"variant {run.name}: "
            problems.append(text if text.startswith(prefix) else prefix + text)
    if problems and not only:
        problems.append("drop these from the scenario's variants, or choose others with --variants")
    if not scenario.runner.local:
        try:
            scenario.topology.require_emulable()
        except ConfigError as exc:
            problems.append(str(exc))
        if machine:
            from testbed.emulation.network import EmulationError
            from testbed.emulation.network import preflight as machine_preflight

            try:
                machine_preflight()
            except EmulationError as exc:
                problems.append(f"{exc} (or run the workers without the emulated network: --local)")
    return problems


def shape_key(scenario: Scenario) -> str:
    """What `preflight` (without the machine check) depends on, as a string: points of
    a sweep that share it share the verdict (a sweep over delays plans once)."""
    topo, wl, runner, bt = scenario.topology, scenario.workload, scenario.runner, scenario.bubbletea
    return json.dumps({
        "dcs": [(dc.name, list(dc.hosts), dc.gpus) for dc in topo.dcs],
        "links": [list(link.between) for link in topo.wan],
        "parallelism": wl.parallelism.model_dump(mode="json"), "gpu": wl.gpu.model_dump(mode="json"),
        "workload_dir": scenario.workload_dir, "variants": scenario.variants,
        "bubbletea": [bt.enabled, bt.compare, bt.variants],
        "runner": [runner.local, runner.baseline_placement, getattr(runner, "dp_allreduce", None)],
    }, sort_keys=True, default=str)
