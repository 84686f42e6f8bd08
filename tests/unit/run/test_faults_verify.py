"""End-to-end tensor checks (runner.verify_tensors): modelled sends carry a pattern of
their own (iteration, pipeline, boundary, micro-batch, direction) that the receiver
compares byte for byte; a damaged or mixed-up tensor fails with a message naming it."""

from __future__ import annotations

import time

import pytest
import torch

from atlas_transport.loopback import loopback_pair
from testbed.training.transport_comm import ChannelPath, CommError, TransportComm
from testbed_core.simulate import TransferKey


def _pair(client, server, down_pipeline: int = 0):
    filler = torch.zeros(64 * 1024, dtype=torch.uint8)
    up = TransportComm(0, "p0r0", {0: client}, {0: ChannelPath("p0r1", ("dc1->dc2",))}, filler=filler,
                       timeout_s=10.0, verify=True)
    down = TransportComm(down_pipeline, "p0r1", {0: server}, {0: ChannelPath("p0r0", ("dc2->dc1",))}, filler=filler,
                         timeout_s=10.0, verify=True)
    return up, down


def test_patterns_differ_per_transfer_and_are_verified_on_arrival() -> None:
    with loopback_pair(streams=2) as (client, server):
        up, down = _pair(client, server)
        a, b = TransferKey(0, 0, 0, "fwd"), TransferKey(0, 0, 1, "fwd")
        assert not torch.equal(up.pattern(a, 0), up.pattern(b, 0))
        assert not torch.equal(up.pattern(a, 0), up.pattern(a, 1))
        for c in (up, down):
            c.begin_iteration(2, time.time())
        up.send(a, None)
        up.send(b, None)
        down.recv(a)
        down.recv(b)
        up.flush()
        _, received = down.take_records()
        up.close()
        down.close()
    assert down.verified == 2 and [r["verified"] for r in received] == [True, True]


def test_a_mixed_up_tensor_fails_with_a_message_naming_it() -> None:
    with loopback_pair(streams=2) as (client, server):
        up, down = _pair(client, server, down_pipeline=1)  # the receiver expects another pipeline's pattern
        for c in (up, down):
            c.begin_iteration(2, time.time())
        key = TransferKey(0, 0, 3, "bwd")
        up.send(key, None)
        with pytest.raises(CommError, match="p0r1: .* of iteration 2 from p0r0 failed verification "
                                            "\\(\\d+ of 65536 bytes differ\\)"):
            down.recv(key)
        up.close()
        down.close()


def test_without_verify_records_have_no_verified_key() -> None:
    with loopback_pair(streams=1) as (client, server):
        filler = torch.zeros(1024, dtype=torch.uint8)
        up = TransportComm(0, "a", {0: client}, {0: ChannelPath("b", ())}, filler=filler)
        down = TransportComm(0, "b", {0: server}, {0: ChannelPath("a", ())}, filler=filler)
        up.send(TransferKey(0, 0, 0, "fwd"), None)
        down.recv(TransferKey(0, 0, 0, "fwd"))
        up.flush()
        _, received = down.take_records()
        up.close()
        down.close()
    assert "verified" not in received[0] and down.verified == 0
