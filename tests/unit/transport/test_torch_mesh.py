"""atlas_transport.torch.mesh: how a pair's failure reaches the operations waiting on it.

A receive whose transfer does not fit its tensor (the two programs disagree on a size
or dtype) is not a lost peer: the operation names the mismatch, even where another
wait on the same peer failed first, and the channel closes only after this side's own
sends were read, so the peer names the mismatch from its side too."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from atlas_transport.loopback import loopback_pair
from atlas_transport.torch import mesh as M
from atlas_transport.torch.work import AtlasError

TAG = 5


class RecordingChannel:
    """A real channel whose close() records the time it was given for its sends."""

    def __init__(self, ch) -> None:
        self._ch, self.close_timeouts = ch, []

    def close(self, timeout=None) -> None:
        self.close_timeouts.append(timeout)
        self._ch.close(timeout=timeout)

    def __getattr__(self, name: str):
        return getattr(self._ch, name)


def _mesh(ch) -> tuple[M.PeerMesh, M._Peer]:
    m = M.PeerMesh.__new__(M.PeerMesh)  # only what post/wait/peer_failed read
    m.rank, m.size, m.group, m.timeout_s, m.global_ranks = 0, 2, "g", 30.0, [0, 1]
    p = M._Peer(1)
    p.channel = ch
    m._peers = {1: p}
    return m, p


def _op(kind: str, t: torch.Tensor, tag: int, what: str, left_s: float = 30.0) -> M.PeerOp:
    return M.PeerOp(kind, 1, t, tag, time.monotonic() + left_s, what)


def test_a_mismatch_names_itself_even_after_an_abandoned_receive_failed_on_the_peer():
    with loopback_pair() as (a, b):
        m, _ = _mesh(b)
        abandoned = _op("recv", torch.empty(1, dtype=torch.uint8), TAG + 1, "monitored recv")
        mine = _op("recv", torch.empty(3), TAG, "all_reduce #1")
        m.post(abandoned)
        m.post(mine)
        a.send(torch.ones(4), TAG)  # the peer holds four elements
        a.close(timeout=5)          # ...and closes its side once this side read them
        with pytest.raises(AtlasError, match="lost rank 1"):
            m.wait(abandoned)       # the abandoned receive fails first, as the channel closed
        with pytest.raises(AtlasError) as exc:
            m.wait(mine)
    msg = str(exc.value)
    assert msg.startswith("atlas: all_reduce #1 from rank 1 (group 'g') failed: recv of transfer "), msg
    assert msg.endswith("failed: cannot receive into the given tensor: the transfer carries float32[4], the "
                        "destination is float32[3] (element count differs)"), msg
    assert "lost" not in msg


def test_a_mismatch_closes_the_channel_only_after_this_sides_sends_are_read():
    with loopback_pair() as (a, b):
        rec = RecordingChannel(b)
        m, p = _mesh(rec)
        mine = _op("recv", torch.empty(3), TAG, "all_reduce #1", left_s=20.0)
        m.post(_op("send", torch.ones(3), TAG, "all_reduce #1"))
        m.post(mine)
        a.send(torch.ones(4), TAG)
        with pytest.raises(AtlasError, match="element count differs"):
            m.wait(mine)
        assert "element count differs" in str(p.error)
        deadline = time.monotonic() + 5
        while not rec.close_timeouts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.close_timeouts and 15.0 < rec.close_timeouts[0] <= 20.0, rec.close_timeouts
        assert torch.equal(a.recv(TAG, timeout=10), torch.ones(3))  # this side's send still arrives


def test_a_lost_peer_closes_at_once():
    with loopback_pair() as (a, b):
        rec = RecordingChannel(b)
        m, _ = _mesh(rec)
        op = _op("recv", torch.empty(3), TAG, "all_reduce #1")
        m.post(op)
        threading.Thread(target=a.close, kwargs={"timeout": 1}, daemon=True).start()
        with pytest.raises(AtlasError, match="failed: lost rank 1: "):
            m.wait(op)
        deadline = time.monotonic() + 5
        while not rec.close_timeouts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.close_timeouts == [0.5]
