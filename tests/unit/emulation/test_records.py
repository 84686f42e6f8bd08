"""Run records and the cleanup plan, against a fake /proc tree (no root needed)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from testbed.emulation.cleanup import clean, plan_clean, shared_sysctl_origin
from testbed.emulation.records import (
    ENV_RUN,
    ProcEntry,
    ProcFS,
    RecordError,
    RunRecord,
    list_records,
    prefix_in_use,
)

ROOT_NS = 4026531840
RUN_NS = 4026532999
OTHER_NS = 4026533111


def add_proc(root: Path, pid: int, start: int, cmdline: str = "", env: dict[str, str] | None = None,
             netns: int | None = ROOT_NS, comm: str = "proc", ppid: int = 0) -> None:
    d = root / str(pid)
    d.mkdir()
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(p.encode() for p in cmdline.split()) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()))
    if netns is not None:
        (d / "ns").mkdir()
        os.symlink(f"net:[{netns}]", d / "ns" / "net")


@pytest.fixture
def proc(tmp_path: Path) -> tuple[Path, ProcFS]:
    root = tmp_path / "proc"
    root.mkdir()
    add_proc(root, 1, 1, "/sbin/init", netns=ROOT_NS)
    return root, ProcFS(root)


def make_record(tmp_path: Path, procfs: ProcFS, prefix: str = "tb123") -> RunRecord:
    return RunRecord.create(prefix, "2dc", tmp_path / "records", procfs)


def test_procfs_reads_stat_with_odd_comm(proc):
    root, procfs = proc
    add_proc(root, 4242, 777, "x", comm="a) b (c")
    assert procfs.start_time(4242) == 777
    assert procfs.start_time(99999) is None
    assert procfs.netns(4242) == ROOT_NS
    assert procfs.cmdline(4242) == "x"
    add_proc(root, 4243, 778, "y", comm="a) b (c", ppid=4242)
    assert procfs.ppid(4243) == 4242 and procfs.ppid(99999) is None


def test_claim_is_exclusive_and_private(tmp_path, proc):
    _, procfs = proc
    rec = make_record(tmp_path, procfs)
    assert stat.S_IMODE(rec.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(rec.path.stat().st_mode) == 0o600
    with pytest.raises(RecordError, match="tb123 is already taken"):
        make_record(tmp_path, procfs)


def test_record_persists_every_addition(tmp_path, proc):
    root, procfs = proc
    add_proc(root, 500, 50, "bash --norc --noediting -is mininet:tb123d0h1", netns=RUN_NS)
    rec = make_record(tmp_path, procfs)
    rec.add_node("tb123d0h1", 500, procfs)
    rec.add_process("relay", "tb123w01:python", 600, RUN_NS, procfs)
    rec.add_sysctl("net.ipv4.tcp_allowed_congestion_control", "reno bbr", "reno bbr cubic")
    data = json.loads(rec.path.read_text())
    assert data["nodes"][0] == {"pid": 500, "start": 50, "kind": "node", "name": "tb123d0h1", "netns": RUN_NS}
    assert data["processes"][0]["kind"] == "relay"
    again = RunRecord.load(rec.path)
    assert again.nodes == rec.nodes and again.sysctls == rec.sysctls
    rec.drop_processes([600])
    assert RunRecord.load(rec.path).processes == []
    with pytest.raises(RecordError, match="does not carry the run prefix tb123"):
        rec.add_node("h1", 1, procfs)


def test_plan_kills_only_verified_processes(tmp_path, proc):
    root, procfs = proc
    rec = make_record(tmp_path, procfs)
    rec.owner.pid, rec.owner.start = 100, 10  # the crashed toolkit: gone from /proc
    # a node shell still alive: same start time, carries mininet:<prefix...>
    add_proc(root, 500, 50, "bash --norc --noediting -is mininet:tb123d0h1", netns=RUN_NS)
    rec.add_node("tb123d0h1", 500, procfs)
    # a node whose PID was reused by somebody else since (start time differs: another run's shell)
    add_proc(root, 501, 51, "bash --norc --noediting -is mininet:tb777d0h2", netns=OTHER_NS)
    rec.add_node("tb123d0h2", 501, procfs)
    rec.nodes[-1].start = 40
    # a spawned process: no prefix in its command line, but marked in its environment
    add_proc(root, 600, 60, "sleep 300", env={ENV_RUN: "tb123"}, netns=RUN_NS)
    rec.add_process("process", "tb123d0h1:sleep", 600, RUN_NS, procfs)
    # a recorded PID now held by an unrelated process with the same start time (paranoia):
    # no mark in cmdline or environment, and another namespace -> left alone
    add_proc(root, 601, 61, "postgres", env={ENV_RUN: "tb999"}, netns=OTHER_NS)
    rec.add_process("process", "tb123d0h1:iperf3", 601, RUN_NS, procfs)
    # not recorded, but inside the namespace a verified process of the run holds
    add_proc(root, 700, 70, "iperf3 -s", netns=RUN_NS)
    # not recorded, root namespace: never touched
    add_proc(root, 800, 80, "sshd", netns=ROOT_NS)
    # root-namespace objects a record may list (no run creates them today; clean still removes them)
    rec.interfaces.append("tb123-x")
    rec.netns.append("tb123-ns")
    rec.add_sysctl("net.ipv4.tcp_allowed_congestion_control", "reno bbr", "reno bbr cubic")

    actions = plan_clean(RunRecord.load(rec.path), procfs)
    kills = sorted(a.pid for a in actions if a.kind == "kill")
    assert kills == [500, 600, 700]
    kinds = [a.kind for a in actions]
    assert kinds[-1] == "remove-record"
    assert "del-interface" in kinds and "del-netns" in kinds and "restore-sysctl" in kinds
    restore = next(a for a in actions if a.kind == "restore-sysctl")
    assert restore.detail == "reno bbr cubic -> reno bbr"


def test_plan_skips_a_run_in_progress(tmp_path, proc):
    root, procfs = proc
    rec = make_record(tmp_path, procfs)
    add_proc(root, 100, 10, "python -m testbed topo check", netns=ROOT_NS)
    rec.owner.pid, rec.owner.start = 100, 10
    add_proc(root, 500, 50, "bash -is mininet:tb123d0h1", netns=RUN_NS)
    rec.add_node("tb123d0h1", 500, procfs)
    actions = plan_clean(rec, procfs)
    assert [a.kind for a in actions] == ["skip"]
    assert "still active (pid 100)" in actions[0].detail


def test_clean_removes_a_dead_runs_record_and_nothing_else(tmp_path, proc):
    root, procfs = proc
    rec = make_record(tmp_path, procfs, "tbabc")
    rec.owner.pid, rec.owner.start = 100, 10
    rec.add_node("tbabcd0h1", 500, procfs)  # long gone
    rec.save()
    other = tmp_path / "records" / "notes.txt"
    other.write_text("not ours")
    dry = clean(tmp_path / "records", dry_run=True, procfs=procfs)
    assert [a.kind for a in dry.actions] == ["remove-record"]
    assert rec.path.exists()
    done = clean(tmp_path / "records", procfs=procfs)
    assert done.failures == []
    assert not rec.path.exists()
    assert other.exists()


def test_list_records_reports_files_that_are_not_records(tmp_path, proc):
    _, procfs = proc
    d = tmp_path / "records"
    make_record(tmp_path, procfs, "tb001")
    (d / "tb002.json").write_text("{not json")
    (d / "tb003.json").write_text(json.dumps({"prefix": "tb004", "owner": {"pid": 1, "start": 1, "kind": "owner"}}))
    records, problems = list_records(d)
    assert [r.prefix for r in records] == ["tb001"]
    assert any("tb002.json: unreadable run record" in p for p in problems)
    assert any("tb003.json: not a testbed run record" in p for p in problems)


def test_prefix_in_use(tmp_path, proc):
    root, procfs = proc
    make_record(tmp_path, procfs, "tb001")
    add_proc(root, 900, 90, "bash --norc -is mininet:tb002g0", netns=RUN_NS)
    assert prefix_in_use("tb001", tmp_path / "records", procfs)
    assert prefix_in_use("tb002", tmp_path / "records", procfs)
    assert not prefix_in_use("tb003", tmp_path / "records", procfs)


def test_shared_sysctl_is_kept_for_a_live_run_and_restored_by_the_last(tmp_path, proc):
    """Two runs widen the machine-wide allowed congestion controls: the first to end
    must not pull the setting from under the other; the last restores the original."""
    root, procfs = proc
    key = "net.ipv4.tcp_allowed_congestion_control"
    first = make_record(tmp_path, procfs, "tbaaa")
    add_proc(root, 100, 10, "python -m testbed run", netns=ROOT_NS)
    first.owner.pid, first.owner.start = 100, 10
    first.add_sysctl(key, "reno bbr", "reno bbr cubic")
    first.save()
    second = make_record(tmp_path, procfs, "tbbbb")
    add_proc(root, 200, 20, "python -m testbed run", netns=ROOT_NS)
    second.owner.pid, second.owner.start = 200, 20
    # the second run finds cubic allowed already: it takes over the machine's own value
    assert shared_sysctl_origin(key, second, procfs) == "reno bbr"
    second.add_sysctl(key, "reno bbr", "reno bbr cubic")
    second.save()
    # the first ends (its owner is gone) while the second still runs: keep the setting
    (root / "100").rename(root / "gone100")
    actions = plan_clean(first, procfs, [first, second])
    kinds = {a.kind: a for a in actions}
    assert "restore-sysctl" not in kinds
    assert "still needed by active run tbbbb" in kinds["keep-sysctl"].detail
    # the second ends last: it restores the machine's own value
    (root / "200").rename(root / "gone200")
    assert shared_sysctl_origin(key, first, procfs) is None
    actions = plan_clean(second, procfs, [first, second])
    assert [a.detail for a in actions if a.kind == "restore-sysctl"] == ["reno bbr cubic -> reno bbr"]


def test_temporary_paths_are_recorded_checked_and_removed_by_clean(tmp_path, proc):
    """A crashed run's temporary folder (with a socket in it) and file are removed by
    clean; a path without the run prefix, or relative, is refused when recorded."""
    import socket

    root, procfs = proc
    rec = make_record(tmp_path, procfs, "tbabc")
    rec.owner.pid, rec.owner.start = 100, 10  # the run is gone
    with pytest.raises(RecordError, match=r"temporary path 'ctl' must be absolute"):
        rec.add_path("ctl")
    with pytest.raises(RecordError, match=r"temporary path 'other-ctl' does not carry the run prefix tbabc"):
        rec.add_path(tmp_path / "other-ctl")
    folder, file, never = tmp_path / "tbabc-ctl-1234", tmp_path / "tbabc-x.json", tmp_path / "tbabc-never"
    for p in (folder, file, never):
        rec.add_path(p)
    folder.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(folder / "baseline.sock"))
    file.write_text("{}")
    assert RunRecord.load(rec.path).paths == [str(folder), str(file), str(never)]
    bystander = tmp_path / "tbabd-ctl"  # another run's: not listed, not touched
    bystander.mkdir()
    dry = clean(tmp_path / "records", dry_run=True, procfs=procfs)
    assert [(a.kind, a.target) for a in dry.actions] == [
        ("remove-path", str(folder)), ("remove-path", str(file)), ("remove-record", str(rec.path))]
    assert folder.exists()
    done = clean(tmp_path / "records", procfs=procfs)
    assert done.failures == []
    assert not folder.exists() and not file.exists() and not rec.path.exists()
    assert bystander.exists()


def test_plan_finds_marked_processes_the_record_does_not_name(tmp_path, proc):
    """Killed between starting a process and recording it: the mark finds it (the fork
    server and its children carry TESTBED_RUN in the environment they started with);
    zombies and other runs' processes are left alone."""
    root, procfs = proc
    rec = make_record(tmp_path, procfs)
    rec.owner.pid, rec.owner.start = 100, 10
    rec.nodes.append(ProcEntry(700, 70, "node", "tb123d0h1", RUN_NS))  # its shell is gone
    rec.save()
    add_proc(root, 900, 90, "python -c from multiprocessing.forkserver import main", env={ENV_RUN: "tb123"})
    add_proc(root, 901, 91, "python -c from multiprocessing.forkserver import main", env={ENV_RUN: "tb123"},
             netns=RUN_NS)  # a warm child inside a node
    add_proc(root, 902, 92, "iperf3 -s", netns=RUN_NS)  # in the namespace the warm child holds
    add_proc(root, 903, 93, "bash --norc --noediting -is mininet:tb123d0h1", netns=OTHER_NS)  # an unrecorded node
    add_proc(root, 904, 94, "python worker", env={ENV_RUN: "tb124"})  # another run's
    add_proc(root, 905, 95, "python worker", env={ENV_RUN: "tb123"})
    stat = (root / "905" / "stat").read_text().replace(" S ", " Z ", 1)
    (root / "905" / "stat").write_text(stat)  # a zombie: gone, nothing to end
    foreign_ns = OTHER_NS + 1  # a server of a test rig: a namespace of this machine the run does not own
    add_proc(root, 906, 96, "python -m testbed.emulation.remote.nodeagent", env={ENV_RUN: "tb123"}, netns=foreign_ns)
    add_proc(root, 907, 97, "sshd: /usr/sbin/sshd -D", netns=foreign_ns)
    # a remote node shell's wrapper, left in its server's namespace (the shell is in its own)
    add_proc(root, 908, 98, "sudo -E mnexec -cn env PS1= bash --norc --noediting -is mininet:tb123d1h1",
             netns=foreign_ns)
    actions = plan_clean(RunRecord.load(rec.path), procfs)
    assert sorted(a.pid for a in actions if a.kind == "kill") == [900, 901, 902, 903, 906, 908]
    assert "marked tb123" in next(a.detail for a in actions if a.pid == 900)


def test_a_zombie_owner_is_gone(tmp_path, proc):
    """A killed controller nobody reaped yet does not keep its run 'in progress'."""
    root, procfs = proc
    add_proc(root, 100, 10, "python -m testbed run")
    stat = (root / "100" / "stat").read_text().replace(" S ", " Z ", 1)
    (root / "100" / "stat").write_text(stat)
    rec = make_record(tmp_path, procfs)
    rec.owner.pid, rec.owner.start = 100, 10
    rec.save()
    actions = plan_clean(RunRecord.load(rec.path), procfs)
    assert actions[-1].kind == "remove-record" and not any(a.kind == "skip" for a in actions)


def test_prefix_is_in_use_while_a_marked_process_lives(tmp_path, proc):
    root, procfs = proc
    add_proc(root, 950, 95, "python worker", env={ENV_RUN: "tb5a5"})
    assert prefix_in_use("tb5a5", tmp_path / "records", procfs)
    assert not prefix_in_use("tb5a6", tmp_path / "records", procfs)


def test_end_processes_terms_then_kills_and_waits():
    """SIGTERM first; one that ignores it is killed after the grace; all are gone on return."""
    import subprocess
    import sys

    from testbed.emulation.cleanup import end_processes

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ok', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ok"
    procfs = ProcFS()
    targets = [(p.pid, procfs.start_time(p.pid)) for p in (polite, stubborn)]
    assert end_processes(targets, procfs, grace_s=0.3, kill_wait_s=10) == []
    assert [procfs.start_time(pid) for pid, _ in targets] == [None, None]  # gone (and reaped) on return
    polite.wait(5), stubborn.wait(5)


def test_remote_clean_without_its_identity_file_fails_at_once_and_says_why():
    from testbed.emulation.cleanup import remote_clean
    from testbed.emulation.records import RemoteEntry

    entry = RemoteEntry("s1", {"server": "s1", "address": "10.9.9.9", "user": "root", "port": 22,
                               "identity": "/nonexistent/tb123-rig/id_ed25519"})
    msg = remote_clean("tb123", entry)
    assert msg is not None and "server s1 (10.9.9.9): not cleaned over SSH: its login's identity file " \
        "/nonexistent/tb123-rig/id_ed25519 no longer exists" in msg
