"""The torch-gloo variant's network (testbed/training/gloo_comm.py): the interface of
an address, and two processes joined in a gloo group on loopback moving a pipeline
tensor through GlooChannel and all-reducing gradients in buckets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zygote  # tests/zygote.py: ranks forked from a process that imported torch once

from testbed.run.ports import free_port_block
from testbed.training.gloo_comm import GLOO_TAG_MASK, GlooError, interface_of

ROOT = Path(__file__).resolve().parents[3]

PEER = """
import json, sys, torch
from testbed.training.gloo_comm import GlooChannel, close_gloo, gloo_allreduce, init_gloo
rank, port = int(sys.argv[1]), int(sys.argv[2])
(group,) = init_gloo(store_ip="127.0.0.1", port=port, rank=rank, world_size=2, own_ip="127.0.0.1",
                     timeout_s=30, groups=[[0, 1]])
ch = GlooChannel(1 - rank, 1000)
tag = (7 << 40) | 5  # an atlas_transport tag: only its low 31 bits go to gloo
if rank == 0:
    ch.isend(torch.arange(1000, dtype=torch.uint8), tag).wait(30)
    got = None
else:
    h = ch.irecv(tag)
    got = int(h.wait(30).sum())
    assert h.completed_at is not None
buf = torch.ones(1 << 18, dtype=torch.float32)
took = gloo_allreduce(group, 3 << 20, 1 << 20, buf)  # three buckets of 1 MiB
print(json.dumps({"rank": rank, "sum": got, "reduced": float(buf[0]), "took": took}))
close_gloo()
"""


def test_the_interface_of_an_address() -> None:
    assert interface_of("127.0.0.1") == "lo"
    with pytest.raises(GlooError, match=r"no interface has address 192.0.2.77 here \(interfaces: .*lo"):
        interface_of("192.0.2.77")
    assert GLOO_TAG_MASK == (1 << 31) - 1


def test_two_ranks_exchange_a_tensor_and_all_reduce_over_gloo(tmp_path: Path) -> None:
    port = free_port_block(1)
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [zygote.popen([str(script), str(r), str(port)], env, cwd=str(ROOT)) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[1]["sum"] == sum(i % 256 for i in range(1000))
    # the buckets reuse one placeholder buffer: three all-reduces over two ranks double it three times
    assert outs[0]["reduced"] == outs[1]["reduced"] == 8.0
    assert all(o["took"] > 0 for o in outs)
