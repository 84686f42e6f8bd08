"""Where a run's step files live: a memory file system found from /proc/mounts, or none."""

from __future__ import annotations

from pathlib import Path

from testbed.emulation.memfs import memory_root, mount_types

MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime,size=24683792k 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
/dev/vdb /mnt/with\\040space ext4 rw 0 0
"""


def test_mount_types_reads_points_and_types() -> None:
    types = mount_types(MOUNTS)
    assert types["/dev/shm"] == "tmpfs" and types["/"] == "ext4"
    assert types["/mnt/with space"] == "ext4"


def test_the_first_writable_memory_mount_is_chosen(tmp_path: Path) -> None:
    disk, mem = tmp_path / "disk", tmp_path / "mem"
    disk.mkdir()
    mem.mkdir()
    mounts = f"/dev/vda {disk} ext4 rw 0 0\ntmpfs {mem} tmpfs rw 0 0\n"
    assert memory_root(mounts, (str(disk), str(mem))) == mem


def test_no_memory_file_system_means_none(tmp_path: Path) -> None:
    assert memory_root("/dev/vda / ext4 rw 0 0\n", (str(tmp_path),)) is None
    # a tmpfs mount point that is not there (or not a folder) is not used
    assert memory_root(f"tmpfs {tmp_path}/gone tmpfs rw 0 0\n", (f"{tmp_path}/gone",)) is None
    assert memory_root("", ()) is None
