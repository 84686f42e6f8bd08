"""Striping across the emulated WAN of topologies/2dc.yaml (50 ms RTT, 1 MB TCP
buffers, so one flow is window-limited near 100 Mbit/s of the 1 Gbit/s link): eight
streams carry several times what one does, for iperf3 (`linkmeasure.check.measure_goodput`)
and for Atlas (`bench.transport.wan_suite`, every tensor verified). Throughput ratios
that depend on the machine's load: asserted under `make floors` (TESTBED_FLOOR_TESTS=1,
on a quiet machine) and printed; the default suite runs the same transport bench for
correctness in the reduced demo (tests/root/test_demo_e2e.py)."""

from __future__ import annotations

import pytest

from testbed_core.constants import TOPOLOGIES_DIR

pytestmark = [pytest.mark.root, pytest.mark.floor, pytest.mark.slow]
TOPO = TOPOLOGIES_DIR / "2dc.yaml"


def test_eight_iperf3_streams_get_at_least_4x_one_stream_across_the_2dc_wan() -> None:
    from testbed.emulation.linkmeasure.check import measure_goodput
    from testbed.emulation.network import Emulation

    mbps = {}
    with Emulation.from_file(TOPO) as emu:
        src, dst = emu.host("dc1", 0), emu.host("dc2", 0)
        for n in (1, 8):
            got = measure_goodput(src, dst, dst.ip, n, duration=4, omit=1)
            assert got.bps is not None, f"iperf3 with {n} streams {src.name} -> {dst.name} failed: {got.error}"
            mbps[n] = got.bps / 1e6
    print(f"\n1 stream {mbps[1]:.0f} Mbit/s, 8 streams {mbps[8]:.0f} Mbit/s, ratio {mbps[8] / mbps[1]:.1f}")
    # 1 MB buffers over 50 ms cap one flow near 100 Mbit/s, far under the 1 Gbit/s link
    assert mbps[1] < 200
    assert mbps[8] >= 4 * mbps[1]


def test_atlas_striping_beats_one_stream_on_the_wan(tmp_path) -> None:
    from testbed.bench.transport import wan_suite

    results = wan_suite(TOPO, streams=[1, 8], size=24 << 20, repeat=1, methods=["atlas"], log_dir=tmp_path)
    by_n = {m.streams: m for m in results}
    for m in results:
        assert m.error is None and m.verified, m
    one, eight = by_n[1].goodput_mbps, by_n[8].goodput_mbps
    print(f"\nwan atlas: N=1 {one:.0f} Mbit/s, N=8 {eight:.0f} Mbit/s ({eight / one:.1f}x)")
    # The target (issue 3) is 4x with 256 MiB; with a small tensor slow start weighs
    # more, so the floor is a generous 2.5x.
    assert eight > 2.5 * one
