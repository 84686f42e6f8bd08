"""Delay-backend choice and feature detection plumbing (no root needed)."""

from __future__ import annotations

import errno
from dataclasses import replace

import pytest

from testbed.emulation import kernel
from testbed.emulation.kernel import BackendError, KernelFeatures, choose_delay_backend
from testbed.emulation.netns import NetnsError

FULL = KernelFeatures(
    netns=True, veth=True, htb=True, tbf=True, netem=True,
    packet_vnet_hdr=True, packet_ignore_outgoing=True, kernel="6.1.0-test",
)
NO_NETEM = replace(
    FULL, netem=False,
    notes={"netem": "adding a netem qdisc failed: the kernel does not know this qdisc kind (module missing)"},
)


def test_auto_prefers_netem_and_falls_back_to_relay() -> None:
    assert choose_delay_backend(FULL) == "netem"
    assert choose_delay_backend(FULL, "auto") == "netem"
    assert choose_delay_backend(NO_NETEM) == "relay"
    assert choose_delay_backend(NO_NETEM, None) == "relay"


def test_forcing_a_backend() -> None:
    assert choose_delay_backend(FULL, "relay") == "relay"
    assert choose_delay_backend(FULL, " NETEM ") == "netem"


def test_forcing_netem_where_missing_says_what_to_do() -> None:
    with pytest.raises(BackendError) as info:
        choose_delay_backend(NO_NETEM, "netem")
    msg = str(info.value)
    assert "'netem' was requested but this kernel (6.1.0-test) has no usable sch_netem" in msg
    assert "module missing" in msg  # the probe's own finding
    assert "modprobe sch_netem" in msg and "delay_backend: relay" in msg


def test_relay_needs_vnet_hdr_and_htb() -> None:
    bare = replace(NO_NETEM, packet_vnet_hdr=False, notes={"packet_vnet_hdr": "cannot open an AF_PACKET socket"})
    with pytest.raises(BackendError) as info:
        choose_delay_backend(bare, "relay")
    msg = str(info.value)
    assert "'relay' was requested, but the userspace delay line needs AF_PACKET sockets with PACKET_VNET_HDR" in msg
    assert "packet_vnet_hdr: cannot open an AF_PACKET socket" in msg
    with pytest.raises(BackendError, match="no delay backend can run here: the kernel has no sch_netem"):
        choose_delay_backend(bare)


def test_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(BackendError, match=r"unknown delay backend 'tc' \(allowed: auto, netem, relay\)"):
        choose_delay_backend(FULL, "tc")


def test_detection_is_cached_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_probe() -> KernelFeatures:
        calls.append(1)
        return FULL

    kernel.detect_features.cache_clear()
    monkeypatch.setattr(kernel, "probe_features", fake_probe)
    try:
        assert kernel.detect_features() is kernel.detect_features()
        assert len(calls) == 1
    finally:
        kernel.detect_features.cache_clear()


def test_probe_without_namespaces_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_netns():
        raise NetnsError(errno.EPERM, "cannot create a network namespace: Operation not permitted (needs root / CAP_SYS_ADMIN)")

    monkeypatch.setattr(kernel, "private_netns", no_netns)
    features = kernel.probe_features()
    assert not features.netns and not features.netem and not features.htb
    assert "needs root" in features.notes["netns"]
    assert "not probed" in features.notes["netem"]
    assert features.as_dict()["kernel"] == features.kernel
