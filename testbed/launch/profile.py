"""`testbed launch --profile`: what the launch adds to each rank so that the recorder
(testbed/launch/profile_record.py) runs there, and the ``profile.json`` it builds from
the ranks' records afterwards (testbed_core/program/profile.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from testbed.launch.models import LaunchReport
from testbed_core.program.profile import (
    PROFILE_FILE,
    GroupRecord,
    OpRecord,
    ProgramFile,
    ProgramProfile,
    RankProfile,
    StepRecord,
    program_identity,
)
from testbed_core.topology import Topology

BOOT_DIR = Path(__file__).resolve().parent / "profile_boot"
RECORDS_DIR = "profile-records"
DIR_ENV = "TESTBED_PROFILE_DIR"


def profile_env(out_dir: Path, base_pythonpath: str | None) -> dict[str, str]:
    """The variables every rank gets: where to write, and the boot folder first on PYTHONPATH."""
    records = (Path(out_dir) / RECORDS_DIR).resolve()
    path = str(BOOT_DIR) + (os.pathsep + base_pythonpath if base_pythonpath else "")
    return {DIR_ENV: str(records), "PYTHONPATH": path}


def prepare(out_dir: Path) -> Path:
    """An empty records folder (the recorder appends)."""
    records = Path(out_dir) / RECORDS_DIR
    records.mkdir(parents=True, exist_ok=True)
    for f in records.glob("rank-*.jsonl"):
        f.unlink()
    return records


def _compute_cpu(points: list[tuple[float, float, str]]) -> tuple[float | None, float | None]:
    """(wall, CPU) seconds of the spans from a wait's end to the next issue (the main thread's compute)."""
    wall = cpu = 0.0
    seen = False
    for (t0, c0, k0), (t1, c1, k1) in zip(points, points[1:], strict=False):
        if k0 == "w" and k1 == "o" and t1 >= t0 and c1 >= c0:
            wall, cpu, seen = wall + t1 - t0, cpu + c1 - c0, True
    return (wall, cpu) if seen else (None, None)


def _rank_records(path: Path, started: float
                  ) -> tuple[list[GroupRecord], list[OpRecord], float, float | None, list[str], tuple, list[dict]]:
    groups: list[GroupRecord] = []
    cpu_points: list[tuple[float, float, str]] = []
    ops: dict[int, dict] = {}
    waits: dict[int, list[tuple[float, float]]] = {}
    done: dict[int, float] = {}
    t_start, t_end, notes = started, None, []
    modules: list[dict] = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a rank killed mid-write
        ev = rec.get("ev")
        if ev == "start":
            t_start = rec["t"] - started
        elif ev == "end":
            t_end = rec["t"] - started
        elif ev == "group":
            groups.append(GroupRecord(index=rec["group"], ranks=rec["ranks"], backend=rec["backend"],
                                      streams=rec.get("streams")))
        elif ev == "op":
            ops[rec["id"]] = rec
            if "c" in rec:
                cpu_points.append((rec["t"], rec["c"], "o"))
        elif ev == "wait":
            waits.setdefault(rec["id"], []).append((rec["t0"] - started, rec["t1"] - started))
            if "c1" in rec:
                cpu_points.append((rec["t1"], rec["c1"], "w"))
        elif ev == "done":
            done[rec["id"]] = rec["t"] - started
        elif ev == "note":
            notes.append(rec.get("text", ""))
        elif ev == "modules":
            modules.extend(f for f in rec.get("files", []) if isinstance(f, dict) and "path" in f and "sha256" in f)
    out = [OpRecord(id=i, kind=r["kind"], op=r["op"], bytes=r["bytes"], peer=r.get("peer"), group=r["group"],
                    tag=r.get("tag") or 0, blocking=r["blocking"], ddp=bool(r.get("ddp")),
                    t_issue=r["t"] - started, t_issue_end=r.get("t_end", r["t"]) - started,
                    waits=waits.get(i, []), t_done=done.get(i))
           for i, r in sorted(ops.items())]
    return groups, out, t_start, t_end, notes, _compute_cpu(sorted(cpu_points)), modules


def atlas_all_reduce_algorithm() -> str:
    """Which all-reduce the atlas backend installed here runs: 'hierarchical' when its
    all-reduce goes to atlas_transport/torch/hierarchical.py (the backend or its
    collectives module holds it, or collectives.all_reduce imports it inside), else
    'ring' (the ring of collectives.py)."""
    import inspect

    try:
        import atlas_transport.torch.backend as backend
        import atlas_transport.torch.collectives as collectives
        import atlas_transport.torch.hierarchical as hierarchical
    except ImportError:
        return "ring"
    used = any(v is hierarchical or getattr(v, "__module__", None) == hierarchical.__name__
               for module in (backend, collectives) for v in vars(module).values())
    try:
        used = used or "hierarchical" in inspect.getsource(collectives.all_reduce)
    except (OSError, TypeError, AttributeError):
        pass
    return "hierarchical" if used else "ring"


def build_profile(report: LaunchReport, topology: Topology, out_dir: Path, cwd: str,
                  line_times: dict[int, list[float]]) -> ProgramProfile:
    """``profile.json`` from the ranks' records in ``out_dir/profile-records`` and the
    times the launch read each rank's JSON lines (`line_times`, Unix time per metric)."""
    records = Path(out_dir) / RECORDS_DIR
    ranks = []
    modules: dict[str, str] = {}
    for r in report.ranks:
        path = records / f"rank-{r.rank}.jsonl"
        groups, ops, t_start, t_end, notes, (wall, cpu), mods = (
            _rank_records(path, report.started) if path.is_file()
            else ([], [], 0.0, None, ["no records: the rank never imported torch or was not a Python program"],
                  (None, None), []))
        for m in mods:
            modules.setdefault(m["path"], m["sha256"])
        times = line_times.get(r.rank, [])
        steps = [StepRecord(step=int(m["step"]), step_s=float(m["step_s"]), t_line=t - report.started)
                 for m, t in zip(r.metrics, times, strict=False)
                 if isinstance(m.get("step"), int) and isinstance(m.get("step_s"), (int, float))]
        ranks.append(RankProfile(rank=r.rank, host=r.host, dc=r.dc, groups=groups, ops=ops, steps=steps,
                                 t_start=t_start, t_end=t_end, notes=notes, compute_wall_s=wall, compute_cpu_s=cpu))
    dc_of = {r.rank: r.dc for r in report.ranks}
    crossing = 0
    for rp in ranks:
        by_group = {g.index: g for g in rp.groups}
        for op in rp.ops:
            if op.kind == "send" and op.peer is not None and dc_of.get(op.peer) not in (None, rp.dc):
                crossing += op.bytes
            elif op.kind == "collective" and op.group in by_group:
                if any(dc_of.get(p) != rp.dc for p in by_group[op.group].ranks):
                    crossing += op.bytes
    wan = sum(w.a_to_b_bytes + w.b_to_a_bytes for w in report.wan_bytes) if report.wan_bytes else None
    identity = program_identity(report.command, cwd)
    identity.modules = [ProgramFile(path=_relative(p, cwd), sha256=h) for p, h in sorted(modules.items())]
    profile = ProgramProfile(program=identity, topology=topology.model_dump(mode="json"),
                             topology_file=report.topology_file, env=dict(report.env), world_size=report.world_size,
                             nproc_per_host=report.nproc_per_host, started=report.started, wall_s=report.wall_s,
                             ranks=ranks, wan_bytes=wan, recorded_wan_bytes=crossing,
                             atlas_all_reduce=atlas_all_reduce_algorithm(), transport_fingerprint=_fingerprint())
    return profile


def _fingerprint() -> str | None:
    try:
        from testbed.launch.transport_calibration import transport_fingerprint

        return transport_fingerprint()
    except (ImportError, OSError):
        return None


def calibrate_transport(profile: ProgramProfile, out_dir: Path, say: Callable[[str], None]) -> Path | None:
    """Where the profiled program's ranks used atlas across DCs: the transport's own cost
    on this machine, measured now (testbed/launch/transport_calibration.py: two ranks on
    127.0.0.1, seconds), written beside ``profile.json``; None where it needs none. A
    measure that fails is said, not raised: the profile stands, and
    `testbed whatif --program DIR --transport-cost measure` measures it later."""
    from testbed.launch.transport_calibration import STREAMS, CalibrationError, measure, write
    from testbed_core.program.transport import needs_calibration

    if not needs_calibration(profile):
        return None
    env_streams = profile.env.get("ATLAS_STREAMS", "").strip()
    group_streams = [g.streams for r in profile.ranks for g in r.groups if g.backend == "atlas" and g.streams]
    streams = int(env_streams) if env_streams.isdigit() and int(env_streams) > 0 else (
        group_streams[0] if group_streams else STREAMS)
    try:
        cal = measure(streams=streams)
    except CalibrationError as exc:
        say(f"transport calibration: {exc}; measure it later: testbed whatif --program {out_dir} "
            "--transport-cost measure")
        return None
    path = write(cal, out_dir)
    costs = ", ".join(f"{c.pattern} {c.overhead_s * 1e3:.2f} ms + bytes at {c.rate_Bps / 1e6:,.0f} MB/s"
                      for c in cal.costs)
    say(f"transport calibration (atlas on 127.0.0.1, {streams} streams, {cal.took_s:.0f} s, load "
        f"{cal.load_average}): {costs}: {path}")
    return path


def _relative(path: str, cwd: str) -> str:
    try:
        return str(Path(path).relative_to(Path(cwd).resolve()))
    except ValueError:
        return path


def write_profile(profile: ProgramProfile, out_dir: Path) -> Path:
    from testbed_core.atomic import write_text_atomic

    return write_text_atomic(Path(out_dir) / PROFILE_FILE, profile.model_dump_json(indent=None) + "\n")
