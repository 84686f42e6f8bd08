"""Link verification: the window-limited 2dc quickstart and `testbed topo check`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emulation.kernel import detect_features
from testbed.emulation.linkcheck import compare_streams
from testbed.emulation.network import Emulation

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TOPO = REPO / "topologies" / "2dc.yaml"


def test_eight_streams_get_at_least_4x_one_stream_across_the_2dc_wan():
    with Emulation.from_file(TOPO) as emu:
        cmp = compare_streams(emu, "dc1", "dc2", few=1, many=8, duration=4)
    print(f"\n1 stream {cmp.few_mbps:.0f} Mbit/s, 8 streams {cmp.many_mbps:.0f} Mbit/s, ratio {cmp.ratio:.1f}")
    # 1 MB buffers over 50 ms cap one flow near 100 Mbit/s, far under the 1 Gbit/s link
    assert cmp.few_mbps < 200
    assert cmp.ratio >= 4


def run_check() -> dict:
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "topo", "check", str(TOPO), "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=180)
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert (out.returncode == 0) == all(link["ok"] for link in report["links"])
    return report


def test_topo_check_2dc_json_gives_each_link_its_verdict():
    """`testbed topo check --json` on the 2dc quickstart: the report carries its keys and
    each link's configured figures; each link's verdict (`ok`) is exactly what its
    measured figures earn (RTT within max(1 ms, 3%), goodput at least 90% of the rate in
    the slower direction), and the exit code follows the verdicts. The RTT must be in
    tolerance and the link must carry a quarter of its rate (it works at all): on CI's two
    busy cores the userspace relay has fallen to 44% of the rate, short of the check's own
    90% bar, which is then reported (ok false, exit 1), not hidden; the delay line's
    throughput floor belongs to the fidelity work, not to this verdict test."""
    report = run_check()
    assert set(report) == {"delay_backend", "build_s", "teardown_s", "links"}
    if not detect_features().netem:
        assert report["delay_backend"] == "relay"
    links = report["links"]
    assert [(link["a"], link["b"]) for link in links] == [("dc1", "dc2")]
    for link in links:
        assert link["rtt_ms"]["configured"] == 50.0 and link["goodput_mbps"]["configured"] == 1000.0
        rtt, rate = link["rtt_ms"]["measured"], link["goodput_mbps"]["measured"]
        rtt_ok = abs(rtt - 50.0) <= max(1.0, 0.03 * 50.0)
        goodput_ok = rate >= 0.9 * 1000.0
        print(f"\nbuild {report['build_s']} s, teardown {report['teardown_s']} s, RTT {rtt} ms, "
              f"goodput {rate} Mbit/s, ok={link['ok']}")
        assert link["rtt_ok"] == rtt_ok and link["goodput_ok"] == goodput_ok
        assert link["ok"] == (rtt_ok and goodput_ok)
        assert rtt_ok, f"RTT {rtt} ms is out of tolerance of the configured 50 ms"
        assert rate >= 0.25 * 1000.0, f"the link carried {rate} Mbit/s of its 1000"
