"""The hierarchical, pipelined collective algorithms (atlas_transport.torch.hierarchical)
and site discovery (topology), with ranks as threads over an in-memory `Net` that
delivers a send only when its receiver waits (as late as a real network may), so an
algorithm that changed a buffer it had sent, or waited in an order its peers cannot
satisfy, fails here."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
import torch

from atlas_transport.torch import hierarchical as H
from atlas_transport.torch.topology import Topology, discover, lan_key, site_key

TIMEOUT_S = 10.0


class World:
    """Mailboxes of every ordered pair: the k-th send from a to b matches the k-th
    receive b posted from a (one tag, as the backend's collectives use)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.msgs: dict[tuple[int, int], dict[int, list]] = defaultdict(dict)
        self.sent = defaultdict(int)
        self.posted = defaultdict(int)
        self.wan_bytes = 0
        self.topo: Topology | None = None


class FakeNet:
    def __init__(self, world: World, rank: int) -> None:
        self.w, self.rank = world, rank
        self.ops: list = []

    def send(self, peer: int, t: torch.Tensor, detach: bool = False):
        with self.w.cv:
            key = (self.rank, peer)
            seq = self.w.sent[key]
            self.w.sent[key] += 1
            box = [t, threading.Event(), self.rank]
            self.w.msgs[key][seq] = box
            topo = self.w.topo
            if topo is not None and topo.site_of(peer) != topo.site_of(self.rank):
                self.w.wan_bytes += t.numel() * t.element_size()
            self.w.cv.notify_all()
        op = ("send", box)
        if not detach:
            self.ops.append(op)
        return op

    def recv(self, peer: int, t: torch.Tensor):
        with self.w.cv:
            key = (peer, self.rank)
            seq = self.w.posted[key]
            self.w.posted[key] += 1
        op = ("recv", key, seq, t, [False])
        self.ops.append(op)
        return op

    def wait(self, op) -> None:
        if op[0] == "send":
            if not op[1][1].wait(TIMEOUT_S):
                raise TimeoutError(f"rank {self.rank}: a send to was never received")
            return
        _, key, seq, t, done = op
        if done[0]:
            return
        with self.w.cv:
            if not self.w.cv.wait_for(lambda: seq in self.w.msgs[key], TIMEOUT_S):
                raise TimeoutError(f"rank {self.rank}: receive #{seq} from rank {key[0]} never matched")
            src, ev, _ = self.w.msgs[key].pop(seq)
        assert src.dtype == t.dtype and src.numel() == t.numel(), (src.shape, t.shape)
        t.copy_(src.reshape(t.shape))
        ev.set()
        done[0] = True

    def finish(self) -> None:
        for op in self.ops:
            self.wait(op)
        self.ops.clear()


def run(size: int, fn, topo: Topology | None = None) -> World:
    world = World()
    world.topo = topo
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            fn(r, FakeNet(world, r))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 3)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank hung"
    leftover = {k: v for k, v in world.msgs.items() if v}
    assert not leftover, f"messages never received: {leftover}"
    return world


TOPOS = [
    Topology(((0, 1), (2, 3))),          # 2 DCs x 2 hosts (topologies/2dc.yaml)
    Topology(((0, 2), (1, 3))),          # interleaved ranks
    Topology(((0, 1, 2),)),              # one LAN
    Topology(((0,), (1,), (2,))),        # every rank its own site
    Topology(((0, 1, 2), (3, 4, 5))),    # 3 per site: local rank 2 needs the spare buffer
    Topology(((0, 1), (2,))),            # uneven: the one-site form over all ranks
    Topology(((0, 2), (1, 3), (4, 5))),  # three sites
]


def _inputs(size: int, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(numel)
    if dtype.is_floating_point:
        return [torch.randn(numel, generator=g, dtype=dtype) for _ in range(size)]
    return [torch.randint(1, 7, (numel,), generator=g, dtype=dtype) for _ in range(size)]


@pytest.mark.parametrize("topo", TOPOS, ids=lambda t: t.describe())
@pytest.mark.parametrize("numel", [5, 20_003])
def test_all_reduce_is_exact_and_bit_identical(topo: Topology, numel: int):
    size = topo.size
    xs = _inputs(size, numel, torch.float32)
    want = torch.stack(xs).sum(0)
    outs = [x.clone() for x in xs]
    run(size, lambda r, net: H.all_reduce(outs[r], "SUM", r, topo, net, piece_bytes=16384, small_bytes=1024), topo)
    for o in outs:
        assert torch.equal(o, outs[0])  # the same bits on every rank
    torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["MAX", "PRODUCT", "BXOR", "AVG"])
def test_all_reduce_ops(name: str):
    topo = Topology(((0, 1, 2), (3, 4, 5)))
    dtype = torch.int64 if name in ("BXOR", "PRODUCT") else torch.float64
    xs = _inputs(6, 1001, dtype)
    outs = [x.clone() for x in xs]
    run(6, lambda r, net: H.all_reduce(outs[r], name, r, topo, net, piece_bytes=2048, small_bytes=0), topo)
    stack = torch.stack(xs)
    want = {"MAX": lambda: stack.amax(0), "MIN": lambda: stack.amin(0), "PRODUCT": lambda: stack.prod(0),
            "BXOR": lambda: xs[0] ^ xs[1] ^ xs[2] ^ xs[3] ^ xs[4] ^ xs[5], "AVG": lambda: stack.sum(0) / 6}[name]()
    for o in outs:
        assert torch.equal(o, outs[0])
    torch.testing.assert_close(outs[0], want)


def test_a_shard_crosses_the_wan_once_per_remote_site():
    """2 DCs x 2 ranks, 4 MiB: each rank's half (its site's partial of it) crosses
    once: 4 x 2 MiB on the WAN, the least possible (each DC must receive the other's
    4 MiB partial); a flat ring carries 6 MiB across each of its two WAN hops."""
    topo = Topology(((0, 1), (2, 3)))
    xs = _inputs(4, 1 << 20, torch.float32)
    world = run(4, lambda r, net: H.all_reduce(xs[r], "SUM", r, topo, net), topo)
    assert world.wan_bytes == 8 << 20


@pytest.mark.parametrize("topo", TOPOS, ids=lambda t: t.describe())
def test_reduce_scatter_and_all_gather(topo: Topology):
    size, numel = topo.size, 777
    ins = [_inputs(size, numel, torch.float64) for _ in range(size)]  # ins[rank][block]
    outs = [torch.empty(numel, dtype=torch.float64) for _ in range(size)]
    run(size, lambda r, net: H.reduce_scatter(outs[r], ins[r], "SUM", r, topo, net), topo)
    for r in range(size):
        torch.testing.assert_close(outs[r], sum(ins[p][r] for p in range(size)))
    gathered = [[torch.full((numel,), -1.0, dtype=torch.float64) for _ in range(size)] for _ in range(size)]
    world = run(size, lambda r, net: H.all_gather(gathered[r], outs[r], r, topo, net), topo)
    for r in range(size):
        for p in range(size):
            assert torch.equal(gathered[r][p], outs[p])
    if topo.uniform and len(topo.sites) > 1:  # each block crosses once per remote site
        n_sites = len(topo.sites)
        assert world.wan_bytes == size * (n_sites - 1) * numel * 8


@pytest.mark.parametrize("topo", TOPOS, ids=lambda t: t.describe())
@pytest.mark.parametrize("root", [2])
def test_broadcast(topo: Topology, root: int):
    size = topo.size
    src = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    xs = [src.clone() if r == root else torch.zeros(10_000) for r in range(size)]
    world = run(size, lambda r, net: H.broadcast(xs[r], root, r, topo, net, piece_bytes=4096), topo)
    for x in xs:
        assert torch.equal(x, src)
    assert world.wan_bytes == (len(topo.sites) - 1) * src.numel() * 4


def test_reduce_into_keeps_the_order_whatever_the_output():
    a, b, c = torch.tensor([1.0]), torch.tensor([1e8]), torch.tensor([-1e8])
    for out_index in range(3):
        parts = [a.clone(), b.clone(), c.clone()]
        out = parts[out_index]
        H.reduce_into(out, parts, "SUM", None)
        assert out.item() == 0.0  # float32: ((a + b) + c) = 0, where a + (b + c) = 1


class Store:
    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}
        self.cv = threading.Condition()

    def set(self, k: str, v: str) -> None:
        with self.cv:
            self.d[k] = v.encode()
            self.cv.notify_all()

    def get(self, k: str) -> bytes:
        with self.cv:
            assert self.cv.wait_for(lambda: k in self.d, 5), f"store key {k} never set"
            return self.d[k]


def _discover_all(size: int, envs: list[dict[str, str]], rtts) -> tuple[list[Topology], Store]:
    store, out = Store(), [None] * size

    def body(r: int) -> None:
        out[r] = discover(store, r, size, lambda p: rtts[r][p], 0.002, envs[r])
    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out, store


def test_sites_from_labels_and_from_round_trips():
    labels = ["dc2", "dc1", "dc2", "dc1"]
    topos, store = _discover_all(4, [{"ATLAS_SITE": lab} for lab in labels], None)
    assert all(t.sites == ((0, 2), (1, 3)) for t in topos)
    assert lan_key(0) not in store.d  # labels everywhere: nothing measured
    near = 0.0002
    far = 0.05
    rtts = [[near if (a < 2) == (b < 2) else far for b in range(4)] for a in range(4)]
    rtts[3][2] = far  # one side's measurement suffices (rank 2 saw 3 near)
    topos, store = _discover_all(4, [{"ATLAS_SITE": "a"}, {}, {}, {}], rtts)  # a label missing: measure
    assert all(t.sites == ((0, 1), (2, 3)) for t in topos)
    assert store.d[site_key(1)] == b"\x00"
    assert Topology.from_lan_rows([[], [], []]).sites == ((0,), (1,), (2,))
    assert Topology(((0, 1), (2,))).uniform is False


class FakeMesh:
    """What MeshNet and reap use of a PeerMesh: post, wait (raising a failed op's error)."""

    def __init__(self) -> None:
        self.posted: list = []

    def post(self, op) -> None:
        self.posted.append(op)

    def wait(self, op, out_only: bool = False) -> None:
        if op.error is not None:
            raise op.error


class Op:
    def __init__(self, done: bool, error: BaseException | None = None) -> None:
        self._done, self.error = done, error

    def done(self) -> bool:
        return self._done


def test_meshnet_detaches_small_sends_from_a_copy_and_reap_reports_failures():
    from atlas_transport.torch.posting import SMALL_SEND_BYTES, MeshNet, reap

    mesh, detached = FakeMesh(), []
    net = MeshNet(mesh, "all_reduce", 0.0, detached)
    small = torch.ones(4)
    net.send(1, small)
    assert detached and not net.ops and detached[0].tensor is not small  # a copy, not waited for
    small.zero_()
    assert detached[0].tensor.sum().item() == 4  # what was sent is what the caller had
    big = torch.ones(SMALL_SEND_BYTES // 4 + 1)
    net.send(1, big)
    assert net.ops[0].tensor is big  # waited for at finish, sent from the caller's memory
    pending = [Op(True), Op(False), Op(True, RuntimeError("peer lost")), Op(False)]
    detached[:] = pending
    with pytest.raises(RuntimeError, match="peer lost"):
        reap(mesh, detached)
    assert detached == [pending[1], pending[3]]  # the failed and the completed ones are forgotten
    reap(mesh, detached)
    assert detached == [pending[1], pending[3]]


def test_all_gather_many_is_one_round():
    """Three tensors gathered in one call: every rank's WAN sends are posted before it
    waits for anything, so the sends of all three precede the first receive's wait."""
    topo = Topology(((0, 1), (2, 3)))
    xs = [[torch.full((5 + i,), float(10 * r + i)) for i in range(3)] for r in range(4)]
    outs = [[[torch.empty(5 + i) for _ in range(4)] for i in range(3)] for _ in range(4)]
    events: list[list[str]] = [[] for _ in range(4)]

    class Logged(FakeNet):
        def send(self, peer, t, detach=False):
            events[self.rank].append("wan-send" if topo.site_of(peer) != topo.site_of(self.rank) else "lan-send")
            return super().send(peer, t, detach)

        def wait(self, op):
            events[self.rank].append("wait")
            return super().wait(op)

    def body(r, net):
        net.__class__ = Logged
        H.all_gather_many([(outs[r][i], xs[r][i]) for i in range(3)], r, topo, net)

    run(4, body, topo)
    for ev in events:
        assert ev[:3] == ["wan-send"] * 3 and ev.count("wan-send") == 3
    for r in range(4):
        for i in range(3):
            for p in range(4):
                assert torch.equal(outs[r][i][p], xs[p][i])


def test_all_to_all_detaches_its_sends_to_other_sites_from_a_copy():
    """all_to_all over a net that knows the sites: the parts for another site leave
    from a copy and are not waited for (no round trip for the peer's DONE), so the
    caller may reuse its inputs at once; parts inside the site are waited for."""
    from atlas_transport.torch import collectives as C

    topo = Topology(((0, 1), (2, 3)))
    detached: list[tuple[int, int]] = []

    class SiteNet(FakeNet):
        topology = topo

        def send(self, peer, t, detach=False):
            if detach:
                detached.append((self.rank, peer))
            return super().send(peer, t, detach)

    ins = [[torch.full((3 + p,), float(10 * r + p)) for p in range(4)] for r in range(4)]
    outs = [[torch.empty(3 + r) for _ in range(4)] for r in range(4)]

    def body(r, net):
        C.all_to_all(outs[r], ins[r], r, 4, SiteNet(net.w, r))
        for t in ins[r]:
            t.fill_(-1.0)  # the caller reuses its inputs: what the peers get must not change

    run(4, body, topo)
    for r in range(4):
        for p in range(4):
            assert torch.equal(outs[r][p], torch.full((3 + r,), float(10 * p + r))), (r, p)
    assert sorted(detached) == sorted((r, p) for r in range(4) for p in range(4) if topo.site_of(r) != topo.site_of(p))
