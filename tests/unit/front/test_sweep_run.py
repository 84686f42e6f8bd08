"""Running sweeps: one folder per point with everything needed to repeat it, failures
recorded without stopping the sweep, resume after an interruption (including a real
SIGKILL of the sweep process), parallel points, and the `testbed sweep` command."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sweep_fakes import (  # noqa: E402
    failing_runner,
    fake_runner,
    flaky_runner,
    returning_runner,
    write_base,
    write_sweep,
)

from testbed.cli import main  # noqa: E402
from testbed.progress import Progress  # noqa: E402
from testbed.report import build_report  # noqa: E402
from testbed.sweep import SweepError, load_sweep, run_sweep  # noqa: E402
from testbed_core.contracts.summary import read_summary  # noqa: E402

ROOT = HERE.parents[1]
DELAYS = ["5ms", "25ms", "50ms", "100ms"]


def quiet() -> Progress:
    return Progress(0, "t", stream=io.StringIO(), tty=False)


def run(plan, out, **kw):
    progress = quiet()
    progress.set_total(len(plan.points))
    return run_sweep(plan, out, progress=progress, **kw)


def point_record(out: Path, pid: str) -> dict:
    return json.loads((out / pid / "point.json").read_text())


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_base(tmp_path)
    return tmp_path


def test_each_point_has_its_folder_config_record_and_provenance(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:2]}}))
    out = folder / "out"
    outcomes = run(plan, out, runner=fake_runner)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    pid = plan.points[1].id
    assert pid == "p002-delay=25ms"
    resolved = yaml.safe_load((out / pid / "scenario.resolved.yaml").read_text())
    assert resolved == plan.points[1].resolved
    record = point_record(out, pid)
    assert record["parameters"] == {"topology.wan.0.delay": "25ms"}
    assert record["status"] == "ok" and record["error"] is None and record["attempts"] == 1
    assert record["seed"] == 1 and record["duration_s"] >= 0
    prov = json.loads((out / pid / "provenance.json").read_text())
    assert prov["delay_backend"] == "relay"  # as the runner reported it
    assert prov["seed"] == 1
    assert prov["kernel"]["release"] == os.uname().release
    assert prov["python"]["version"].startswith("3.")
    assert prov["packages"]["torch"].startswith("2.13.0")
    assert "pyroute2" in prov["packages"] and "commit" in prov["git"]
    summary = read_summary(out / pid / "summary.json")
    assert summary.result("atlas").iteration_time_s < summary.result("baseline").iteration_time_s
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["id"] for p in sweep["points"]] == [p.id for p in plan.points]
    assert sweep["parameters"] == [{"path": "topology.wan.0.delay", "label": "delay", "values": DELAYS[:2]}]


def test_failed_point_is_recorded_and_the_sweep_goes_on(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["100ms", "5ms"]}}))
    out = folder / "out"
    outcomes = run(plan, out, runner=flaky_runner)
    assert [o.status for o in outcomes] == ["failed", "ok"]
    record = point_record(out, plan.points[0].id)
    assert record["status"] == "failed"
    assert record["error"] == "RuntimeError: relay lost its queue at RTT 200 ms"
    trace = (out / plan.points[0].id / "traceback.txt").read_text()
    assert "flaky_runner" in trace and "RuntimeError" in trace
    assert (out / plan.points[0].id / "scenario.resolved.yaml").exists()


def test_resume_skips_finished_points_and_reruns_failed_ones(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["5ms", "100ms"]}}))
    out = folder / "out"
    run(plan, out, runner=flaky_runner)
    first = point_record(out, plan.points[0].id)
    outcomes = run(plan, out, runner=fake_runner)
    assert [o.status for o in outcomes] == ["skipped", "ok"]
    assert point_record(out, plan.points[0].id) == first  # untouched
    again = point_record(out, plan.points[1].id)
    assert again["status"] == "ok" and again["attempts"] == 2
    assert not (out / plan.points[1].id / "traceback.txt").exists()  # stale files of the failed try are gone


def test_unfinished_point_is_rerun(folder: Path) -> None:
    """What a kill leaves behind: a point marked running, without its summary."""
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:3]}}))
    out = folder / "out"
    run(plan, out, runner=fake_runner)
    victim = out / plan.points[1].id
    record = point_record(out, plan.points[1].id)
    record.update(status="running", finished_at=None)
    (victim / "point.json").write_text(json.dumps(record))
    (victim / "summary.json").unlink()
    outcomes = run(plan, out, runner=fake_runner)
    assert [o.status for o in outcomes] == ["skipped", "ok", "skipped"]


def test_changed_configuration_is_rerun(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:2]}})
    out = folder / "out"
    run(load_sweep(path), out, runner=fake_runner)
    outcomes = run(load_sweep(path, {"topology.wan.0.rate": "500Mbit"}), out, runner=fake_runner)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    summary = read_summary(out / "p001-delay=5ms" / "summary.json")
    assert summary.result("atlas").wan_links["dc1-dc2"].goodput_mbps <= 500


def test_summary_returned_but_not_written_is_saved(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [2]}}))
    out = folder / "out"
    run(plan, out, runner=returning_runner)
    summary = read_summary(out / plan.points[0].id / "summary.json")
    assert set(summary.variants) == {"baseline", "multi-tcp", "atlas"}


def test_interrupted_point_is_marked_and_rerun(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [2, 4]}}))
    out = folder / "out"

    def interrupting(scenario, resolved, out_dir, progress):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(plan, out, runner=interrupting)
    assert point_record(out, plan.points[0].id)["status"] == "interrupted"
    assert not (out / plan.points[1].id).exists()
    assert [o.status for o in run(plan, out, runner=fake_runner)] == ["ok", "ok"]


def test_out_dir_of_something_else_is_refused(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [2]}}))
    busy = folder / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(SweepError, match=r"busy: not empty and not a sweep result folder \(no sweep.json\)"):
        run(plan, busy, runner=fake_runner)
    out = folder / "out"
    run(plan, out, runner=fake_runner)
    other = load_sweep(write_sweep(folder, {"name": "other", "parameters": {"transport.streams": [2]}}, "o.yaml"))
    with pytest.raises(SweepError, match=r"out: holds the results of sweep 't', not 'other'; choose another --out"):
        run(other, out, runner=fake_runner)


def test_parallel_jobs_run_points_in_their_own_processes(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:3]}}))
    out = folder / "out"
    outcomes = run(plan, out, runner=fake_runner, jobs=2)
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    pids = {point_record(out, p.id)["pid"] for p in plan.points}
    assert os.getpid() not in pids and len(pids) == 3
    outcomes = run(plan, out, runner=failing_runner, jobs=2)
    assert [o.status for o in outcomes] == ["skipped"] * 3


def test_parallel_failures_are_recorded(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["5ms", "100ms"]}}))
    out = folder / "out"
    outcomes = run(plan, out, runner=flaky_runner, jobs=2)
    assert [o.status for o in outcomes] == ["ok", "failed"]
    assert "relay lost its queue" in point_record(out, plan.points[1].id)["error"]


def test_parallel_jobs_need_an_importable_runner(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [2]}}))
    with pytest.raises(SweepError, match="--jobs 2 runs points in separate processes, so the runner must be importable"):
        run(plan, folder / "out", runner=lambda *a: {}, jobs=2)


def test_progress_reaches_the_runner_and_shows_eta(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:2]}}))
    stream = io.StringIO()
    run_sweep(plan, folder / "out", runner=fake_runner,
              progress=Progress(len(plan.points), "sweep t", stream=stream, tty=False))
    text = stream.getvalue()
    assert "sweep t [0/2] start p001-delay=5ms" in text
    assert "    p001-delay=5ms [1/3] baseline ok in" in text  # the runner's own steps, indented
    assert "sweep t [1/2] p001-delay=5ms ok in 0s | ETA 0s" in text


# ---------------------------------------------------------------- the command


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_command_runs_reports_and_prints_the_table(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS}})
    out = folder / "out"
    result = cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:fake_runner",
                 "--set", "transport.streams=4")
    assert result.exit_code == 0, result.output
    assert "point  delay  status  baseline s  multi-tcp s  atlas s" in result.stdout
    assert "sweep t: 4 points (4 delay)" in result.stderr
    assert "sweep t: 4/4 done in" in result.stderr
    for name in ("results.csv", "iteration_time.png", "speedup.png", "summary.txt"):
        assert (out / name).stat().st_size > 0, name
    assert yaml.safe_load((out / "p001-delay=5ms" / "scenario.resolved.yaml").read_text())["transport"]["streams"] == 4
    again = cli("sweep", str(path), "--resume", str(out), "--runner", "sweep_fakes:fake_runner",
                "--set", "transport.streams=4")
    assert again.exit_code == 0 and "4 skipped" in again.stderr


def test_command_exit_status_and_message_on_failed_points(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["5ms", "100ms"]}})
    out = folder / "out"
    result = cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:flaky_runner")
    assert result.exit_code == 1
    assert f"1 of 2 points failed (rerun them: the same command with --resume {out}):" in result.stderr
    assert f"p002-delay=100ms: RuntimeError: relay lost its queue at RTT 200 ms  (see {out}/p002-delay=100ms/traceback.txt)" in result.stderr
    assert "failed" in result.stdout  # the table shows the failed point


def test_command_refuses_a_malformed_sweep_before_running(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["5ms", "slow"]}})
    out = folder / "out"
    result = cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:fail_if_called")
    assert result.exit_code == 1
    assert f"Error: {path}: parameters.topology.wan.0.delay: value 'slow' is not a valid scenario" in result.stderr
    assert not out.exists()


def test_command_bad_set_and_bad_runner(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [2]}})
    result = cli("sweep", str(path), "--set", "transport")
    assert result.exit_code == 1 and "--set 'transport': expected path=value" in result.stderr
    result = cli("sweep", str(path), "--out", str(folder / "o"), "--runner", "nomodule_here:run")
    assert result.exit_code == 1 and "--runner 'nomodule_here:run': cannot import nomodule_here" in result.stderr


def test_default_out_is_a_new_folder_never_the_kept_one(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reproduction on a clone runs every point: the default folder is new each time
    (results/<sweep>-<UTC time>), and the kept result results/<sweep>/ is left as it is."""
    monkeypatch.chdir(folder)
    path = write_sweep(folder, {"parameters": {"transport.streams": [2, 4]}})
    kept = folder / "results" / "t"
    run(load_sweep(path), kept, runner=fake_runner)
    (kept / "kept.json").write_text("{}")
    before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    dry = cli("sweep", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == ["p001-streams=2  seed=1  to run", "p002-streams=4  seed=1  to run"]
    assert re.search(r"-> results/t-\d{8}-\d{6}Z$", dry.stderr.strip()), dry.stderr
    first = cli("sweep", str(path), "--runner", "sweep_fakes:fake_runner")
    second = cli("sweep", str(path), "--runner", "sweep_fakes:fake_runner")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert "2 skipped" not in first.stderr + second.stderr
    runs = sorted(p.name for p in (folder / "results").iterdir() if p.name != "t")
    assert len(runs) == 2 and all(re.fullmatch(r"t-\d{8}-\d{6}Z(-2)?", r) for r in runs), runs
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before


def test_resume_and_out_are_explicit(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [2, 4]}})
    out = folder / "out"
    assert cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:fake_runner").exit_code == 0
    again = cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:fail_if_called")
    assert again.exit_code == 1
    assert f"--out {out}: holds a sweep's results already; to continue that sweep pass --resume {out}" in again.stderr
    dry = cli("sweep", str(path), "--resume", str(out), "--dry-run")
    assert dry.stdout.splitlines() == ["p001-streams=2  seed=1  done", "p002-streams=4  seed=1  done"]
    both = cli("sweep", str(path), "--out", str(out), "--resume", str(out))
    assert both.exit_code == 1 and "--out and --resume both name the result folder" in both.stderr
    missing = cli("sweep", str(path), "--resume", str(folder / "nowhere"))
    assert missing.exit_code == 1
    assert f"--resume {folder / 'nowhere'}: does not exist, so there is no sweep to resume" in missing.stderr
    (out / "kept.json").write_text("{}")
    kept = cli("sweep", str(path), "--resume", str(out), "--runner", "sweep_fakes:fail_if_called")
    assert kept.exit_code == 1
    assert f"--resume {out}: this is a kept result (kept.json), which a run never writes into" in kept.stderr
    kept = cli("sweep", str(path), "--out", str(out), "--runner", "sweep_fakes:fail_if_called")
    assert kept.exit_code == 1 and f"--out {out}: this is a kept result (kept.json)" in kept.stderr
    other = write_sweep(folder, {"name": "other", "parameters": {"transport.streams": [2]}}, "o.yaml")
    (out / "kept.json").unlink()
    wrong = cli("sweep", str(other), "--resume", str(out))
    assert wrong.exit_code == 1 and f"--resume {out}: holds the results of sweep 't', not 'other'" in wrong.stderr


def interrupting_runner(scenario, resolved, out_dir, progress=None):
    """A runner whose point is cut short by Ctrl-C (importable as test_sweep_run:interrupting_runner)."""
    raise KeyboardInterrupt


def test_interrupted_command_says_how_to_resume(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [2, 4]}})
    out = folder / "out"
    result = cli("sweep", str(path), "--out", str(out), "--runner", "test_sweep_run:interrupting_runner")
    assert result.exit_code == 130
    assert f"interrupted: finished points are kept; add --resume {out} to the same command" in result.stderr
    again = cli("sweep", str(path), "--resume", str(out), "--runner", "sweep_fakes:fake_runner")
    assert again.exit_code == 0, again.output
    assert [json.loads((out / p / "point.json").read_text())["status"] for p in ("p001-streams=2", "p002-streams=4")] \
        == ["ok", "ok"]


def test_dry_run_lists_points_and_runs_nothing(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [2, 4]}})
    result = cli("sweep", str(path), "--out", str(folder / "out"), "--dry-run")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["p001-streams=2  seed=1  to run", "p002-streams=4  seed=1  to run"]
    assert not (folder / "out").exists()


# ---------------------------------------------------------------- killed for real


def test_killed_sweep_resumes_and_ends_with_the_same_csv(folder: Path, tmp_path: Path) -> None:
    delays = ["5ms", "25ms", "50ms", "75ms", "100ms", "150ms"]
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": delays}})
    out = folder / "out"
    env = dict(os.environ, FAKE_RUNNER_SLEEP="0.6",
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "sweep", str(path), "--out", str(out),
         "--runner", "sweep_fakes:fake_runner"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    finished: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(finished) < 2:
            assert proc.poll() is None, f"the sweep ended before it was killed: {proc.stderr.read().decode()}"
            for rec in out.glob("p*/point.json"):
                data = json.loads(rec.read_text())
                if data["status"] == "ok":
                    finished[data["id"]] = data["started_at"]
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert 2 <= len(finished) < len(delays)
    finished = {json.loads(r.read_text())["id"]: json.loads(r.read_text())["started_at"]
                for r in out.glob("p*/point.json") if json.loads(r.read_text())["status"] == "ok"}

    plan = load_sweep(path)
    outcomes = run(plan, out, runner=fake_runner)
    assert {o.id for o in outcomes if o.status == "skipped"} == set(finished)
    assert all(o.status == "ok" for o in outcomes if o.id not in finished)
    for pid, started in finished.items():
        assert point_record(out, pid)["started_at"] == started  # not rerun
    resumed = build_report(out)

    clean_out = tmp_path / "clean"
    run(plan, clean_out, runner=fake_runner)
    clean = build_report(clean_out)
    assert resumed.columns == clean.columns
    assert resumed.csv.read_text() == clean.csv.read_text()


def test_missing_runner_module_is_explained(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.commands.sweep as command

    real = command.importlib.util.find_spec
    monkeypatch.setattr(command.importlib.util, "find_spec",
                        lambda name, *a: None if name == "testbed.run.runner" else real(name, *a))
    path = write_sweep(folder, {"parameters": {"transport.streams": [2]}})
    result = cli("sweep", str(path), "--out", str(folder / "out"))
    assert result.exit_code == 1
    assert "the scenario runner (testbed/run/runner.py) is not installed in this checkout" in result.stderr
    assert not (folder / "out").exists()


def test_lock_is_held_while_each_point_runs_and_waited_for(folder: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--lock: a point runs only while the sweep holds the flock; one held by another
    process (as `flock FILE testbed run ...` holds it) makes the sweep wait and say so."""
    import fcntl
    import threading

    import testbed.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "LOCK_GAP_S", 0.3)
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology.wan.0.delay": DELAYS[:2]}}))
    lock = tmp_path / "emulation.lock"
    held: list[bool] = []

    def probing_runner(scenario, resolved, out_dir, progress=None):
        fd = os.open(lock, os.O_RDWR)
        try:  # another holder cannot take it while the point runs
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return fake_runner(scenario, resolved, out_dir, progress)

    other = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    threading.Timer(0.3, os.close, [other]).start()  # the other emulation ends after 0.3 s
    stream = io.StringIO()
    progress = Progress(len(plan.points), "t", stream=stream, tty=False)
    start = time.monotonic()
    outcomes = run_sweep(plan, folder / "out", runner=probing_runner, progress=progress, lock=lock)
    assert [o.status for o in outcomes] == ["ok", "ok"] and held == [True, True]
    assert time.monotonic() - start >= 0.25
    assert f"waiting for the lock {lock}" in stream.getvalue()
    # between two points the sweep pauses before asking again: an emulation that waited
    # through a point takes the lock first (a flock is not fair)
    got: list[float] = []

    def waiter() -> None:
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        got.append(time.monotonic())
        os.close(fd)

    def slow_runner(scenario, resolved, out_dir, progress=None):
        if not got and not any(t.name == "waiter" for t in threading.enumerate()):
            threading.Thread(target=waiter, name="waiter", daemon=True).start()
            time.sleep(0.2)  # the waiter is blocked on the lock while this point runs
        return fake_runner(scenario, resolved, out_dir, progress)

    run_sweep(plan, folder / "out4", runner=slow_runner, lock=lock, progress=quiet())
    assert len(got) == 1  # it got the lock between the two points
    with pytest.raises(SweepError, match="points run one at a time: drop --jobs 2"):
        run_sweep(plan, folder / "out2", runner=fake_runner, jobs=2, lock=lock, progress=quiet())
    with pytest.raises(SweepError, match="cannot open the lock file"):
        run_sweep(plan, folder / "out3", runner=fake_runner, lock=tmp_path / "nope" / "x.lock", progress=quiet())
