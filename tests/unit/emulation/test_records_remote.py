"""Run records of servers reached over SSH (testbed/emulation/records.py, cleanup.py): a server is
written with its login before anything is made there, survives a reload, becomes a
`remote-clean` step of the cleanup, and a record is kept while a server could not be
cleaned (so a later `testbed clean` tries again). Against a fake /proc; the SSH step is
stood in for (tests/cluster/test_cluster_clean_remote.py runs it for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import testbed.emulation.cleanup as cleanup
from testbed.emulation.cleanup import execute, plan_clean
from testbed.emulation.records import ProcFS, RecordError, RemoteEntry, RunRecord
from testbed.emulation.remote.sshlogin import RemoteLogin

LOGIN = RemoteLogin(server="s2", address="192.0.2.11", identity="/k/id", known_hosts="/k/kh",
                    python="/opt/v/bin/python").model_dump()


@pytest.fixture
def procfs(tmp_path: Path) -> ProcFS:
    root = tmp_path / "proc"
    (root / "1").mkdir(parents=True)
    (root / "1" / "stat").write_text("1 (init) S " + " ".join(["0"] * 17) + " 1 0\n")
    return ProcFS(root)


def _dead_record(tmp_path: Path, procfs: ProcFS) -> RunRecord:
    rec = RunRecord.create("tb0a1", "2dc", tmp_path / "records", procfs)
    rec.owner.pid, rec.owner.start = 999999, 5  # its owner is gone: clean may act
    rec.save()
    return rec


def test_a_remote_server_is_recorded_with_its_login_and_paths(tmp_path, procfs):
    rec = _dead_record(tmp_path, procfs)
    rec.add_remote("s2", LOGIN)
    rec.add_remote("s2", LOGIN)  # once per server
    rec.add_remote_path("s2", "/tmp/tb0a1-agent-1234")
    with pytest.raises(RecordError, match="does not carry the run prefix tb0a1"):
        rec.add_remote_path("s2", "/etc")
    with pytest.raises(RecordError, match="server 's9' is not in run record tb0a1"):
        rec.add_remote_path("s9", "/tmp/tb0a1-x")
    data = json.loads(rec.path.read_text())
    assert data["remote"] == [{"server": "s2", "login": LOGIN, "paths": ["/tmp/tb0a1-agent-1234"]}]
    again = RunRecord.load(rec.path)
    assert again.remote[0].login["address"] == "192.0.2.11" and again.remote[0].paths == ["/tmp/tb0a1-agent-1234"]


def test_clean_reaches_each_recorded_server_and_removes_the_record_when_done(tmp_path, procfs, monkeypatch):
    rec = _dead_record(tmp_path, procfs)
    rec.add_remote("s2", LOGIN)
    actions = plan_clean(RunRecord.load(rec.path), procfs)
    (step,) = [a for a in actions if a.kind == "remote-clean"]
    assert step.target == "s2" and step.detail == "over SSH root@192.0.2.11"
    asked = []
    monkeypatch.setattr(cleanup, "remote_clean", lambda prefix, entry: asked.append((prefix, entry.server)))
    assert execute(actions, procfs) == []
    assert asked == [("tb0a1", "s2")]
    assert not rec.path.exists()


def test_a_record_is_kept_while_a_server_could_not_be_cleaned(tmp_path, procfs, monkeypatch):
    rec = _dead_record(tmp_path, procfs)
    rec.add_remote("s2", LOGIN)
    monkeypatch.setattr(cleanup, "remote_clean", lambda prefix, entry: f"server {entry.server}: unreachable")
    failures = execute(plan_clean(RunRecord.load(rec.path), procfs), procfs)
    assert "server s2: unreachable" in failures
    assert any("kept, a server could not be cleaned over SSH" in f for f in failures)
    assert rec.path.exists()


def test_remote_clean_runs_the_agent_over_the_recorded_login(monkeypatch, tmp_path):
    seen = {}
    identity = tmp_path / "id"
    identity.write_text("key")

    def fake_run(argv, **kwargs):
        seen["argv"] = argv
        import subprocess

        return subprocess.CompletedProcess(argv, 255, "", "ssh: connect to host 192.0.2.11 port 22: No route")

    monkeypatch.setattr("subprocess.run", fake_run)
    entry = RemoteEntry("s2", {**LOGIN, "identity": str(identity)}, ["/tmp/tb0a1-x"])
    message = cleanup.remote_clean("tb0a1", entry)
    assert seen["argv"][-1] == ("/opt/v/bin/python -m testbed.emulation.remote.nodeagent clean --run tb0a1 "
                                "--path /tmp/tb0a1-x")
    assert message is not None and message.startswith("server s2 (192.0.2.11): clean over SSH failed (exit 255)")
    assert "run `testbed clean` where that server is reachable" in message


def test_a_login_whose_identity_file_is_gone_is_not_tried(monkeypatch):
    def fake_run(argv, **kwargs):  # pragma: no cover - must not be called
        raise AssertionError(f"ssh was run: {argv}")

    monkeypatch.setattr("subprocess.run", fake_run)
    message = cleanup.remote_clean("tb0a1", RemoteEntry("s2", LOGIN, []))
    assert message is not None
    assert "its login's identity file /k/id no longer exists" in message
    assert "remove the record if the server is gone" in message


def _rig_login(tmp_path: Path) -> dict:
    import tempfile

    folder = Path(tempfile.gettempdir()).resolve() / "tbf0e-rig-0badc0de"  # a rig's key folder, never made here
    assert not folder.exists()
    return {**LOGIN, "identity": str(folder / "id_ed25519"), "known_hosts": str(folder / "known_hosts")}


def test_a_server_of_a_test_rig_that_is_gone_is_cleaned_on_this_machine(monkeypatch, tmp_path):
    """A rig's servers are namespaces of this machine: with the rig's key folder and its
    record gone, the node agent's clean runs here (same processes, same files), not over
    an SSH that no longer answers."""
    seen = {}

    def fake_run(argv, **kwargs):
        import subprocess

        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("subprocess.run", fake_run)
    monkeypatch.setattr(cleanup, "RECORD_DIR", tmp_path / "records")
    entry = RemoteEntry("s1", _rig_login(tmp_path), ["/tmp/tb0a1-agent-x"])
    assert cleanup.rig_prefix(entry.login["identity"]) == "tbf0e"
    assert cleanup.remote_clean("tb0a1", entry) is None
    assert "ssh" not in seen["argv"][0]
    assert seen["argv"][1:] == ["-m", "testbed.emulation.remote.nodeagent", "clean", "--run", "tb0a1",
                                "--path", "/tmp/tb0a1-agent-x"]
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "tbf0e.json").write_text("{}")  # the rig's record is still there: not gone
    seen.clear()
    message = cleanup.remote_clean("tb0a1", entry)
    assert message is not None and "no longer exists" in message and not seen


def test_a_dead_rig_is_cleaned_before_the_runs_that_used_it(monkeypatch, tmp_path, procfs):
    """Both dead: the rig goes first, so the run that reached its servers is then cleaned
    on this machine rather than over the rig's SSH, which no longer answers."""
    monkeypatch.setattr(cleanup, "RECORD_DIR", tmp_path / "records")
    rig = RunRecord.create("tbf0e", "server-rig", tmp_path / "records", procfs)
    rig.owner.pid, rig.owner.start = 999998, 5
    rig.save()
    run = RunRecord.create("tb001", "2dc", tmp_path / "records", procfs)  # sorts before the rig
    run.owner.pid, run.owner.start = 999999, 5
    run.add_remote("s1", _rig_login(tmp_path))
    assert cleanup.uses_rig(RunRecord.load(run.path), "tbf0e")
    assert not cleanup.uses_rig(RunRecord.load(run.path), "tb000")
    order: list[str] = []

    def fake_execute(actions, procfs=None):
        order.append(next(Path(a.target).stem for a in actions if a.kind == "remove-record"))
        return []

    monkeypatch.setattr(cleanup, "execute", fake_execute)
    report = cleanup.clean(tmp_path / "records", procfs=procfs)
    assert report.failures == []
    assert order == ["tbf0e", "tb001"]
