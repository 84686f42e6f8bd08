"""`testbed whatif`: predictions at paper scale, for one topology or over a grid.

Needs no network and no root. One topology (`--topology`, `--workload`): per variant
the predicted iteration time, utilization, bubble fraction, WAN bytes and BubbleTea's
prefill capacity in the bubbles, from the fast predictor (testbed_core/whatif/). A
grid (`--grid scenarios/whatif-scale.yaml`): every point of GPUs x DCs x RTT x
bandwidth, with a progress line, written to `results.csv`, `points.json` and
`whatif.png` in `--out`. `--calibration RUN_DIR` applies what a finished `testbed run`
measured (testbed_core/whatif/calibration.py).
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import click

from testbed.commands.plan import _streams, parse_gpus
from testbed_core.variants import REGISTRY, VariantError, allowed_text, help_text, parse_variants

PAPER_SPEEDUP = 17.0  # arXiv 2411.14458: Atlas up to 17x faster than the baselines it compares with
# options of the built-in workload model's prediction, refused beside --program (parameter: flag)
_WORKLOAD_ONLY = {"workload_path": "--workload", "grid_path": "--grid", "calibration_dir": "--calibration",
                  "out_dir": "--out", "gpus_text": "--gpus", "variants": "--variants",
                  "baseline_placement": "--baseline-placement", "chunk_tokens": "--chunk-tokens", "guard": "--guard",
                  "no_allreduce": "--no-allreduce"}


def _human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


@click.command(epilog="\b\nVariants:\n" + help_text() + "\n\n\b\nEnvironment:\n  TESTBED_WHATIF_THREADS  the most "
               "strides Atlas's stride search runs at once on a large case (default: the cores, at most 4; 1: "
               "one at a time); the predictions are the same either way")
@click.option("--topology", "topology_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Topology YAML; DCs may be given as GPU counts (e.g. topologies/5dc-8k.yaml).")
@click.option("--workload", "workload_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Workload YAML (e.g. scenarios/workloads/qwen-32b-8k.yaml).")
@click.option("--grid", "grid_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A what-if grid (e.g. scenarios/whatif-scale.yaml) instead of --topology/--workload.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Grid mode: output folder (default results/whatif-<grid>-<time>/).")
@click.option("--gpus", "gpus_text", default=None, metavar="DC=N,...", help="Free GPUs per DC, overriding the topology.")
@click.option("--variants", default=",".join(REGISTRY), show_default=True,
              help=f"Comma-separated, from: {', '.join(REGISTRY)}.")
@click.option("--streams", default="8", show_default=True, help="TCP streams per channel where the variant uses N.")
@click.option("--baseline-placement", default="even", show_default=True,
              type=click.Choice(["atlas", "in-order", "even", "round-robin"]),
              help="Placement of the variants placed like the baseline; Atlas (sharing auto) takes it instead of "
                   "its own where it is predicted faster by more than a margin. --grid takes the grid file's "
                   "baseline_placement.")
@click.option("--calibration", "calibration_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of a finished `testbed run`: its measured efficiencies replace the defaults.")
@click.option("--chunk-tokens", type=click.IntRange(1, 1 << 20), default=512, show_default=True,
              help="BubbleTea's prefill chunk.")
@click.option("--guard", type=click.FloatRange(0, 10), default=0.05, show_default=True,
              help="BubbleTea's guard, a fraction of a chunk's predicted time.")
@click.option("--no-allreduce", is_flag=True, help="Leave the DP gradient all-reduce out of the iteration time.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@click.option("--program", "program_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Your own program: the folder of a `testbed launch --profile` (its profile.json), predicted on "
                   "--topology (default: the one it ran on), --rtt and --bandwidth.")
@click.option("--rtt", "rtt_text", default=None, metavar="RTT[,RTT...]",
              help="With --program: every WAN link at this RTT (e.g. 10ms,100ms,200ms: one prediction each).")
@click.option("--bandwidth", "bandwidth_text", default=None, metavar="RATE",
              help="With --program: every WAN link at this rate (e.g. 10Gbit).")
@click.option("--hosts", "hosts_text", default=None, metavar="H0,H1,...",
              help="With --program: the host of each rank on --topology, in rank order (default: the hosts it ran on).")
@click.option("--command", "command_text", default=None, metavar="COMMAND",
              help="With --program: the command you mean to run; refused unless it is the profiled one.")
@click.option("--transport-cost", "transport_cost", type=click.Choice(["profile", "measure", "none"]),
              default="profile", show_default=True,
              help="With --program: the atlas transport's own cost per transfer: as measured with the profile "
                   "(DIR/transport-calibration.json), measured now on this machine (written there), or none.")
def whatif(topology_path: Path | None, workload_path: Path | None, grid_path: Path | None, out_dir: Path | None,
           gpus_text: str | None, variants: str, streams: str, baseline_placement: str,
           calibration_dir: Path | None, chunk_tokens: int, guard: float, no_allreduce: bool, as_json: bool,
           program_dir: Path | None, rtt_text: str | None, bandwidth_text: str | None, hosts_text: str | None,
           command_text: str | None, transport_cost: str) -> None:
    """Predict iteration time, utilization, bubbles, WAN bytes and BubbleTea's prefill
    capacity per variant, at any scale (no emulation is started); with --program, the
    seconds per step of your own profiled program on another network."""
    if program_dir is not None:
        from testbed.commands.whatif_program import program_whatif

        ctx = click.get_current_context()
        given = ctx.get_parameter_source("streams") == click.core.ParameterSource.COMMANDLINE
        # the options of the built-in workload's prediction mean nothing for a profiled program:
        # say so rather than predict as if they had been taken
        ignored = [flag for name, flag in _WORKLOAD_ONLY.items()
                   if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if ignored:
            raise click.UsageError(f"{', '.join(ignored)} predict the built-in workload model; --program predicts the "
                                   "profiled program itself: drop them with --program (its own options: --topology, "
                                   "--rtt, --bandwidth, --hosts, --streams, --command, --transport-cost, --json)")
        program_whatif(program_dir, topology_path, rtt_text, bandwidth_text, hosts_text, command_text,
                       streams if given else None, as_json, transport_cost)
        return
    if rtt_text is not None or bandwidth_text is not None or hosts_text is not None or command_text is not None:
        raise click.UsageError("--rtt, --bandwidth, --hosts and --command go with --program DIR")
    from testbed_core.planning.network import NetParams
    from testbed_core.whatif.calibration import CalibrationError, load_efficiencies, run_setting
    from testbed_core.whatif.predict import stride_threads_cap

    try:
        stride_threads_cap()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None

    own_run = calibration_dir is not None and grid_path is None and topology_path is None and workload_path is None
    if grid_path is None and not own_run and (topology_path is None or workload_path is None):
        raise click.UsageError("give --topology and --workload, or --grid (e.g. --grid scenarios/whatif-scale.yaml), "
                               "or --calibration RUN_DIR alone (the run's own topology and workload)")
    if grid_path is not None and (topology_path is not None or workload_path is not None or gpus_text):
        raise click.UsageError("--grid takes its topologies, DC sizes and workload from the grid file: "
                               "drop --topology/--workload/--gpus")
    names = [v.strip() for v in variants.split(",") if v.strip()]
    try:
        if not names:
            raise VariantError(f"give at least one variant (allowed: {allowed_text()})")
        parse_variants(names)
    except VariantError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from None
    n_streams = _streams(streams)
    cal = None
    if calibration_dir is not None:
        try:
            cal = load_efficiencies(calibration_dir)
        except CalibrationError as exc:
            raise click.ClickException(f"--calibration: {exc}") from None
    net = NetParams(allreduce=not no_allreduce)
    if grid_path is not None:
        _grid(grid_path, out_dir, names, cal, net, as_json)
        return
    setting = None
    if own_run:
        try:
            setting = run_setting(calibration_dir)  # type: ignore[arg-type]
        except CalibrationError as exc:
            raise click.ClickException(f"--calibration: {exc}") from None
    _single(topology_path, workload_path, gpus_text, names, n_streams, baseline_placement, cal, net,
            chunk_tokens, guard, as_json, setting)


def _single(topology_path: Path | None, workload_path: Path | None, gpus_text: str | None, names: list[str],
            streams: int | str, baseline_placement: str, cal, net, chunk_tokens: int, guard: float, as_json: bool,
            setting=None) -> None:
    from testbed_core.configfile import ConfigError
    from testbed_core.planning.placement import PlacementError, free_gpus
    from testbed_core.topology import load_topology
    from testbed_core.whatif.evaluate import evaluate
    from testbed_core.whatif.grid import Prefill
    from testbed_core.workload import load_workload

    try:
        if setting is not None:
            topo, wl = setting
        else:
            topo, wl = load_topology(topology_path), load_workload(workload_path)  # type: ignore[arg-type]
        free = free_gpus(topo, 1, parse_gpus(gpus_text))
    except (ConfigError, PlacementError) as exc:
        raise click.ClickException(str(exc)) from None
    prefill = Prefill(chunk_tokens=chunk_tokens, min_tokens=min(32, chunk_tokens), guard=guard)
    t0 = time.perf_counter()
    rows = evaluate(topo, wl, names, streams=streams, baseline_placement=baseline_placement, net=net,
                    calibration=cal, prefill=prefill, free=free,
                    base_dir=workload_path.parent if workload_path is not None else None)
    took = time.perf_counter() - t0
    if all(not r.feasible for r in rows):
        raise click.ClickException("no variant can be placed:\n" + "\n".join(f"  {r.variant}: {r.error}" for r in rows))
    par = wl.parallelism
    if as_json:
        click.echo(json.dumps({
            "topology": topo.name, "workload": wl.name, "free_gpus": free,
            "parallelism": par.model_dump(), "calibration": cal.model_dump() if cal else None,
            "predict_s": took, "variants": [r.model_dump() for r in rows],
        }, indent=2))
        return
    echo = click.echo
    gpus = par.dp * par.pp * par.tp
    echo(f"What-if: {wl.name} ({wl.model.name}, {wl.model.layers} layers) on {topo.name}: dp={par.dp} pp={par.pp} "
         f"tp={par.tp} = {gpus:,} GPUs, {par.num_micro_batches} micro-batches, {par.schedule}; "
         f"{len(topo.dcs)} DCs: " + ", ".join(f"{dc} {n:,}" for dc, n in free.items()))
    if cal is not None:
        echo(f"  calibrated by {cal.source} ({cal.measured_on}): per-flow x{cal.flow_efficiency:.2f}, "
             f"link goodput x{cal.link_efficiency:.2f}, colliding channels "
             f"{'-' if cal.crowded_fraction is None else f'{cal.crowded_fraction:.2f}'} of it, compute "
             f"x{cal.compute_scale:.2f}, overhead {cal.overhead_s * 1e3:.1f} ms/iteration, planned transfers "
             f"hold links x{cal.temporal_hold:.2f}")
    echo(f"  {'variant':<13}{'iteration':>11}{'util':>7}{'bubble':>8}{'WAN/iter':>11}{'allreduce':>11}"
         f"{'AR WAN':>10}{'prefill tok/s':>15}{'util+BT':>9}  sharing")
    for r in rows:
        if not r.feasible:
            why = str(r.error)
            echo(f"  {r.variant:<13}{why if why.startswith('infeasible') else f'infeasible: {why}'}")
            continue
        echo(f"  {r.variant:<13}{r.iteration_s:>10.3f}s{r.utilization:>7.1%}{r.bubble_fraction:>8.1%}"
             f"{_human_bytes(r.wan_bytes):>11}{r.allreduce_s:>10.3f}s{_human_bytes(r.allreduce_wan_bytes):>10}"
             f"{r.prefill_tokens_per_s:>15,.0f}{r.utilization_with_bubbletea:>9.1%}  {r.sharing} ({r.method})")
    echo(f"  predicted in {took:.2f} s; util = compute / iteration time; bubble = idle share of the pipeline "
         f"(all-reduce apart); prefill: {chunk_tokens}-token chunks of {wl.model.name} on each stage's "
         f"{par.tp} GPU(s), guard {guard:.0%}")


def _grid(grid_path: Path, out_dir: Path | None, names: list[str], cal, net, as_json: bool) -> None:
    from testbed.progress import Progress
    from testbed_core.whatif.evaluate import Outcome, evaluate, outcome_fields
    from testbed_core.whatif.grid import GridError, PointError, load_grid, point_setup, points

    try:
        grid, base = load_grid(grid_path)
    except GridError as exc:
        raise click.ClickException(str(exc)) from None
    chosen = names if names != list(REGISTRY) else grid.variants
    out = out_dir or Path("results") / f"whatif-{grid.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    pts = points(grid)
    progress = Progress(total=len(pts), label=f"whatif {grid.name}")
    records: list[dict] = []
    t0 = time.perf_counter()
    for pt in pts:
        with progress.step(pt.label):
            key = {"gpus": pt.gpus, "dcs": pt.dcs, "rtt_ms": pt.rtt_s * 1e3, "bandwidth_gbps": pt.bandwidth_bps / 1e9}
            try:
                topo, wl = point_setup(grid, base, pt)
                rows = evaluate(topo, wl, chosen, streams=grid.streams, baseline_placement=grid.baseline_placement,
                                net=net, calibration=cal, prefill=grid.prefill, base_dir=grid_path.parent)
            except PointError as exc:
                rows = [Outcome(variant=v, feasible=False, error=str(exc)) for v in chosen]
            records.append({**key, "dp": pt.gpus // (grid.pp * grid.tp), "variants": [r.model_dump() for r in rows]})
    progress.close(f"{len(pts)} points in {time.perf_counter() - t0:.1f} s")
    fields = ["gpus", "dcs", "rtt_ms", "bandwidth_gbps", "dp", *outcome_fields(),
              "speedup_vs_baseline", "speedup_vs_dp_across_dc"]
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for rec in records:
            by = {v["variant"]: v for v in rec["variants"]}
            for v in rec["variants"]:
                row = {k: rec[k] for k in ("gpus", "dcs", "rtt_ms", "bandwidth_gbps", "dp")}
                row.update(v)
                row["speedup_vs_baseline"] = _speedup(by.get("baseline"), v)
                row["speedup_vs_dp_across_dc"] = _speedup(by.get("dp-across-dc"), v)
                writer.writerow(row)
    (out / "points.json").write_text(json.dumps({"grid": grid.model_dump(), "calibration": cal.model_dump() if cal
                                                 else None, "points": records}, indent=1))
    _plot(records, grid, out / "whatif.png")
    if as_json:
        click.echo(json.dumps({"out": str(out), "points": len(records)}))
    else:
        click.echo(f"wrote {out / 'results.csv'}, {out / 'points.json'}, {out / 'whatif.png'}")


def _speedup(reference: dict | None, row: dict) -> float | None:
    if not reference or not reference.get("feasible") or not row.get("feasible"):
        return None
    return reference["iteration_s"] / row["iteration_s"]


def _plot(records: list[dict], grid, path: Path) -> None:
    """One row per WAN bandwidth (at the grid's largest RTT): Atlas's speedup over
    the baseline and over dp-across-dc against GPUs, one line per DC count (the paper's
    17x marked), and utilization with and without BubbleTea (the paper's 94% marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from testbed_core.contracts.bubbletea import PAPER_UTILIZATION
    from testbed_core.variants import colour

    rtt = max(r["rtt_ms"] for r in records)
    bws = sorted({r["bandwidth_gbps"] for r in records})[:3]
    dcs = sorted({r["dcs"] for r in records})
    fig, grid_axes = plt.subplots(len(bws), 3, figsize=(17, 4.6 * len(bws)), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for row, bw in zip(grid_axes, bws, strict=True):
        sel = [r for r in records if r["rtt_ms"] == rtt and r["bandwidth_gbps"] == bw]
        for ax, ref in ((row[0], "baseline"), (row[1], "dp-across-dc")):
            for i, n in enumerate(dcs):
                pts = sorted((r["gpus"], _speedup(_v(r, ref), _v(r, "atlas") or {})) for r in sel if r["dcs"] == n)
                xs = [g for g, s in pts if s is not None]
                ys = [s for _, s in pts if s is not None]
                if xs:
                    ax.plot(xs, ys, styles[i % len(styles)], marker="o", color=colour("atlas"),
                            alpha=0.4 + 0.6 * (i + 1) / len(dcs), label=f"{n} DCs")
            ax.axhline(PAPER_SPEEDUP, color="grey", ls="--", lw=1)
            ax.text(0.01, PAPER_SPEEDUP, " paper: up to 17x", transform=ax.get_yaxis_transform(), va="bottom",
                    color="grey", fontsize=8)
            ax.axhline(1.0, color="black", lw=0.6)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("GPUs")
            ax.set_ylabel(f"Atlas speedup over {ref} (x)")
            ax.set_title(f"Atlas vs {ref}: {bw:g} Gbit/s, {rtt:g} ms RTT")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        ax = row[2]
        for n in (dcs[0], dcs[-1]):
            for variant, key, style in (("atlas", "utilization_with_bubbletea", "-"), ("atlas", "utilization", "--"),
                                        ("baseline", "utilization", ":")):
                pts = sorted((r["gpus"], (_v(r, variant) or {}).get(key)) for r in sel if r["dcs"] == n)
                xs = [g for g, u in pts if u is not None and not math.isnan(u)]
                ys = [u for _, u in pts if u is not None and not math.isnan(u)]
                if xs:
                    label = f"{variant}{' + BubbleTea' if 'bubbletea' in key else ''}, {n} DCs"
                    ax.plot(xs, ys, style, marker="o", color=colour(variant), alpha=0.5 if n == dcs[0] else 1.0,
                            label=label)
        ax.axhline(PAPER_UTILIZATION, color="grey", ls="--", lw=1)
        ax.text(0.01, PAPER_UTILIZATION, " paper: up to 94%", transform=ax.get_yaxis_transform(), va="bottom",
                color="grey", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("GPU utilization (compute / iteration)")
        ax.set_title(f"Utilization, with and without BubbleTea: {bw:g} Gbit/s")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="center left")
    fig.suptitle(f"what-if {grid.name}: pp={grid.pp} tp={grid.tp}, dp = GPUs / {grid.pp * grid.tp}; "
                 f"DCs in a chain, every WAN link {rtt:g} ms RTT (all points: results.csv)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _v(record: dict, name: str) -> dict | None:
    for v in record["variants"]:
        if v["variant"] == name and v["feasible"]:
            return v
    return None
