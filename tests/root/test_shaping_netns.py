"""Namespace access by PID without named namespaces, throwaway namespaces, and the
kernel feature probe on this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from testbed.emulation import kernel
from testbed.emulation.netns import (
    NetnsError,
    in_netns,
    named_netns,
    open_iproute,
    private_netns,
    run_in_netns,
    stale_netns_names,
    temporary_netns,
)

pytestmark = [pytest.mark.root, pytest.mark.alone]  # named namespaces come and go: run alone


@pytest.fixture
def unnamed_host():
    """A process in its own unnamed network namespace, like a Mininet host."""
    code = "import ctypes,sys,time; assert ctypes.CDLL(None).unshare(0x40000000)==0; print('in', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_open_iproute_by_pid_leaves_no_named_netns(unnamed_host: int) -> None:
    before = named_netns()
    with open_iproute(unnamed_host) as ipr:
        names = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        ipr.link("add", ifname="nsx0", kind="veth", peer="nsx1")
        assert {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()} >= {"nsx0", "nsx1"}
    assert names == {"lo"}  # the host's namespace, not ours
    assert "nsx0" not in {name for _, name in socket.if_nameindex()}
    assert named_netns() == before


def test_in_netns_and_run_in_netns(unnamed_host: int) -> None:
    own = os.readlink("/proc/thread-self/ns/net")
    target = os.readlink(f"/proc/{unnamed_host}/ns/net")
    assert run_in_netns(unnamed_host, lambda: os.readlink("/proc/thread-self/ns/net")) == target
    assert os.readlink("/proc/thread-self/ns/net") == own
    with in_netns(unnamed_host):
        assert os.readlink("/proc/thread-self/ns/net") == target
    assert os.readlink("/proc/thread-self/ns/net") == own


def test_missing_namespace_is_explained() -> None:
    with pytest.raises(NetnsError, match="does not exist \\(has the host process exited\\?\\)"):
        open_iproute(2**22 + 12345)


def test_private_netns_vanishes() -> None:
    with private_netns() as ns:
        inode = os.readlink(ns.path)
        assert inode != os.readlink("/proc/thread-self/ns/net")
    assert not any(
        os.path.exists(f"/proc/{p}/ns/net") and os.readlink(f"/proc/{p}/ns/net") == inode
        for p in os.listdir("/proc") if p.isdigit()
    )


def test_temporary_netns_is_always_deleted() -> None:
    with pytest.raises(RuntimeError, match="boom"), temporary_netns("tbtst") as name:
        assert name.startswith(f"tbtst{os.getpid()}-") and name in named_netns()
        subprocess.Popen(["ip", "netns", "exec", name, "sleep", "60"])
        raise RuntimeError("boom")
    assert name not in named_netns()


def test_temporary_netns_deletes_what_a_dead_process_of_its_prefix_left() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"tbstl{dead.pid}-0"  # as a block killed before its end leaves it
    live = f"tbstl{os.getpid()}-999"
    for name in (left, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with temporary_netns("tbstl") as name:
            assert left not in named_netns() and live in named_netns() and name in named_netns()
    finally:
        for name in (left, live):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    assert live not in named_netns() and left not in named_netns()


def test_stale_netns_names_reads_only_its_own_pattern() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [f"tbx{dead.pid}-0", f"tbx{os.getpid()}-1", f"tby{dead.pid}-0", "tbx", f"tbx{dead.pid}", f"tbx{dead.pid}-a"]
    assert stale_netns_names("tbx", names) == [f"tbx{dead.pid}-0"]


def test_probe_on_this_machine() -> None:
    kernel.detect_features.cache_clear()
    f = kernel.detect_features()
    print(f)
    assert f.netns and f.veth and f.htb and f.packet_vnet_hdr
    assert f is kernel.detect_features()
    backend = kernel.choose_delay_backend(f)
    assert backend == ("netem" if f.netem else "relay")
    if not f.netem:
        assert "module missing" in f.notes["netem"]
        with pytest.raises(kernel.BackendError, match="no usable sch_netem"):
            kernel.choose_delay_backend(f, "netem")
