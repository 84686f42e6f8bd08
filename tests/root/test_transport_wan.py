"""Atlas across the emulated WAN of topologies/2dc.yaml (50 ms RTT, window-limited
flows): striping must beat one stream by a wide margin, and every tensor arrive intact."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("testbed.emulation.network")

from testbed.bench.transport import wan_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.root
@pytest.mark.slow
def test_atlas_striping_beats_one_stream_on_the_wan(tmp_path: Path) -> None:
    results = wan_suite(ROOT / "topologies" / "2dc.yaml", streams=[1, 8], size=24 << 20, repeat=1,
                        methods=["atlas"], log_dir=tmp_path)
    by_n = {m.streams: m for m in results}
    for m in results:
        assert m.error is None and m.verified, m
    one, eight = by_n[1].goodput_mbps, by_n[8].goodput_mbps
    print(f"\nwan atlas: N=1 {one:.0f} Mbit/s, N=8 {eight:.0f} Mbit/s ({eight / one:.1f}x)")
    # The target (issue 3) is 4x with 256 MiB; with a small tensor slow start weighs
    # more, so the test asks for a generous 2.5x.
    assert eight > 2.5 * one
