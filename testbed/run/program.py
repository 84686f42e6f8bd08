"""`testbed run` and `testbed sweep` of a scenario whose subject is a program.

A program scenario (testbed/run/scenario.py, `ProgramScenario`) names a topology, a
program (``program: {command: [...], env: {...}, hosts: [...], nproc_per_host: N}``)
and variants that are environment sets (``gloo: {BACKEND: gloo}``,
``atlas: {BACKEND: atlas}``). The topology is built once; each variant is one
`testbed launch` of the program on it (testbed/launch/, `run_launch`), with the
program's environment and the variant's on top, its files in ``OUT/<variant>/``
(``launch.json``, one stdout and stderr per rank).

What a variant reports (`ProgramVariantResult` in testbed_core/contracts/summary.py):
its **seconds per step**, the median of the ``step_s`` that rank 0 printed (a JSON
object per line on stdout, e.g. ``{"step": 3, "loss": 2.1, "step_s": 0.41}``) over its
steps after the first ``program.warmup`` (default 1: the first step pays for the
connections and first-touch allocations; when rank 0 printed no more steps than that,
the median is over all of them); when rank 0 printed no step time at all, the launch's
wall time stands in (``source: wall``). Beside it: every step time, the losses, each
rank's exit status, the bytes the WAN links carried, and the launch folder.

What a model-based run does and a program's does not (the calibration of the WAN,
placement, prediction, BubbleTea agents, repeats) is not done here, nor faked: the
summary has none of it. The network is built like `testbed run`'s (root needed; TCP's
slow start after idle off on every host, as ``runner.slow_start_after_idle: false``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from testbed.launch import LaunchError, LaunchReport, LaunchSpec
from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.run.network import built_emulation
from testbed.run.scenario import ProgramScenario
from testbed_core.atomic import write_text_atomic
from testbed_core.contracts.summary import (
    ProgramRankResult,
    ProgramSummary,
    ProgramVariantResult,
    VariantFailure,
)

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation

Launcher = Callable[["Emulation", LaunchSpec, Path], LaunchReport]
"""Runs one launch on the built network: (emulation, spec, folder) -> its report."""
NetworkOpener = Callable[[ProgramScenario, Progress], contextlib.AbstractContextManager["Emulation"]]


def select_variants(scenario: ProgramScenario, only: Sequence[str] | None) -> list[str]:
    """The variants to run, in the file's order; `only` (--variants) must name some of them."""
    names = list(scenario.variants)
    if only is None:
        return names
    unknown = [v for v in only if v not in scenario.variants]
    if unknown:
        raise RunnerError(f"--variants: {', '.join(unknown)} not among the scenario's variants "
                          f"({', '.join(names)}); a program scenario's variants are its environment sets")
    return [v for v in names if v in only]


def rank0_steps(metrics: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, step_s) of every JSON line with a numeric step_s, in order."""
    out = []
    for i, line in enumerate(metrics):
        value = line.get("step_s")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        step = line.get("step")
        out.append((step if isinstance(step, int) and not isinstance(step, bool) else i, float(value)))
    return out


def seconds_per_step(step_times: list[float], warmup: int) -> float | None:
    """The median step time after `warmup` steps (all of them when no more were printed)."""
    if not step_times:
        return None
    kept = step_times[warmup:] or step_times
    return statistics.median(kept)


def losses_by_step(report: LaunchReport) -> list[float] | None:
    """Per step, the loss of the first rank (by rank) that printed one."""
    found: dict[int, float] = {}
    for rank in sorted(report.ranks, key=lambda r: r.rank):
        for line in rank.metrics:
            step, loss = line.get("step"), line.get("loss")
            if isinstance(step, int) and isinstance(loss, (int, float)) and not isinstance(loss, bool):
                found.setdefault(step, float(loss))
    return [found[s] for s in sorted(found)] or None


def variant_result(env: dict[str, str], report: LaunchReport, warmup: int, launch_dir: Path) -> ProgramVariantResult:
    """What one launch of the program gave, as summary.json holds it."""
    rank0 = next((r for r in report.ranks if r.rank == 0), None)
    steps = rank0_steps(rank0.metrics) if rank0 else []
    times = [s for _, s in steps]
    median = seconds_per_step(times, warmup)
    codes = [r.exit_code for r in sorted(report.ranks, key=lambda r: r.rank)]
    status: int | None = 0
    for code in codes:
        if code != 0:
            status = code
            break
    by_link = {w.link: w.a_to_b_bytes + w.b_to_a_bytes for w in report.wan_bytes}
    return ProgramVariantResult(
        env=env, ok=report.ok, exit_status=status, failure=report.failure,
        seconds_per_step=median if median is not None else report.wall_s,
        source="step_s" if median is not None else "wall",
        step_s_median=median, steps=len(times), warmup_steps=min(warmup, max(len(times) - 1, 0)),
        step_times_s=times, losses=losses_by_step(report), wall_s=report.wall_s,
        wan_bytes=sum(by_link.values()) if by_link else (0 if report.wan_bytes == [] else None),
        wan_bytes_by_link=by_link or None, launch_dir=str(launch_dir),
        ranks=[ProgramRankResult(rank=r.rank, host=r.host, dc=r.dc, exit_code=r.exit_code, wall_s=r.wall_s,
                                 json_lines=len(r.metrics)) for r in report.ranks],
    )


def launch_spec(scenario: ProgramScenario, variant: str) -> LaunchSpec:
    prog = scenario.program
    env = {**prog.env, **scenario.variants[variant]}
    return LaunchSpec(command=list(prog.command), hosts=prog.hosts, nproc_per_host=prog.nproc_per_host, env=env,
                      master_port=prog.master_port, timeout_s=prog.timeout, cwd=str(Path(prog.cwd).resolve()),
                      topology_file=scenario.topology.name)


@contextlib.contextmanager
def emulated_network(scenario: ProgramScenario, progress: Progress) -> Iterator[Emulation]:
    """The scenario's topology, built once for every variant (root needed), as
    `testbed run` builds it (testbed/run/network.py `built_emulation`)."""
    if os.geteuid() != 0:
        raise RunnerError("a program scenario runs its program in the emulated hosts (testbed launch): run as "
                          "root (sudo)")
    with built_emulation(scenario.topology, progress) as emu:
        yield emu


def default_launcher(emu: Emulation, spec: LaunchSpec, folder: Path) -> LaunchReport:
    from testbed.launch import run_launch

    return run_launch(emu, spec, out_dir=folder, echo=False)


def run_program_scenario(
    scenario: ProgramScenario,
    resolved: dict[str, Any],
    out_dir: str | Path,
    progress: Progress | None = None,
    *,
    variants: Sequence[str] | None = None,
    network: NetworkOpener | None = None,
    launcher: Launcher | None = None,
) -> ProgramSummary:
    """Run every variant of a program scenario on one build of its topology; writes
    ``out_dir/summary.json`` after each variant and returns the summary."""
    began = time.monotonic()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = select_variants(scenario, variants)
    own = progress is None
    progress = progress or Progress(label=f"run {scenario.name}")
    progress.set_total(1 + len(names))
    (out / "scenario.resolved.yaml").write_text(yaml.safe_dump(_plain(resolved), sort_keys=False))
    prog = scenario.program
    summary = ProgramSummary(scenario=scenario.name, topology=scenario.topology.name, command=list(prog.command),
                             hosts=prog.hosts, nproc_per_host=prog.nproc_per_host, warmup=prog.warmup,
                             seed=scenario.seed)
    opener = network or emulated_network
    launch = launcher or default_launcher

    def write() -> None:
        summary.duration_s = round(time.monotonic() - began, 3)
        write_text_atomic(out / "summary.json", summary.to_json() + "\n")

    try:
        with contextlib.ExitStack() as stack:
            with progress.step("setup"):
                emu = stack.enter_context(opener(scenario, progress))
                summary.delay_backend = str(getattr(emu, "delay_backend", None) or "") or None
            for name in names:
                with progress.step(name):
                    folder = out / name
                    spec = launch_spec(scenario, name)
                    try:
                        report = launch(emu, spec, folder)
                    except LaunchError as exc:
                        progress.log(f"  {name} FAILED: {exc}")
                        summary.variants[name] = VariantFailure(error=str(exc))
                        write()
                        continue
                    entry = variant_result(spec.env, report, prog.warmup, folder)
                    summary.variants[name] = entry
                    progress.log(f"  {name}: {result_line(entry)}")
                    write()
    finally:
        write()
        if own:
            progress.close()
    return summary


def result_line(entry: ProgramVariantResult) -> str:
    """One line for the log: the seconds per step and where it came from."""
    what = (f"{entry.seconds_per_step:.3f} s per step (median of {len(entry.step_times_s) - entry.warmup_steps} "
            f"steps after {entry.warmup_steps} warm-up)" if entry.source == "step_s"
            else f"{entry.seconds_per_step:.3f} s wall (rank 0 printed no step_s)")
    wan = f", WAN {entry.wan_bytes / 1e6:.1f} MB" if entry.wan_bytes else ""
    return what + wan + ("" if entry.ok else f"; FAILED: {entry.failure}")


def program_table(summary: ProgramSummary) -> str:
    """The terminal table of one program run: a line per variant."""
    rows = []
    for name, entry in summary.variants.items():
        if isinstance(entry, VariantFailure):
            rows.append([name, "-", "-", "-", "-", f"failed: {entry.error[:60]}"])
            continue
        rows.append([name, f"{entry.seconds_per_step:.3f}", entry.source, str(entry.steps),
                     f"{entry.wan_bytes / 1e6:.1f}" if entry.wan_bytes is not None else "-",
                     "ok" if entry.ok else f"exit {entry.exit_status}"])
    headers = ["variant", "s/step", "from", "steps", "WAN MB", "status"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in
                                enumerate(zip(line, widths, strict=True))).rstrip() for line in lines)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
