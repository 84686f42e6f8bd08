"""HTB/bfifo (and netem where the kernel has it) applied for real on a veth in a
private namespace, read back through netlink."""

from __future__ import annotations

import pytest

from testbed.emulation import shaping as sh
from testbed.emulation.kernel import detect_features
from testbed.emulation.netns import private_netns

pytestmark = pytest.mark.root


@pytest.fixture
def veth():
    with private_netns() as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="sh0", kind="veth", peer="sh1")
        yield ipr


@pytest.mark.parametrize("rate", [100e6, 1e9, 10e9, 40e9])
def test_htb_bfifo_reads_back(veth, rate: float) -> None:
    queue = sh.queue_bytes_for(rate, 0.05)
    sh.apply(veth, "sh0", sh.egress_shaper("sh0", rate, queue))
    state = sh.read_shaper(veth, "sh0")
    print(f"rate {rate:g}: {state}")
    assert state.rate_bps == pytest.approx(rate, rel=1e-6)
    assert state.ceil_bps == pytest.approx(rate, rel=1e-6)
    assert state.leaf_kind == "bfifo" and state.queue_bytes == queue


def test_change_rate_keeps_the_qdiscs(veth) -> None:
    sh.apply(veth, "sh0", sh.egress_shaper("sh0", 1e9, 6_250_000))
    index = veth.link_lookup(ifname="sh0")[0]
    before = {(q["handle"], q.get_attr("TCA_KIND")) for q in veth.get_qdiscs(index=index)}
    sh.apply(veth, "sh0", sh.change_rate(12e9))
    state = sh.read_shaper(veth, "sh0")
    assert state.rate_bps == pytest.approx(12e9) and state.queue_bytes == 6_250_000
    sh.apply(veth, "sh0", sh.change_rate(500e6, queue_bytes=3_125_000))
    state = sh.read_shaper(veth, "sh0")
    assert state.rate_bps == pytest.approx(500e6) and state.queue_bytes == 3_125_000
    after = {(q["handle"], q.get_attr("TCA_KIND")) for q in veth.get_qdiscs(index=index)}
    assert before == after  # changed in place, nothing rebuilt


def test_double_apply_is_refused_then_remove_works(veth) -> None:
    sh.apply(veth, "sh0", sh.egress_shaper("sh0", 1e9, 10**6))
    with pytest.raises(sh.ShapingError, match="sh0 already has a qdisc there: call remove_shaper"):
        sh.apply(veth, "sh0", sh.egress_shaper("sh0", 1e9, 10**6))
    assert sh.remove_shaper(veth, "sh0") is True
    assert sh.remove_shaper(veth, "sh0") is False
    assert sh.read_shaper(veth, "sh0").rate_bps is None
    with pytest.raises(sh.ShapingError, match="apply egress_shaper first"):
        sh.apply(veth, "sh0", sh.change_rate(1e9))


def test_netem_path_matches_the_kernel(veth) -> None:
    netem = sh.NetemParams(delay_s=0.025, jitter_s=0.001, loss=0.001)
    reqs = sh.egress_shaper("sh0", 1e9, 6_250_000, netem)
    if not detect_features().netem:
        with pytest.raises(sh.ShapingError, match="no sch_netem: use the relay delay backend"):
            sh.apply(veth, "sh0", reqs)
        assert sh.read_shaper(veth, "sh0").rate_bps is None  # rolled back, nothing half-built
        return
    sh.apply(veth, "sh0", reqs)
    state = sh.read_shaper(veth, "sh0")
    assert state.leaf_kind == "netem" and state.netem is not None
    assert state.netem.delay_s == pytest.approx(0.025, abs=1e-6)
    assert state.netem.jitter_s == pytest.approx(0.001, abs=1e-6)
    assert state.netem.loss == pytest.approx(0.001, rel=1e-3)
    assert state.netem.limit == reqs[-1].params["limit"] > 1000
    sh.apply(veth, "sh0", sh.change_netem(sh.NetemParams(0.05), 1e9, 6_250_000))
    assert sh.read_shaper(veth, "sh0").netem.delay_s == pytest.approx(0.05, abs=1e-6)
