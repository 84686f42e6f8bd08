"""Link verification: `testbed topo check` on the 2dc quickstart and on a lossy,
jittery topology. The rates the links reach depend on the machine's load: the default
suite checks the verdicts and prints the rates (the quick checks skip TCP with
--no-tcp); the floors on them run under `make floors` (marked `floor`). The ratio of
eight streams to one across the WAN is in tests/floors/test_wan_striping.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emulation.kernel import detect_features

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.alone]  # RTT and loss measured: run alone
REPO = Path(__file__).resolve().parents[2]
TOPO = REPO / "topologies" / "2dc.yaml"


def run_check(topo: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "topo", "check", str(topo), "--json", *extra],
                         capture_output=True, text=True, cwd=REPO, timeout=240)
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert (out.returncode == 0) == all(link["ok"] for link in report["links"]), out.stderr
    return report


def _verdicts_follow_figures(link: dict) -> None:
    """Each verdict is exactly what the link's figures earn (see linkmeasure/results.py and packet_trains.py)."""
    for d in link["directions"]:
        t = d["train"]
        assert t["sent"] > 0 and t["received"] + t["lost"] >= t["sent"]
    trains = [d["train"] for d in link["directions"]]
    v, cfg = link["loss"]["verdict"], link["loss"]["configured"]
    assert v["sent"] == sum(t["sent"] for t in trains) and v["lost"] == sum(t["lost"] for t in trains)
    if cfg == 0:
        loss_ok = all(t["lost"] == 0 for t in trains)
    else:
        pooled = abs(v["lost"] / v["sent"] / cfg - 1) <= v["rel_tol"] + 1e-9
        each = all(w["accept"][0] <= t["lost"] <= w["accept"][1] for w, t in zip(v["directions"], trains, strict=True))
        loss_ok = pooled and each and v["rel_tol"] >= 0.2
    assert link["loss_ok"] == loss_ok == v["ok"]
    rate_ok = all(abs(d["rate_mbps"] / link["goodput_mbps"]["configured"] - 1) <= 0.05 for d in link["directions"])
    assert link["rate_ok"] == rate_ok
    rtt_ok = abs(link["rtt_ms"]["measured"] - link["rtt_expected_ms"]) <= 0.3 + 1e-6
    assert link["rtt_ok"] == rtt_ok
    assert link["ok"] == (link["rtt_ok"] and link["loss_ok"] and link["delay_ok"] and link["rate_ok"]
                          and (link["goodput_ok"] or not link["goodput_judged"]))


def test_topo_check_2dc_json_gives_each_link_its_verdict():
    """`testbed topo check --json --no-tcp` on the 2dc quickstart: the report carries its
    keys and each link's configured figures; each link's verdicts are exactly what its
    measured figures earn, and the exit code follows them. The calibrated RTT must be
    within the issue's 0.3 ms (plus 0.2 ms for a shared machine), the train lose nothing
    and keep order. TCP's goodput: test_topo_check_2dc_tcp_carries_a_quarter_of_the_rate
    (make floors)."""
    report = run_check(TOPO, "--no-tcp")
    assert set(report) == {"delay_backend", "build_s", "teardown_s", "links"}
    if not detect_features().netem:
        assert report["delay_backend"] == "relay"
    links = report["links"]
    assert [(link["a"], link["b"]) for link in links] == [("dc1", "dc2")]
    for link in links:
        assert link["rtt_ms"]["configured"] == 50.0 and link["goodput_mbps"]["configured"] == 1000.0
        _verdicts_follow_figures(link)
        rtt = link["rtt_ms"]["measured"]
        print(f"\nbuild {report['build_s']} s, RTT {rtt} ms (path offset {link['path_offset_ms']} ms), "
              f"UDP rate {[d['rate_mbps'] for d in link['directions']]}, ok={link['ok']}")
        assert link["goodput_judged"] is False  # --no-tcp
        if report["delay_backend"] == "relay":
            assert link["path_offset_ms"] is not None and 0 <= link["path_offset_ms"] <= 2.0
        assert abs(rtt - 50.0) <= 0.5, f"RTT {rtt} ms is not within 0.3 ms (+0.2) of the configured 50 ms"
        for d in link["directions"]:
            assert d["train"]["lost"] == 0 and d["train"]["reordered"] == 0 and d["train"]["early"] == 0


@pytest.mark.floor
def test_topo_check_2dc_tcp_carries_a_quarter_of_the_rate():
    """With TCP (no --no-tcp): the link carries a quarter of its rate over TCP (it works
    at all: on CI's two busy cores the userspace relay has fallen to 44% of the rate,
    which the check then reports, not hides), and the verdicts follow the figures."""
    report = run_check(TOPO)
    (link,) = report["links"]
    _verdicts_follow_figures(link)
    rate = link["goodput_mbps"]["measured"]
    print(f"\n2dc TCP goodput {rate} Mbit/s of 1000, ok={link['ok']}")
    assert link["goodput_judged"] is True
    assert rate >= 0.25 * 1000.0, f"the link carried {rate} Mbit/s of its 1000"


LOSSY = """
name: lossy3
description: a 10 ms RTT link with 2% loss and +-1 ms jitter, and a 200 ms RTT link
tcp: {congestion_control: cubic, rmem_max: 4MB, wmem_max: 4MB}
dcs:
  - {name: p, hosts: 1}
  - {name: q, hosts: 1}
  - {name: r, hosts: 1}
wan:
  - {between: [p, q], rate: 300Mbit, delay: 5ms, jitter: 1ms, loss: 2%}
  - {between: [q, r], rate: 200Mbit, delay: 100ms}
"""


def test_topo_check_deep_verifies_loss_jitter_and_rtt_from_10_to_200_ms(tmp_path: Path):
    """A lossy, jittery 10 ms RTT link and a 200 ms RTT link, checked with --deep (and
    --no-tcp, for time): the train's loss is consistent with the configured 2% (its
    interval stated), nothing arrives early or out of order, the capture on the WAN node
    sees the same datagrams lost, the pcapng and the histogram are written, TCP's
    expected goodput under the loss is shown, the UDP rate is the configured one on the
    lossy link too (UDP GSO loses segments, not whole super-packets). Both RTTs are within
    the issue's 0.3 ms (plus 0.2 ms for a shared machine) of the configured (model's)
    RTT."""
    topo = tmp_path / "lossy3.yaml"
    topo.write_text(LOSSY)
    out = tmp_path / "deep"
    report = run_check(topo, "--deep", "--out", str(out), "--no-tcp")
    lossy, far = report["links"]
    for link in (lossy, far):
        _verdicts_follow_figures(link)
        print(f"\n{link['a']}-{link['b']}: RTT {link['rtt_ms']['measured']} (model {link['rtt_expected_ms']}), "
              f"loss {link['loss']['measured']}, rate {[d['rate_mbps'] for d in link['directions']]}, "
              f"ok={link['ok']}")
        assert abs(link["rtt_ms"]["measured"] - link["rtt_expected_ms"]) <= 0.5
        assert Path(link["pcap"]).stat().st_size > 0 and link["capture_drops"] == 0
        assert Path(link["histogram"]).read_bytes()[:4] == b"\x89PNG"
    assert lossy["goodput_judged"] is False and far["goodput_judged"] is False  # --no-tcp
    assert lossy["rtt_expected_ms"] > 10.0  # jitter with order kept: datagrams wait for slower ones
    for d in lossy["directions"]:
        t, node = d["train"], d["node"]
        assert t["sent"] >= 9500  # sized for +-20% = 4 sd of both ways pooled around 2%
        assert 0.01 < t["loss"] < 0.04
        assert t["early"] == 0 and t["reordered"] == 0 and node["reordered"] == 0
        assert abs(node["lost"] - t["lost"]) <= 3  # the link lost them, not the hosts
        assert 4.0 - 0.3 <= t["delay_ms"]["min"] and t["delay_ms"]["p50"] <= 6.3
        assert 0 < d["expected_goodput_mbps"] < 300 and d["goodput_mbps"] is None
        assert d["rate_mbps"] is not None and d["rate_mbps"] > 0  # its floor: the test below (make floors)
    for d in far["directions"]:
        assert d["train"]["lost"] == 0 and d["node"]["lost"] == 0


@pytest.mark.floor
def test_topo_check_udp_rate_on_a_lossy_link_is_the_configured_one(tmp_path: Path):
    """The UDP rate measured on the lossy 300 Mbit/s link is at least 90% of it (UDP GSO
    loses segments, not whole super-packets); a rate the machine's load can lower."""
    topo = tmp_path / "lossy3.yaml"
    topo.write_text(LOSSY)
    lossy, _ = run_check(topo, "--no-tcp")["links"]
    rates = [d["rate_mbps"] for d in lossy["directions"]]
    print(f"\nUDP rate on the lossy 300 Mbit/s link: {rates} Mbit/s")
    assert all(r >= 0.9 * 300 for r in rates), rates
