"""`testbed report predictions DIR...`: the a-priori prediction errors of kept or fresh runs.

Every `testbed run` writes, per variant, the iteration time the planner predicted
before that variant ran (``predicted_iteration_time_s``, from the calibration measured
before the run, never fitted to it) beside the one it measured. This module gathers
those pairs from any number of run summaries (a run folder's ``summary.json``, a
sweep's point folders, a kept ``*.summary.json``) into one table: scenario, variant,
predicted, measured and the error ``measured / predicted - 1``, marking the rows
beyond the tolerance (5%, issue 40). Each row also carries what usually explains a
large error: the WAN queues' tail drops over the variant (loss the model may not
know), whether the run was calibrated, where the prediction's rates came from, and
what other programs took of the machine's cores while the variant measured (the
prediction assumes the run has them to itself).

A repeated variant (``runner.repeat``) counts its median iteration time, as the rest
of the report does. Program scenarios (their summary.json has ``"kind": "program"``)
carry no prediction and are listed as skipped, as are variants that failed.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.report.loading import ReportError, read_summary_file
from testbed.report.table import format_table
from testbed_core.contracts.summary import Summary, VariantResult, is_program_summary
from testbed_core.variants import sort_key

TOLERANCE = 0.05
"""The error (either way) a prediction may have and count as within: issue 40's 5%."""

WARMING = 0.2
"""A variant's first measured iteration this much or more above the median of its other
measured ones counts as still warming up (`first_excess`): the run's warm-up iterations
did not bring its channels to their steady state, and its mean counts one that had not
(results/held-back/README.md: 4dc-regions under GPipe)."""

SUMMARY_NAME = "summary.json"
SUMMARY_SUFFIXES = (".summary.json", "-summary.json")
"""Files read: a run folder's summary.json, or a kept copy named ``<name>.summary.json``
(or ``<name>-summary.json``)."""


@dataclass(frozen=True)
class PredictionRow:
    """One variant of one run: its a-priori prediction against its measurement."""

    source: str  # the run folder of a summary.json (as given or found), else the kept summary file
    scenario: str
    topology: str
    variant: str
    predicted_s: float  # the a-priori prediction, seconds per iteration
    measured_s: float  # the measured iteration time (median over repeats when repeated), seconds
    error: float  # measured / predicted - 1
    within: bool  # |error| <= the tolerance
    calibrated: bool  # the run measured its WAN paths before the variants (runner.calibrate)
    rates_from: str  # where the prediction's WAN rates came from (summary's prediction.rates_from)
    tail_drops: int | None  # the WAN queues' tail drops over the variant (relay delay lines; None: netem)
    streams: int  # TCP streams per channel
    sharing: str  # shared or temporal
    # faults injected on purpose (a scenario's ``faults:``): the prediction includes the
    # forecast of each (testbed/run/faults.py `forecast`) or says it has none, and the
    # iterations outside them against the healthy prediction; "" without faults
    faults: str = ""
    # on lossy paths: where one run's mean falls by chance (the prediction's chance_interval_s)
    chance_low_s: float | None = None
    chance_high_s: float | None = None
    # other programs' CPU over the measured iterations, in cores (summary's machine_cpu;
    # None: not recorded, e.g. a run over several servers or from before it was)
    outside_cores: float | None = None
    # the run's own CPU over the same time, in cores (workers, agents, runner, delay lines):
    # near the machine's cores, the emulator's own work shapes the times it measures
    run_cores: float | None = None
    # how far the first measured iteration stands above the median of the others
    # (first / median - 1; None with fewer than 3 measured, with faults injected, or
    # for a repeated variant, whose headline is the median of its repeats)
    first_excess: float | None = None
    # the error with the first measured iteration left out (None where first_excess is)
    error_without_first: float | None = None
    # other variants of the same run that ran the same way (`same_way_groups`), and how
    # far apart they all measured (slower / faster - 1): the run's own spread for one
    # configuration, which one prediction cannot be closer than about half of
    same_way_as: tuple[str, ...] = ()
    same_way_spread: float | None = None

    @property
    def warming(self) -> bool:
        """The first measured iteration was still warming up (WARMING)."""
        return self.first_excess is not None and self.first_excess >= WARMING - 1e-9


@dataclass
class PredictionTable:
    """What `prediction_table` found: the rows, and what it could not count and why."""

    rows: list[PredictionRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<file>: why" (program runs, failed variants)
    tolerance: float = TOLERANCE

    def beyond(self) -> list[PredictionRow]:
        return [r for r in self.rows if not r.within]

    def text(self) -> str:
        """The table for the terminal (and a results page), beyond-tolerance rows marked."""
        headers = ["source", "scenario", "variant", "predicted s", "measured s", "error", "", "drops",
                   "run CPU", "other CPU"]
        body = [[r.source, r.scenario, r.variant, f"{r.predicted_s:.3f}", f"{r.measured_s:.3f}",
                 f"{r.error:+.1%}", "" if r.within else "BEYOND", "-" if r.tail_drops is None else str(r.tail_drops),
                 "-" if r.run_cores is None else f"{r.run_cores:.2f}",
                 "-" if r.outside_cores is None else f"{r.outside_cores:.2f}"]
                for r in self.rows]
        n, ok = len(self.rows), len(self.rows) - len(self.beyond())
        foot = f"{ok} of {n} variant rows within {self.tolerance:.0%} of their a-priori prediction"
        if any(r.outside_cores is not None for r in self.rows):
            foot += ("\n(run CPU: cores the run itself used during the variant's measured iterations - workers, "
                     "agents, runner, delay lines - where it nears the machine's cores the emulator's own work "
                     "shapes what it measures; other CPU: cores other programs used meanwhile; the prediction "
                     "assumes the run has the machine to itself)")
        if self.skipped:
            foot += f"; {len(self.skipped)} skipped"
        notes = [f"{r.source} {r.variant}: {r.faults}" for r in self.rows if r.faults]
        if notes:
            foot += "\n\nfaults injected on purpose (the prediction includes each one's forecast where one was made):\n" \
                + "\n".join(notes)
        chance = [r for r in self.rows if r.chance_low_s is not None and r.chance_high_s is not None]
        if chance:
            foot += ("\n\nlossy paths: where one run's mean falls by chance around the prediction (5th-95th "
                     "percentile, testbed_core/planning/lossy.py), and whether this one did:\n"
                     + "\n".join(f"{r.source} {r.variant}: {r.chance_low_s:.3f}-{r.chance_high_s:.3f} s, measured "
                                  f"{r.measured_s:.3f}: {'inside' if r.chance_low_s <= r.measured_s <= r.chance_high_s else 'outside'}"
                                  for r in chance))
        twins = [r for r in self.rows if r.same_way_spread is not None and not r.within]
        if twins:
            foot += ("\n\nran the same way as another variant of the run (streams, sharing, schedule, hosts and "
                     "prediction alike): how far apart they measured, the run's own spread for that way:\n"
                     + "\n".join(f"{r.source} {r.variant}: as {', '.join(r.same_way_as)}, "
                                  f"{r.same_way_spread:.1%} apart" for r in twins))
        warming = [r for r in self.rows if r.warming]
        if warming:
            foot += ("\n\nstill warming up: the first measured iteration stands well above the others "
                     f"({WARMING:.0%} or more over their median), so the run's warm-up iterations did not bring "
                     "its channels to a steady state and its mean counts one that had not (raise "
                     "workload.warmup); the error without that iteration beside it:\n"
                     + "\n".join(f"{r.source} {r.variant}: first +{r.first_excess:.0%} over the rest, error "
                                  f"{r.error:+.1%}, without it {r.error_without_first:+.1%}" for r in warming))
        return format_table(headers, body) + "\n\n" + foot

    def write(self, folder: Path) -> tuple[Path, Path]:
        """prediction-errors.csv and prediction-errors.json under `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        csv_path, json_path = folder / "prediction-errors.csv", folder / "prediction-errors.json"
        names = list(PredictionRow.__dataclass_fields__)
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=names)
            writer.writeheader()
            for r in self.rows:
                writer.writerow(asdict(r))
        json_path.write_text(json.dumps({
            "tolerance": self.tolerance,
            "rows": [asdict(r) for r in self.rows],
            "within": len(self.rows) - len(self.beyond()),
            "beyond": len(self.beyond()),
            "skipped": self.skipped,
        }, indent=2) + "\n")
        return csv_path, json_path


def find_summaries(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """Every run summary under `paths` (files taken as given, folders searched to any
    depth), each with the name its row shows; sorted, each file once."""
    found: dict[Path, str] = {}
    for path in paths:
        if path.is_file():
            found.setdefault(path.resolve(), _shown(path))
            continue
        if not path.is_dir():
            raise ReportError(f"{path}: no such file or folder; give run folders, sweep folders or summary.json files")
        for file in sorted(path.rglob("*summary.json")):
            if file.name == SUMMARY_NAME or file.name.endswith(SUMMARY_SUFFIXES):
                found.setdefault(file.resolve(), _shown(file))
    return sorted(((p, name) for p, name in found.items()), key=lambda item: item[1])


def _shown(file: Path) -> str:
    """A summary's name in the table: its run folder for a summary.json, else the file."""
    return str(file.parent) if file.name == SUMMARY_NAME else str(file)


def _fail(why: str) -> ReportError:
    return ReportError(f"{why}; remove that file or leave its folder out")


def prediction_table(paths: Iterable[Path], tolerance: float = TOLERANCE) -> PredictionTable:
    """The a-priori prediction errors of every run summary under `paths`."""
    paths = list(paths)
    files = find_summaries(paths)
    if not files:
        raise ReportError(f"no summary.json under {', '.join(map(str, paths))}: give `testbed run` output folders, "
                          "sweep folders or kept *.summary.json files")
    table = PredictionTable(tolerance=tolerance)
    for file, name in files:
        try:
            text = file.read_text()
        except OSError as exc:
            raise _fail(f"{name}: unreadable ({exc})") from None
        if is_program_summary(text):
            table.skipped.append(f"{name}: a program run (no prediction)")
            continue
        summary = read_summary_file(file, _fail)
        assert summary is not None  # the file was just read
        twins = {name: group for group in same_way_groups(summary) for name in group}
        for variant in sorted(summary.variants, key=sort_key):
            entry = summary.variants[variant]
            if not isinstance(entry, VariantResult):
                table.skipped.append(f"{name}: {variant} failed")
                continue
            measured = float(entry.headline("iteration_time_s"))
            predicted = entry.predicted_iteration_time_s
            error = measured / predicted - 1
            faults = fault_note(summary, variant, entry)
            # a repeated variant's headline is the median of its repeats, its iteration list one repeat's
            first = None if faults or entry.repeats is not None else first_excess(entry.iteration_times_s)
            rest = entry.iteration_times_s[1:]
            table.rows.append(PredictionRow(
                source=name, scenario=summary.scenario, topology=summary.topology, variant=variant,
                predicted_s=predicted, measured_s=measured, error=error, within=abs(error) <= tolerance + 1e-9,
                calibrated=summary.calibration is not None, rates_from=entry.prediction.rates_from,
                tail_drops=entry.tail_drops(), streams=entry.streams, sharing=entry.sharing,
                faults=faults,
                chance_low_s=(entry.prediction.chance_interval_s or [None])[0],
                chance_high_s=(entry.prediction.chance_interval_s or [None, None])[-1],
                outside_cores=None if entry.machine_cpu is None else entry.machine_cpu.outside_cores,
                run_cores=None if entry.machine_cpu is None else entry.machine_cpu.run_cores,
                first_excess=first,
                error_without_first=None if first is None else (sum(rest) / len(rest)) / predicted - 1,
                same_way_as=tuple(n for n in twins.get(variant, ()) if n != variant),
                same_way_spread=same_way_spread(summary, twins[variant]) if variant in twins else None))
    return table


SAME_PREDICTION = 1e-3
"""Two a-priori predictions this close (relative) are one configuration to the planner."""


def same_way_groups(summary: Summary) -> list[tuple[str, ...]]:
    """The plain variants of one run (no ``+`` twins, no temporal plan) that ran the same
    way: the same streams, sharing, schedule, stages' DCs and hosts, and a-priori
    predictions within SAME_PREDICTION of each other. Multi-TCP and Atlas often do (Atlas
    may take multi-TCP's own way, or the baseline's one stream); their measurements are
    then two samples of one configuration, one after the other on the same network."""
    by_way: dict[str, list[tuple[str, VariantResult]]] = {}
    for name, v in summary.variants.items():
        if isinstance(v, VariantResult) and "+" not in name and v.temporal_plan is None:
            way = json.dumps([v.streams, v.sharing, v.schedule, v.placement.stage_dc, v.placement.hosts],
                             sort_keys=True)
            by_way.setdefault(way, []).append((name, v))
    groups = []
    for members in by_way.values():
        members.sort(key=lambda m: m[1].predicted_iteration_time_s)
        while len(members) >= 2:
            first = members[0][1].predicted_iteration_time_s
            same = [m for m in members if abs(m[1].predicted_iteration_time_s / first - 1) <= SAME_PREDICTION]
            members = [m for m in members if m not in same]
            if len(same) >= 2:
                groups.append(tuple(sorted((n for n, _ in same), key=sort_key)))
    return groups


def same_way_times(summary: Summary, group: tuple[str, ...]) -> list[float]:
    """The headline iteration times (the median of repeats where repeated) of `group`."""
    return [float(summary.variants[n].headline("iteration_time_s")) for n in group]  # type: ignore[union-attr]


def same_way_spread(summary: Summary, group: tuple[str, ...]) -> float:
    """How far apart the variants of `group` measured: the slowest over the fastest, minus 1."""
    times = same_way_times(summary, group)
    return max(times) / min(times) - 1


def first_excess(times: list[float]) -> float | None:
    """How far the first of a variant's measured iteration `times` stands above the
    median of the others (first / median - 1); None with fewer than 3."""
    if len(times) < 3:
        return None
    rest = statistics.median(times[1:])
    return times[0] / rest - 1 if rest > 0 else None


def fault_note(summary: Summary, variant: str, entry: VariantResult) -> str:
    """What the faults injected in `variant`'s run did to its prediction: each one's
    forecast (or why none), and the iterations that did not overlap a fault against
    the healthy prediction; "" when none was injected."""
    records = [f for f in summary.faults if f.variant == variant]
    if not records:
        return ""
    said = "; ".join(f.forecast if f.forecast is not None else f"{f.description}: not forecast (a run before "
                     "forecasts)" for f in records)
    hit = {i - summary.warmup for f in records for i in f.iterations}
    outside = [t for i, t in enumerate(entry.iteration_times_s) if i not in hit]
    healthy = entry.prediction.a_priori_iteration_time_s
    if outside and healthy:
        mean = sum(outside) / len(outside)
        said += (f"; the {len(outside)} measured iteration(s) outside them: {mean:.3f} s against the healthy "
                 f"{healthy:.3f} s ({mean / healthy - 1:+.1%})")
    return said
