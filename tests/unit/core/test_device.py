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
from testbed_core.device import (
    Device,
    DeviceError,
    WorkRecord,
    default_time_scale,
    write_timeline_csv,
)


def test_modelled_run_holds_for_the_duration_and_records(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    t0 = time.time()
    rec = dev.run("forward", "train:p0r0", duration_s=0.05, label="F0")
    assert rec.duration == pytest.approx(0.05, abs=0.02)
    assert rec.start >= t0 and rec.end <= time.time()
    assert (rec.kind, rec.owner, rec.label, rec.mode, rec.modelled_s) == ("forward", "train:p0r0", "F0", "modelled", 0.05)
    assert dev.timeline() == [rec]  # read back from the file, same fields
    assert (tmp_path / "devices" / "gpu0.timeline.jsonl").exists()


def test_flops_use_the_compute_model_and_time_scale_shrinks_wall_time(tmp_path: Path) -> None:
    cm = ComputeModel(gpu_spec("A100"), "bf16", efficiency=0.5)
    dev = Device("gpu0", tmp_path, compute=cm, time_scale=0.5)
    rec = dev.run("backward", "me", flops=156e12 * 0.1)  # 0.1 model seconds
    assert rec.modelled_s == pytest.approx(0.1)
    assert rec.duration == pytest.approx(0.05, abs=0.02)  # half of it on the wall clock
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
    assert rec.duration == pytest.approx(0.03, abs=0.02)
    slow = dev.run("forward", "me", duration_s=0.01, fn=lambda: time.sleep(0.05))
    assert slow.overrun_s == pytest.approx(0.04, abs=0.02)


def test_real_mode_times_torch_work(tmp_path: Path) -> None:
    import torch  # a pinned dependency: never skipped

    from testbed_core.device import torch_device

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
    assert cur is not None and cur["owner"] == "train" and cur["expected_end"] > time.time()
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
        from testbed_core.device import Device
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
