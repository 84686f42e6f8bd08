"""`allow_congestion_controls` (testbed/emulation/congestion.py): the machine-wide
allowed list widened with what a run needs, recorded for the restore; refused with a
message where an algorithm is missing from the kernel, or where the process cannot
change the list (not in the machine's initial network namespace: a controller in the
server rig's head namespace, on a machine whose default algorithm is bbr)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulation.congestion import KEY, allow_congestion_controls
from testbed.emulation.errors import EmulationError
from testbed.emulation.records import ProcFS, RunRecord


def _proc(tmp_path: Path, allowed: str, available: str) -> Path:
    base = tmp_path / "ipv4"
    base.mkdir()
    (base / "tcp_allowed_congestion_control").write_text(allowed + "\n")
    (base / "tcp_available_congestion_control").write_text(available + "\n")
    return base


def _record(tmp_path: Path, prefix: str = "tb7c1") -> RunRecord:
    return RunRecord.create(prefix, "2dc", tmp_path / "records", ProcFS())


def test_a_missing_algorithm_is_added_and_recorded(tmp_path):
    base, rec = _proc(tmp_path, "reno bbr", "reno bbr cubic"), _record(tmp_path)
    assert allow_congestion_controls({"cubic"}, rec, "topology tcp.congestion_control", base) == ["cubic"]
    assert (base / "tcp_allowed_congestion_control").read_text() == "reno bbr cubic"
    (change,) = RunRecord.load(rec.path).sysctls
    assert (change.key, change.old, change.new) == (KEY, "reno bbr", "reno bbr cubic")
    assert allow_congestion_controls({"cubic", "bbr"}, _record(tmp_path, "tb7c2"), "x", base) == []


def test_an_algorithm_the_kernel_lacks_is_refused(tmp_path):
    base, rec = _proc(tmp_path, "reno cubic", "reno cubic"), _record(tmp_path)
    with pytest.raises(EmulationError) as err:
        allow_congestion_controls({"bbr"}, rec, "topology tcp.congestion_control", base)
    assert str(err.value) == ("TCP congestion control bbr (topology tcp.congestion_control) is not available on "
                              "this kernel (available: reno cubic): load it with modprobe tcp_bbr")
    assert RunRecord.load(rec.path).sysctls == []


def test_a_list_this_namespace_cannot_change_is_refused_saying_where_to_change_it(tmp_path, monkeypatch):
    base, rec = _proc(tmp_path, "reno bbr", "reno bbr cubic"), _record(tmp_path)
    real_write = Path.write_text

    def denied(self: Path, *args, **kwargs):
        if self.name == "tcp_allowed_congestion_control":
            raise PermissionError(13, "Permission denied")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", denied)
    with pytest.raises(EmulationError) as err:
        allow_congestion_controls({"cubic"}, rec, "topology tcp.congestion_control", base)
    msg = str(err.value)
    assert msg.startswith("TCP congestion control cubic (topology tcp.congestion_control) is not in this "
                          "machine's net.ipv4.tcp_allowed_congestion_control (reno bbr), and this process cannot "
                          "add it (Permission denied: only root in the machine's initial network namespace can)")
    assert 'sysctl -w net.ipv4.tcp_allowed_congestion_control="reno bbr cubic"' in msg
    assert msg.endswith("or pick one of reno bbr in the topology")
    assert RunRecord.load(rec.path).sysctls == []  # nothing changed, nothing to restore


def test_none_allows_every_algorithm_the_kernel_has(tmp_path):
    """The server rig's call: every available algorithm, as a server's admin would."""
    base, rec = _proc(tmp_path, "reno bbr", "reno bbr cubic htcp"), _record(tmp_path)
    assert allow_congestion_controls(None, rec, "the server rig's servers", base) == ["cubic", "htcp"]
    assert (base / "tcp_allowed_congestion_control").read_text() == "reno bbr cubic htcp"
