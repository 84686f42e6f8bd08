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
    open_iproute,
    private_netns,
    run_in_netns,
    temporary_netns,
)

pytestmark = [pytest.mark.root, pytest.mark.alone]  # named namespaces come and go: run alone


def netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


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
    before = netns_list()
    with open_iproute(unnamed_host) as ipr:
        names = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        ipr.link("add", ifname="nsx0", kind="veth", peer="nsx1")
        assert {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()} >= {"nsx0", "nsx1"}
    assert names == {"lo"}  # the host's namespace, not ours
    assert "nsx0" not in {name for _, name in socket.if_nameindex()}
    assert netns_list() == before


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
        assert name.startswith(f"tbtst{os.getpid()}-") and name in netns_list()
        subprocess.Popen(["ip", "netns", "exec", name, "sleep", "60"])
        raise RuntimeError("boom")
    assert name not in netns_list()


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
