"""The emulated device: modelled and real work, its shared timeline, and real
contention between threads and between processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from testbed_core.compute_model import ComputeModel, gpu_spec
from testbed_core.device_records import WorkRecord
from testbed_runtime.device import Device, DeviceError, default_time_scale, write_timeline_csv


def test_modelled_run_holds_for_the_duration_and_records(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    t0 = time.time()
    rec = dev.run("forward", "train:p0r0", duration_s=0.05, label="F0")
    assert rec.duration >= 0.05 - 1e-3  # never less; how much more: tests/floors/test_device_timing_floor.py
    assert rec.start >= t0 and rec.end <= time.time()
    assert (rec.kind, rec.owner, rec.label, rec.mode, rec.modelled_s) == ("forward", "train:p0r0", "F0", "modelled", 0.05)
    assert dev.timeline() == [rec]  # read back from the file, same fields
    assert (tmp_path / "devices" / "gpu0.timeline.jsonl").exists()


def test_flops_use_the_compute_model_and_time_scale_shrinks_wall_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed_runtime.device as device_mod

    until: list[float] = []
    real_sleep_until = device_mod._sleep_until
    monkeypatch.setattr(device_mod, "_sleep_until", lambda t, *a: until.append(t) or real_sleep_until(t, *a))
    cm = ComputeModel(gpu_spec("A100"), "bf16", efficiency=0.5)
    dev = Device("gpu0", tmp_path, compute=cm, time_scale=0.5)
    rec = dev.run("backward", "me", flops=156e12 * 0.1)  # 0.1 model seconds
    assert rec.modelled_s == pytest.approx(0.1)
    assert until[0] - rec.start == pytest.approx(0.05)  # half of it on the wall clock
    assert rec.duration >= 0.05 - 1e-3  # how much more, the floor: tests/floors/test_device_timing_floor.py
    with pytest.raises(DeviceError, match="needs a compute model"):
        Device("gpu1", tmp_path).run("forward", "me", flops=1e9)
    with pytest.raises(DeviceError, match="needs flops= or duration_s="):
        dev.run("forward", "me")


def test_time_scale_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TESTBED_TIME_SCALE", "0.25")
    assert default_time_scale() == 0.25
    assert Device("g", tmp_path).time_scale == 0.25
    monkeypatch.setenv("TESTBED_TIME_SCALE", "fast")
    with pytest.raises(DeviceError, match="TESTBED_TIME_SCALE='fast' is not a number"):
        Device("g", tmp_path)


def test_modelled_with_fn_runs_it_and_reports_overrun(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    rec = dev.run("forward", "me", duration_s=0.03, fn=lambda: 41 + 1)
    assert rec.result == 42 and rec.overrun_s == 0
    assert rec.duration >= 0.03 - 1e-3
    slow = dev.run("forward", "me", duration_s=0.01, fn=lambda: time.sleep(0.05))
    assert slow.overrun_s >= 0.04 - 1e-3  # the sleep's 0.05 s past the 0.01 s asked; the floor bounds it above


def test_real_mode_times_torch_work(tmp_path: Path) -> None:
    import torch  # a pinned dependency: never skipped

    from testbed_runtime.device import torch_device

    dev = Device("gpu0", tmp_path, mode="real")
    a = torch.randn(128, 128, device=torch_device())
    rec = dev.run("prefill", "bubbletea", fn=lambda: (a @ a).sum().item())
    assert rec.mode == "real" and rec.modelled_s is None and isinstance(rec.result, float)
    assert rec.duration > 0
    with pytest.raises(DeviceError, match="real mode runs fn"):
        dev.run("prefill", "bubbletea", duration_s=1.0)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="device name 'gpu 0'"):
        Device("gpu 0", tmp_path)
    with pytest.raises(DeviceError, match="allowed modes are 'modelled' and 'real'"):
        Device("g", tmp_path, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="needs a kind"):
        Device("g", tmp_path).run("", "me", duration_s=0)
    with pytest.raises(DeviceError, match="duration_s must be >= 0"):
        Device("g", tmp_path).run("forward", "me", duration_s=-1)


def test_threads_contend_and_try_run_refuses_a_busy_device(tmp_path: Path) -> None:
    # Two Device objects for the same GPU, as two agents would open it.
    a, b = Device("gpu0", tmp_path), Device("gpu0", tmp_path)
    started = threading.Event()

    def hold() -> None:
        a.run("forward", "train", duration_s=0.2, fn=started.set)

    th = threading.Thread(target=hold)
    th.start()
    started.wait(2)
    assert b.busy()
    cur = b.current()
    assert cur is not None and cur.owner == "train" and cur.expected_end is not None and cur.expected_end > time.time()
    assert b.try_run("prefill", "bubbletea", duration_s=0.01) is None
    rec = b.run("prefill", "bubbletea", duration_s=0.01)  # waits for the forward
    th.join()
    first = a.timeline()[0]
    assert rec.start >= first.end
    assert rec.wait_s > 0.1
    assert not b.busy() and b.current() is None
    b.current_path.write_text('{"owner": "crashed"}')  # left by a holder that died
    assert b.current() is None


def test_utilization_and_idle_slots(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path)
    t0 = time.time()
    dev.run("forward", "x", duration_s=0.05)
    time.sleep(0.1)
    dev.run("backward", "x", duration_s=0.05)
    t1 = time.time()
    recs = dev.timeline(since=t0)
    busy = sum(r.duration for r in recs)
    assert dev.utilization(t0, t1) == pytest.approx(busy / (t1 - t0))
    slots = dev.idle_slots(t0, t1, min_s=0.05)
    assert len(slots) == 1
    assert slots[0] == (recs[0].end, recs[1].start)
    assert dev.timeline(since=recs[0].end) == [recs[1]]
    with pytest.raises(DeviceError, match="window is empty"):
        dev.utilization(t1, t0)


def test_timeline_survives_a_torn_line_and_exports_csv(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path)
    dev.run("forward", "x", duration_s=0)
    with open(dev.timeline_path, "a") as fh:
        fh.write('{"device": "gpu0", "kind"')  # a writer killed mid-line
    assert len(dev.timeline()) == 1
    out = tmp_path / "t.csv"
    write_timeline_csv(dev.timeline(), out)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("device,kind,owner,label,requested,start,end")
    assert len(lines) == 2
    assert WorkRecord.from_json(dev.timeline()[0].to_json()) == dev.timeline()[0]


def test_two_processes_share_one_device(tmp_path: Path, child_env: dict[str, str]) -> None:
    """A training worker and an agent in separate processes: never overlapping,
    the later one waits, both appear in the same timeline."""
    script = textwrap.dedent(
        """
        import pathlib, sys, time
        from testbed_runtime.device import Device
        dev = Device("gpu0", sys.argv[1], time_scale=1.0)
        barrier = pathlib.Path(sys.argv[1])
        (barrier / f"ready.{sys.argv[2]}").touch()
        deadline = time.time() + 30
        while len(list(barrier.glob("ready.*"))) < 2 and time.time() < deadline:  # start together
            time.sleep(0.002)
        for i in range(3):
            dev.run(sys.argv[2], sys.argv[3], duration_s=0.1, label=str(i))
        """
    )
    t0 = time.time()
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), kind, owner], env=child_env)
        for kind, owner in (("forward", "train:p0r0"), ("prefill", "bubbletea"))
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0
    recs = Device("gpu0", tmp_path).timeline()
    assert len(recs) == 6
    assert {r.owner for r in recs} == {"train:p0r0", "bubbletea"}
    assert len({r.pid for r in recs}) == 2
    for prev, cur in zip(recs, recs[1:], strict=False):
        assert cur.start >= prev.end, f"{cur} overlaps {prev}"
    assert recs[-1].end - recs[0].start >= 0.6 - 1e-3  # serialised: 6 x 0.1 s
    assert max(r.wait_s for r in recs) > 0.05  # someone really waited
    assert recs[0].start >= t0


# ----------------------------------------------------------------- leases (issue 30)

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from testbed_runtime.device import Device
    run_dir, lease_s, guard_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    dev = Device("gpu0", run_dir)
    def fn():
        Path(run_dir, "held").write_text("x")
        t_end = time.time() + 30
        while time.time() < t_end:      # a holder that never looks at should_yield()
            time.sleep(0.01)
            if Path(run_dir, "go").exists():
                return
    dev.try_run("prefill", "bubbletea:gpu0", duration_s=0.0, fn=fn, label="r1601:hold",
                deadline=time.time() + lease_s, guard_s=guard_s)
""")


def _start_holder(tmp_path: Path, lease_s: float, guard_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path), str(lease_s), str(guard_s)],
                            cwd=Path(__file__).resolve().parents[3])
    t_end = time.time() + 30
    while not (tmp_path / "held").exists():
        assert proc.poll() is None, "the holder process died before holding the device"
        assert time.time() < t_end, "the holder never held the device"
        time.sleep(0.01)
    return proc


def test_training_revokes_a_lease_past_its_deadline_plus_guard(tmp_path: Path) -> None:
    """A holder that ignores its deadline (as a starved or descheduled one does) cannot
    make training wait past deadline + guard; both sides record the overrun."""
    holder = _start_holder(tmp_path, lease_s=0.3, guard_s=0.05)
    try:
        dev = Device("gpu0", tmp_path)
        lease = dev.lease()
        assert lease is not None and lease.label == "r1601:hold" and lease.pid == holder.pid
        rec = dev.run("forward", "train:p0r0", duration_s=0.01, label="F0")
        assert rec.revoked_lease == lease.id
        assert rec.start >= lease.deadline + lease.guard_s - 1e-3
        assert rec.start < lease.deadline + 5.0  # not the holder's 30 s
        (tmp_path / "go").write_text("x")
        assert holder.wait(30) == 0
    finally:
        holder.kill()
    events = dev.overruns()
    revoked = [e for e in events if e.event == "revoked"]
    assert len(revoked) == 1 and revoked[0].label == "r1601:hold" and revoked[0].by == "train:p0r0"
    assert "past its deadline" in revoked[0].cause
    overrun = [e for e in events if e.event == "overrun"]
    assert len(overrun) == 1 and overrun[0].revoked and overrun[0].overrun_s > 0
    assert "revoked by training" in overrun[0].cause
    held = [r for r in dev.timeline() if r.kind == "prefill"]
    assert held and held[0].revoked_at is not None and held[0].deadline == lease.deadline
    assert held[0].end == pytest.approx(held[0].revoked_at)  # the device was training's from then on


def test_a_sigstopped_holder_gives_the_device_back_at_once(tmp_path: Path) -> None:
    import os
    import signal

    holder = _start_holder(tmp_path, lease_s=30.0, guard_s=0.05)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        dev = Device("gpu0", tmp_path)
        t0 = time.time()
        rec = dev.run("forward", "train:p0r0", duration_s=0.01, label="F0")
        assert rec.revoked_lease  # took the device without the holder's lock
        assert rec.start - t0 < 5.0  # not the lease's 30 s: a stopped holder cannot use it
        rec2 = dev.run("backward", "train:p0r0", duration_s=0.01, label="B0")  # and again, still stopped
        assert rec2.revoked_lease == rec.revoked_lease
        (revoked,) = [e for e in dev.overruns() if e.event == "revoked"]
        assert "stopped (SIGSTOP)" in revoked.cause and revoked.overrun_s < 0
        # the holder wakes: it may not take the device while training wants it; it ends
        os.kill(holder.pid, signal.SIGCONT)
        (tmp_path / "go").write_text("x")
        assert holder.wait(30) == 0
    finally:
        holder.kill()
    assert dev.run("forward", "train:p0r0", duration_s=0.0).revoked_lease == ""  # the lock again


def test_a_killed_holder_frees_the_device(tmp_path: Path) -> None:
    holder = _start_holder(tmp_path, lease_s=30.0, guard_s=0.05)
    holder.kill()
    holder.wait(30)
    dev = Device("gpu0", tmp_path)
    assert dev.lease() is None  # its lease file names a process that is gone
    rec = dev.run("forward", "train:p0r0", duration_s=0.01)
    assert rec.revoked_lease == ""  # the kernel dropped its flock with its files


def test_holder_yields_when_training_asks_and_try_run_backs_off(tmp_path: Path) -> None:
    holder_dev, train_dev = Device("gpu0", tmp_path), Device("gpu0", tmp_path)
    stopped: list[str | None] = []
    held = threading.Event()

    def fn() -> None:
        held.set()
        t_end = time.time() + 10
        while time.time() < t_end:
            why = holder_dev.wait_yield(t_end - time.time())  # sleeps until training pokes
            if why is not None:
                stopped.append(why)
                return

    t = threading.Thread(target=lambda: holder_dev.try_run(
        "prefill", "agent", duration_s=0.0, fn=fn, label="r1:hold", deadline=time.time() + 10, guard_s=0.01))
    t.start()
    assert held.wait(10)
    rec = train_dev.run("forward", "train", duration_s=0.01)
    t.join(10)
    assert stopped == ["wanted"] and rec.revoked_lease == ""
    assert train_dev.overruns() == []  # released before its deadline: nothing to record
    # while training marks the device as wanted, a new try_run does not take it
    marker = train_dev.want_dir / f"{__import__('os').getpid()}.1"
    marker.touch()
    try:
        assert holder_dev.try_run("prefill", "agent", duration_s=0.0) is None
    finally:
        marker.unlink()
    assert holder_dev.try_run("prefill", "agent", duration_s=0.0) is not None


def test_modelled_leased_work_is_preempted_when_training_asks(tmp_path: Path) -> None:
    agent_dev, train_dev = Device("gpu0", tmp_path), Device("gpu0", tmp_path)
    box: dict[str, WorkRecord | None] = {}
    t = threading.Thread(target=lambda: box.update(rec=agent_dev.try_run(
        "prefill", "agent", duration_s=5.0, label="r2:0:512", deadline=time.time() + 10)))
    t.start()
    t_end = time.time() + 10
    while agent_dev.lease() is None and time.time() < t_end:
        time.sleep(0.001)
    train_dev.run("forward", "train", duration_s=0.0)
    t.join(10)
    rec = box["rec"]
    assert rec is not None and rec.preempted and rec.duration < 5.0


def test_a_lease_needs_a_finite_deadline(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="a lease needs a finite deadline and guard_s >= 0"):
        Device("gpu0", tmp_path).try_run("prefill", "agent", duration_s=0.0, deadline=float("inf"))
    with pytest.raises(DeviceError, match="guard_s=-1"):
        Device("gpu0", tmp_path).try_run("prefill", "agent", duration_s=0.0, deadline=1.0, guard_s=-1)


def test_a_misspelt_work_argument_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    with pytest.raises(TypeError, match=r"unknown work argument\(s\) duraton_s; allowed: flops, duration_s"):
        dev.run("forward", "train:p0r0", duraton_s=0.01)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown work argument"):
        dev.try_run("prefill", "bubbletea:a", deadlines=1.0)  # type: ignore[call-arg]
    assert dev.timeline() == []
