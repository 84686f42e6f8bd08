"""Shaping requests (HTB/bfifo, netem) built and sent without a kernel."""

from __future__ import annotations

import errno

import pytest
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import sched_htb, sched_netem

from testbed.emulation import shaping as sh


class FakeIPRoute:
    """Records tc calls; fails the ones whose kind is in ``fail``."""

    def __init__(self, fail: dict[str, int] | None = None, links: tuple[str, ...] = ("w-eth0",)):
        self.calls: list[tuple] = []
        self.fail = fail or {}
        self.links = links

    def link_lookup(self, ifname: str) -> list[int]:
        return [7] if ifname in self.links else []

    def tc(self, command: str, kind: str | None = None, index: int = 0, handle: int = 0, **kw: object) -> None:
        self.calls.append((command, kind, index, handle, kw))
        if kind in self.fail:
            raise NetlinkError(self.fail[kind], os_strerror(self.fail[kind]))


def os_strerror(code: int) -> str:
    import os

    return os.strerror(code)


def test_bdp_queue_and_floor() -> None:
    assert sh.queue_bytes_for(1e9, 0.050) == 6_250_000
    assert sh.queue_bytes_for(10e9, 0.100) == 125_000_000
    assert sh.queue_bytes_for(1e6, 0.001) == sh.QUEUE_FLOOR_BYTES  # 125 bytes BDP: floor
    assert sh.QUEUE_FLOOR_BYTES >= 2 * sh.GSO_MAX
    with pytest.raises(sh.ShapingError, match="rtt must be >= 0 seconds"):
        sh.queue_bytes_for(1e9, -1)
    with pytest.raises(sh.ShapingError, match="rate must be a number of bits per second"):
        sh.queue_bytes_for(0, 0.05)


def test_egress_shaper_htb_bfifo() -> None:
    reqs = sh.egress_shaper("w-eth0", 1e9, 6_250_000)
    assert [(r.command, r.kind, r.handle, r.parent) for r in reqs] == [
        ("add", "htb", 0x10000, sh.TC_H_ROOT),
        ("add-class", "htb", 0x10001, 0x10000),
        ("add", "bfifo", 0x100000, 0x10001),
    ]
    assert reqs[0].params["default"] == 1  # unclassified traffic goes to 1:1
    cls = reqs[1].params
    assert cls["rate"] == cls["ceil"] == 125_000_000  # pyroute2 takes bytes/s
    assert cls["burst"] >= sh.GSO_MAX + sh.ETH_FRAME
    assert reqs[2].params == {"limit": 6_250_000}
    assert reqs[1].describe().startswith("add-class htb 1:1 parent 1: rate=125000000")


@pytest.mark.parametrize("rate", [10e9, 40e9, 100e9])
def test_rates_above_one_gigabit(rate: float) -> None:
    cls = sh.egress_shaper("w-eth0", rate, sh.queue_bytes_for(rate, 0.05))[1].params
    assert cls["rate"] == int(rate / 8)
    assert cls["burst"] >= rate / 8 * 0.001  # 1 ms of line rate: timer granularity never starves it
    assert 0 < cls["quantum"] <= 200_000
    # what pyroute2 will encode: 64-bit rate attributes where 32 bits do not suffice
    encoded = sched_htb.get_class_parameters(dict(cls))
    attrs = dict(encoded["attrs"])
    if rate / 8 >= 2**32:
        assert attrs["TCA_HTB_RATE64"] == int(rate / 8) and attrs["TCA_HTB_CEIL64"] == int(rate / 8)
    assert attrs["TCA_HTB_PARMS"]["buffer"] < 2**32


def test_netem_leaf_requests_and_encoding() -> None:
    netem = sh.NetemParams(delay_s=0.025, jitter_s=0.001, loss=0.01)
    reqs = sh.egress_shaper("w-eth0", 1e9, 6_250_000, netem)
    leaf = reqs[-1]
    assert (leaf.command, leaf.kind, leaf.handle, leaf.parent) == ("add", "netem", 0x100000, 0x10001)
    p = leaf.params
    assert p["delay"] == 25_000 and p["jitter"] == 1_000  # microseconds for pyroute2
    assert p["loss"] == pytest.approx(1.0)  # percent for pyroute2
    # the default limit (1000 packets) would drop on this path: it covers BDP + queue
    bdp_packets = 125_000_000 * 0.027 / 1514
    assert p["limit"] > bdp_packets + 6_250_000 / 1514
    opts = sched_netem.get_parameters(dict(p))
    assert opts["delay"] == pytest.approx(25_000 * 15.625)  # 64 ns ticks
    assert opts["loss"] == pytest.approx(0.01 * 2**32, rel=1e-6)
    assert opts["limit"] == p["limit"]


def test_netem_limit_respects_explicit_value_and_floor() -> None:
    assert sh.netem_limit_packets(1e9, sh.NetemParams(0.01, limit=50), 10**6) == 50
    assert sh.netem_limit_packets(1e6, sh.NetemParams(0.001), 10_000) == sh.NETEM_MIN_LIMIT


def test_change_requests_modify_in_place() -> None:
    reqs = sh.change_rate(10e9)
    assert [(r.command, r.kind, r.handle) for r in reqs] == [("change-class", "htb", 0x10001)]
    assert reqs[0].params["rate"] == 1_250_000_000
    both = sh.change_rate(2e9, queue_bytes=1_000_000)
    assert both[1].command == "change" and both[1].params == {"limit": 1_000_000}
    netem = sh.change_netem(sh.NetemParams(0.05, 0.002, 0.001), 1e9, 10**7)
    assert [(r.command, r.kind, r.handle, r.parent) for r in netem] == [("change", "netem", 0x100000, 0x10001)]
    assert netem[0].params["delay"] == 50_000


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sh.egress_shaper("w-eth0", -5, 10**6), "egress shaper on w-eth0: rate must be"),
        (lambda: sh.egress_shaper("w-eth0", 1e9, 100), "queue must hold at least one full frame"),
        (lambda: sh.egress_shaper("w-eth0", 1e9, 2**31), "too large"),
        (lambda: sh.NetemParams(delay_s=-0.01), "netem delay_s must be a finite number >= 0"),
        (lambda: sh.NetemParams(delay_s=0.01, loss=5), "probability between 0 and 1, got 5 (1% is 0.01)"),
        (lambda: sh.NetemParams(delay_s=300), "exceeds netem's limit"),
        (lambda: sh.NetemParams(delay_s=0.01, limit=0), "positive packet count"),
    ],
)
def test_invalid_shaping_is_explained(call, message: str) -> None:
    with pytest.raises(sh.ShapingError) as info:
        call()
    assert message in str(info.value)


def test_apply_sends_requests_in_order() -> None:
    ipr = FakeIPRoute()
    reqs = sh.egress_shaper("w-eth0", 1e9, 10**6, sh.NetemParams(0.01))
    sh.apply(ipr, "w-eth0", reqs)
    assert [(c[0], c[1], c[2], c[3], c[4]["parent"]) for c in ipr.calls] == [
        (r.command, r.kind, 7, r.handle, r.parent) for r in reqs
    ]
    assert ipr.calls[2][4]["delay"] == 10_000


def test_apply_without_netem_explains_and_rolls_back() -> None:
    ipr = FakeIPRoute(fail={"netem": errno.ENOENT})
    with pytest.raises(sh.ShapingError) as info:
        sh.apply(ipr, "w-eth0", sh.egress_shaper("w-eth0", 1e9, 10**6, sh.NetemParams(0.01)))
    msg = str(info.value)
    assert "add netem 10: parent 1:1" in msg and "on w-eth0" in msg
    assert "no sch_netem: use the relay delay backend" in msg
    assert ipr.calls[-1][0] == "del" and ipr.calls[-1][4]["parent"] == sh.TC_H_ROOT  # root removed again


def test_apply_errors_name_the_interface() -> None:
    with pytest.raises(sh.ShapingError, match="no interface named 'nope' in this network namespace"):
        sh.apply(FakeIPRoute(), "nope", sh.change_rate(1e9))
    with pytest.raises(sh.ShapingError, match="w-eth0 already has a qdisc there: call remove_shaper"):
        sh.apply(FakeIPRoute(fail={"htb": errno.EEXIST}), "w-eth0", sh.egress_shaper("w-eth0", 1e9, 10**6))
    with pytest.raises(sh.ShapingError, match="does not exist \\(apply egress_shaper first\\)"):
        sh.apply(FakeIPRoute(fail={"htb": errno.ENOENT}), "w-eth0", sh.change_rate(1e9))


def test_remove_shaper_reports_absence() -> None:
    assert sh.remove_shaper(FakeIPRoute(), "w-eth0") is True
    assert sh.remove_shaper(FakeIPRoute(fail={None: errno.ENOENT}), "w-eth0") is False  # type: ignore[dict-item]
