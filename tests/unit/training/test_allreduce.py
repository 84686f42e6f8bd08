"""The modelled workers' DP ring all-reduce (testbed/training/allreduce.py): its plan,
and the ring over real atlas_transport channels on loopback."""

from __future__ import annotations

import threading

import pytest
import torch

from atlas_transport import TransportConfig, connect, listen
from testbed.training.allreduce import AllReduceError, ring_allreduce, ring_plan


def test_ring_plan_moves_the_bandwidth_optimal_volume_in_buckets() -> None:
    plan = ring_plan(1, 4, 10_000, 1_000)
    assert (plan.next, plan.prev, plan.steps) == (2, 0, 6)
    assert plan.step_bytes == 2_500 and plan.messages == (1_000, 1_000, 500)
    assert plan.bytes_sent == 6 * 2_500  # 2(dp-1)/dp x G
    assert ring_plan(0, 2, 7, 100).messages == (4,)
    with pytest.raises(AllReduceError, match="needs dp >= 2"):
        ring_plan(0, 1, 10, 10)
    with pytest.raises(AllReduceError, match=r"DP rank 3 is outside 0..1"):
        ring_plan(3, 2, 10, 10)
    with pytest.raises(AllReduceError, match="must be positive"):
        ring_plan(0, 2, 0, 10)


def test_a_replica_without_a_channel_to_its_neighbour_is_refused() -> None:
    with pytest.raises(AllReduceError, match=r"DP rank 0 has no channel to its ring neighbour 1 \(has \[2\]\)"):
        ring_allreduce(ring_plan(0, 3, 30, 10), {2: object()}, None, None, 1.0)


def test_two_replicas_ring_over_loopback_channels(monkeypatch) -> None:
    monkeypatch.setenv("ATLAS_SECRET", "ring-test")
    cfg = TransportConfig(streams=2)
    grad, bucket = 3 << 20, 1 << 20
    out: dict[int, float] = {}
    with listen("127.0.0.1", 0, cfg) as lst:
        port = lst.port

        def replica(rank: int, ch) -> None:
            plan = ring_plan(rank, 2, grad, bucket)
            buf = torch.zeros(bucket, dtype=torch.uint8)
            out[rank] = ring_allreduce(plan, {1 - rank: ch}, buf, torch.empty(bucket, dtype=torch.uint8), 20.0)

        a = connect("127.0.0.1", port, cfg)
        b = lst.accept(timeout=10)
        t = threading.Thread(target=replica, args=(1, b))
        t.start()
        replica(0, a)
        t.join(30)
        received = a.bytes_received
        a.close(timeout=5)
        b.close(timeout=5)
    assert set(out) == {0, 1} and all(s > 0 for s in out.values())
    assert received == ring_plan(0, 2, grad, bucket).bytes_sent  # 2 steps of G/2: the gradient's size, each way
