"""A local run's temporary folders (the runner's control sockets) are removed when the
run ends, also when it ends in an error: nothing of a `--local` run stays in /tmp."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.network import open_network
from testbed.run.scenario import load_scenario
from testbed_core.constants import SCENARIOS_DIR


def _local_scenario():
    scenario, _ = load_scenario(SCENARIOS_DIR / "quickstart.yaml", {"runner.local": True})
    return scenario


def test_a_local_runs_temp_folders_go_with_it() -> None:
    with open_network(_local_scenario(), Progress(label="t", tty=False)) as net:
        folder = net.temp_dir("ctl")
        (folder / "atlas.sock").write_text("")
        assert folder.is_dir() and folder.name.startswith("tbrun-ctl-")
    assert not folder.exists()


def test_a_local_run_that_fails_leaves_no_temp_folder() -> None:
    made: list[Path] = []
    with pytest.raises(RuntimeError, match="boom"):
        with open_network(_local_scenario(), Progress(label="t", tty=False)) as net:
            made.append(net.temp_dir("ctl"))
            raise RuntimeError("boom")
    assert made and not made[0].exists()


def test_a_local_runs_memory_folder_goes_with_it() -> None:
    with open_network(_local_scenario(), Progress(label="t", tty=False)) as net:
        folder = net.memory_dir("steps")
        if folder is None:
            pytest.skip("no memory file system on this machine")
        assert folder.is_dir() and folder.name.startswith("tbrun-steps-")
        assert folder.parent in {Path("/dev/shm"), Path("/run/shm")}
    assert not folder.exists()


def test_step_files_are_kept_without_fifos_and_freed(tmp_path: Path) -> None:
    import os

    from testbed.run.runner import keep_step_files

    src, dst = tmp_path / "mem", tmp_path / "run"
    (src / "devices").mkdir(parents=True)
    (src / "devices" / "d.timeline.jsonl").write_text('{"a": 1}\n')
    (src / "devices" / "d.lock").write_text("")
    os.mkfifo(src / "devices" / "d.yield")
    (src / "devices" / "d.want").mkdir()
    dst.mkdir()
    keep_step_files(src, dst)
    assert (dst / "devices" / "d.timeline.jsonl").read_text() == '{"a": 1}\n'
    assert (dst / "devices" / "d.want").is_dir()
    assert not (dst / "devices" / "d.yield").exists()  # a FIFO is not copied (opening it would block)
    assert not src.exists()
