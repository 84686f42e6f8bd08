"""Running the demo: what it runs (`DemoConfig`), whether it can run here, the
sub-runs (the transport bench, then the quickstart run), and its progress estimate.

Each sub-run keeps its own folder (``transport/``, ``quickstart/``); a part that fails
is recorded and the demo goes on, so the table says n/a and why for that part.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.demo.files import DemoError, write_outputs
from testbed.demo.rows import Row, build_rows, format_table, short
from testbed.progress import Progress
from testbed_core.constants import REPO_ROOT
from testbed_core.contracts.demo import DemoBench, DemoMeta
from testbed_core.contracts.summary import Summary

if TYPE_CHECKING:
    from testbed.bench.transport import Measurement
from testbed_core.variants import base_name, has_bubbletea

WARMUP = {"workload.warmup": 3}
"""Three warm-up iterations, not the scenario's two: after two, the first measured
iteration was still settling (TCP windows, the transport's chunk sizes) in 4 of 8
variant runs of the last demos (1.0-1.29x the next one), in the plain variant as in
its +bubbletea twin; with only two measured iterations that alone made the BubbleTea
slowdown read +1.0% in one demo and +6.7% in the next (docs/bubbletea.md, 'The slowdown: measured, decomposed, kept small')."""


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. Every choice is here, visible, with the reason.

    The quickstart scenario runs with one more warm-up iteration (`WARMUP`); `QUICK`
    trims it for a faster look.
    """

    scenario: Path = REPO_ROOT / "scenarios" / "quickstart.yaml"
    # `--set`-style overrides of the scenario (dotted path -> value).
    overrides: Mapping[str, Any] = field(default_factory=lambda: dict(WARMUP))
    # The variants to run, in order; the plain Atlas variant must run before its
    # +bubbletea twin (the runner measures the slowdown against it).
    variants: tuple[str, ...] = ("baseline", "multi-tcp", "atlas", "atlas+bubbletea")
    # Transport bench across the scenario's WAN: tensors big enough that one
    # window-limited stream takes seconds, so the striped transport's gain shows.
    bench_size: int = 64 << 20
    bench_streams: tuple[int, ...] = (1, 8)  # atlas N and iperf3 -P N for each N
    bench_repeat: int = 1  # timed transfers after the untimed warm-up one
    iperf_seconds: float = 3.0
    skip_bench: bool = False
    # Expected seconds per step on a 2-core machine, for the estimate shown before
    # and during the run (the progress display refines it as steps finish).
    expected_bench_s: float = 30.0
    expected_setup_s: float = 35.0  # emulation + WAN calibration of the run
    expected_variant_s: float = 17.0

    @property
    def streams(self) -> int:
        return max(self.bench_streams)

    def child_step_s(self) -> dict[str, float]:
        return {"quickstart run": self.expected_variant_s}

    def expected_steps(self) -> dict[str, float]:
        steps = {}
        if not self.skip_bench:
            steps["transport bench"] = self.expected_bench_s
        # each +bubbletea variant is played twice: its idle twin (agents admitting nothing) first
        plays = len(self.variants) + sum(1 for v in self.variants if has_bubbletea(v))
        steps["quickstart run"] = self.expected_setup_s + self.expected_variant_s * plays
        return steps


DEFAULT = DemoConfig()
# --quick: smaller bench tensors, no multi-TCP, one measured iteration per variant
# (the warm-up ones still open the TCP windows): about half the time, noisier figures.
QUICK = DemoConfig(
    overrides={**WARMUP, "workload.iterations": 1},
    variants=("baseline", "atlas", "atlas+bubbletea"),
    bench_size=32 << 20,
    iperf_seconds=2.0,
    expected_bench_s=22.0,
    expected_variant_s=14.0,
)


def prerequisite_problems(
    *, euid: int, which: Callable[[str], str | None], libiperf_error: str | None, need_bench: bool,
    scenario: Path,
) -> list[str]:
    """What stops the demo from running here, each with what to do. Pure: the probes
    are passed in (see `probe_prerequisites`)."""
    problems = []
    if euid != 0:
        problems.append("the demo builds emulated datacenters in network namespaces and needs root: "
                        "run `sudo make demo` (or `sudo .venv/bin/testbed demo`)")
    if which("mnexec") is None:
        problems.append("mnexec (Mininet's helper, Debian package `mininet`) is not installed: "
                        "run `sudo make install` or `apt-get install mininet`")
    if which("ifconfig") is None:
        problems.append("ifconfig (Debian package `net-tools`, Mininet calls it) is not installed: "
                        "run `sudo make install` or `apt-get install net-tools`")
    if need_bench and libiperf_error is not None:
        problems.append(f"libiperf (Debian package `libiperf0`) cannot be loaded ({libiperf_error}): "
                        "run `apt-get install libiperf0`, or pass --skip-bench to leave the transport bench out")
    if not scenario.is_file():
        problems.append(f"the demo's scenario {scenario} is missing: is this a complete checkout?")
    return problems


def probe_libiperf() -> str | None:
    """None when the iperf3 wrapper can load libiperf, else why not."""
    try:
        import iperf3

        iperf3.IPerf3(role="c")
    except Exception as exc:  # OSError for a missing library, anything else is as fatal
        return f"{type(exc).__name__}: {exc}"
    return None


def probe_prerequisites(cfg: DemoConfig) -> list[str]:
    """`prerequisite_problems` on this machine."""
    return prerequisite_problems(euid=os.geteuid(), which=shutil.which,
                                 libiperf_error=None if cfg.skip_bench else probe_libiperf(),
                                 need_bench=not cfg.skip_bench, scenario=cfg.scenario)


def bubbletea_unavailable() -> str | None:
    """Why the +bubbletea variants cannot run here (None when they can)."""
    import importlib.util

    if importlib.util.find_spec("bubbletea_agent.__main__") is None:
        return "the BubbleTea agent (python -m bubbletea_agent) is not installed"
    return None


class PlannedProgress(Progress):
    """A Progress whose estimate starts from known step durations (the demo's steps
    differ too much for a mean). A running step with a child reporter (the run:
    set-up, then one step per variant) is refined by what the child has done: its
    first step is the set-up, the others are alike and take `child_step_s` each
    until one has been timed."""

    def __init__(self, expected: Mapping[str, float], child_step_s: Mapping[str, float] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(total=len(expected), **kwargs)
        self.expected = dict(expected)
        self.child_step_s = dict(child_step_s or {})
        self.finished: set[str] = set()

    def done(self, name: str, **kwargs: Any) -> None:
        self.finished.add(name)
        super().done(name, **kwargs)

    def _running_left(self, name: str, began: float, now: float) -> float:
        est = self.expected.get(name, 0.0)
        kid = self._children.get(name)
        if kid is None or kid.total == 0 or kid.done_count == 0:
            return max(0.0, est - (now - began))
        alike = kid.durations[1:]
        per = sum(alike) / len(alike) if alike else self.child_step_s.get(name, est / kid.total)
        pending = max(0, kid.total - kid.done_count)
        into = now - min(kid.running.values()) if kid.running else 0.0
        return max(0.0, pending * per - into)

    def child(self, name: str, label: str = "") -> Progress:
        """As Progress.child, but the child's own lines show this plan's estimate."""
        with self._lock:
            kid = _PlannedChild(self, name, label or name)
            self._children[name] = kid
            return kid

    def eta_s(self) -> float | None:
        with self._lock:
            now = self.clock()
            left = 0.0
            for name, est in self.expected.items():
                if name in self.finished:
                    continue
                began = self.running.get(name)
                left += est if began is None else self._running_left(name, began, now)
            return left


class _PlannedChild(Progress):
    """The reporter inside a planned step; its estimate is the plan's for that step."""

    def __init__(self, parent: PlannedProgress, name: str, label: str) -> None:
        super().__init__(0, label, stream=parent.stream, tty=parent.tty, clock=parent.clock,
                         min_interval=parent.min_interval, enabled=parent.enabled)
        self._parent = parent
        self._plan = (parent, name)

    def eta_s(self) -> float | None:
        parent, name = self._plan
        with parent._lock:
            began = parent.running.get(name)
            return None if began is None else parent._running_left(name, began, self.clock())


@dataclass
class DemoOutcome:
    """What `run_demo` made: the table (rows and text), what ran (`meta`), the parts
    that failed, and the files written."""

    out: Path
    rows: list[Row]
    table: str
    meta: DemoMeta
    failed: list[str]  # parts that failed (empty when all ran)
    files: list[Path]


def default_out_dir() -> Path:
    """results/demo-<time>: a fresh folder per demo."""
    return Path("results") / f"demo-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_bench(cfg: DemoConfig, topology: Path, out: Path, progress: Progress) -> list[Measurement]:
    """The short transport bench across the WAN of `topology`; writes results.json,
    results.csv and goodput.png in `out` as `testbed bench transport` does."""
    from testbed.bench import report as bench_report
    from testbed.bench.transport import wan_suite

    out.mkdir(parents=True, exist_ok=True)

    def on_result(m: Measurement) -> None:
        what = f"atlas N={m.requested_streams}" if m.method == "atlas" else f"{m.method} -P {m.requested_streams}"
        if m.error:
            progress.log(f"  transport: {what}: FAILED: {m.error}")
        else:
            progress.log(f"  transport: {what}: {m.goodput_mbps:.1f} Mbit/s")

    results = wan_suite(topology, None, streams=list(cfg.bench_streams), size=cfg.bench_size,
                        repeat=cfg.bench_repeat, methods=["atlas", "iperf3"], log_dir=out / "logs",
                        iperf_seconds=cfg.iperf_seconds, congestion=None, chunk_bytes=None, on_result=on_result)
    found = bench_report.checks(results)
    meta = {"size_bytes": cfg.bench_size, "repeat": cfg.bench_repeat, "chunk_bytes": None,
            "topology": str(topology), "host": platform.node(), "python": sys.version.split()[0],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "by": "testbed demo"}
    bench_report.write_json(bench_report.as_json(results, found, meta), out / "results.json")
    bench_report.write_csv(results, out / "results.csv")
    bench_report.plot(results, out / "goodput.png", title=topology.stem)
    return results


def run_demo(cfg: DemoConfig, out: Path, progress: PlannedProgress | None = None,
             echo: Callable[[str], None] = print) -> DemoOutcome:
    """Bench, quickstart run, then the table and files. A part that fails is
    recorded (its rows say n/a and why) and the demo goes on to the next."""
    from testbed.run.runner import RunnerError, run_scenario
    from testbed.run.scenario import load_scenario
    from testbed_core.configfile import ConfigError

    t0 = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        scenario, resolved = load_scenario(cfg.scenario, dict(cfg.overrides))
    except ConfigError as exc:
        raise DemoError(f"the demo's scenario cannot be used: {exc}") from None
    topology = Path(resolved["topology"].get("_source", REPO_ROOT / "topologies" / "2dc.yaml"))
    link = scenario.topology.wan[0] if scenario.topology.wan else None
    link_mbps = link.rate / 1e6 if link else None
    streams = cfg.streams
    notes: dict[str, str] = {}
    failed: list[str] = []

    variants = list(cfg.variants)
    bt_missing = bubbletea_unavailable()
    if bt_missing:
        variants = [v for v in variants if not has_bubbletea(v)]
        notes["bubbletea"] = f"not run: {bt_missing}"
        echo(f"note: BubbleTea rows will be n/a: {bt_missing}")
    allowed = set(scenario.variants)
    dropped = [v for v in variants if base_name(v) not in allowed]
    if dropped:
        variants = [v for v in variants if v not in dropped]
        echo(f"note: {scenario.source or cfg.scenario} has no variant(s) {', '.join(dropped)}; left out")
        if any(has_bubbletea(v) for v in dropped) and "bubbletea" not in notes:
            notes["bubbletea"] = f"not run: the scenario has no {base_name(dropped[-1])} variant"

    progress = progress or PlannedProgress(cfg.expected_steps(), cfg.child_step_s(), label="demo")
    meta = DemoMeta(
        scenario=str(cfg.scenario), overrides=dict(cfg.overrides), variants=variants, topology=str(topology),
        link_mbps=link_mbps, rtt_ms=link.rtt_s * 1000 if link else None, streams=streams,
        bench=DemoBench(size_bytes=cfg.bench_size, streams=list(cfg.bench_streams), repeat=cfg.bench_repeat,
                        iperf_seconds=cfg.iperf_seconds, skipped=cfg.skip_bench),
        host=platform.node(), started=datetime.now().isoformat(timespec="seconds"), notes=notes,
    )

    bench_rows: list[dict[str, Any]] | None = None
    if cfg.skip_bench:
        notes["transport"] = "skipped (--skip-bench)"
    else:
        from testbed.bench.transport import BenchError

        with progress.step("transport bench"):
            try:
                results = run_bench(cfg, topology, out / "transport", progress)
                bench_rows = [m.row() for m in results]
                bad = [m for m in results if m.error or m.verified is False]
                if bad:
                    failed.append("transport")
            except BenchError as exc:
                notes["transport"] = f"bench failed: {exc}"
                failed.append("transport")
                progress.log(f"  transport bench FAILED: {exc}")

    summary: Summary | None = None
    with progress.step("quickstart run"):
        kid = progress.child("quickstart run", label=f"run {scenario.name}")
        try:
            summary = run_scenario(scenario, resolved, out / "quickstart", kid, variants=variants)
        except (RunnerError, ConfigError) as exc:
            notes["training"] = f"run failed: {short(str(exc), 300)}"
            failed.append("training")
            progress.log(f"  quickstart run FAILED: {exc}")
        else:
            if summary.failed():
                failed.append("training")
            meta.delay_backend = summary.delay_backend
        finally:
            kid.close()

    if summary is not None:
        try:  # the run's own table and plots (testbed report), next to its results
            from testbed.report import build_report

            build_report(out / "quickstart")
        except Exception as exc:  # a side product: never worth failing the demo
            progress.log(f"  note: testbed report of the run failed: {exc}")

    rows = build_rows(bench_rows, summary, streams=streams, link_mbps=link_mbps,
                      bench_note=notes.get("transport", ""), run_note=notes.get("training", ""),
                      bubbletea_note=notes.get("bubbletea", ""))
    meta.notes = notes  # the notes the parts added since
    meta.duration_s = round(time.monotonic() - t0, 1)
    meta.failed = failed
    files = write_outputs(rows, meta, out)
    table = format_table(rows)
    return DemoOutcome(out, rows, table, meta, failed, files)


