"""``transport.pacing: auto``: on where the windows of the channels that may cross a WAN
link at once would overflow its queue (in steady state or as one LAN-rate burst),
off where they fit; a scenario's true/false kept; the run says why and keeps the
choice in scenario.resolved.yaml."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from testbed.progress import Progress
from testbed.run.common import PACING_CAP_MBPS, transport_job
from testbed.run.pacing import choose_pacing, link_streams
from testbed.run.runner import _resolve_pacing
from testbed.run.scenario import load_scenario
from testbed.run.variants import run_variants
from testbed_core.topology import parse_topology
from testbed_core.variants import REGISTRY, RunVariant

ROOT = Path(__file__).resolve().parents[3]
BASELINE, MULTI, ATLAS = (RunVariant(REGISTRY[n]) for n in ("baseline", "multi-tcp", "atlas"))


def _topo(queue: str = "auto", rate: str = "1Gbit", buffers: str = "1MB"):
    # topologies/2dc.yaml's link: 1 Gbit/s, 50 ms RTT, queue one BDP (6.25 MB), 10 Gbit/s LANs
    return parse_topology({"name": "t", "tcp": {"rmem_max": buffers, "wmem_max": buffers},
                           "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}],
                           "wan": [{"between": ["dc1", "dc2"], "rate": rate, "delay": "25ms", "queue": queue}]})


def test_eight_stream_channels_of_two_pipelines_overflow_one_bdp_of_queue() -> None:
    # 2 x 8 x 1 MB = 16 MB: as a 10 Gbit/s burst, 14.4 MB stays against a 6.25 MB queue
    choice = choose_pacing(_topo(), 2, 8, "auto", [BASELINE, MULTI, ATLAS])
    assert choice.on
    assert "2 channel(s) x 8 stream(s) x 1.00 MB windows = 16.0 MB may leave dc1 for dc2" in choice.why
    assert "14.4 MB of it against a 6.25 MB queue" in choice.why and "dc1-dc2" in choice.why
    assert "transport.pacing: false" in choice.why  # how to keep it off


def test_one_stream_channels_fit_and_stay_unpaced() -> None:
    choice = choose_pacing(_topo(), 2, 8, "auto", [BASELINE])
    assert not choice.on and "off" in choice.why


def test_a_deep_queue_holds_them() -> None:
    # 64 MB of queue: the 14.4 MB burst and the 16 MB in flight fit
    assert not choose_pacing(_topo(queue="64MB"), 2, 8, "auto", [MULTI]).on


def test_the_scenario_s_word_and_local_runs() -> None:
    assert choose_pacing(_topo(), 2, 8, False, [MULTI]).on is False
    assert choose_pacing(_topo(queue="64MB"), 2, 8, True, [BASELINE]).on is True
    local = choose_pacing(_topo(), 2, 8, "auto", [MULTI], local=True)
    assert not local.on and "--local" in local.why


def test_atlas_takes_streams_enough_to_fill_the_link() -> None:
    topo = _topo(rate="10Gbit")
    # 10 Gbit/s x 50 ms / (1 MB x 8) = 62.5: 63 streams at least, whatever transport.streams says
    assert link_streams(topo, "dc1", "dc2", 2, [ATLAS]) == 63
    assert link_streams(topo, "dc1", "dc2", 2, [MULTI]) == 2
    assert link_streams(topo, "dc1", "dc2", "auto", [MULTI]) == 16
    assert link_streams(topo, "dc1", "dc2", 8, [BASELINE]) == 1


def test_the_run_resolves_it_says_why_and_keeps_it(tmp_path: Path) -> None:
    scenario, resolved = load_scenario(ROOT / "scenarios" / "atlas-2dc.yaml")
    assert scenario.transport.pacing == "auto"
    out = io.StringIO()
    paced = _resolve_pacing(scenario, resolved, run_variants(scenario), tmp_path,
                            Progress(1, stream=out, tty=False))
    assert paced.transport.pacing is True
    assert transport_job(paced.transport).pacing_rate_mbps == PACING_CAP_MBPS
    assert "transport.pacing auto: on, unpaced channels would overflow a WAN queue" in out.getvalue()
    text = (tmp_path / "scenario.resolved.yaml").read_text()
    assert text.startswith("# transport.pacing auto: on") and yaml.safe_load(text)["transport"]["pacing"] is True
    kept, resolved = load_scenario(ROOT / "scenarios" / "atlas-2dc.yaml", {"transport.pacing": False})
    assert _resolve_pacing(kept, resolved, run_variants(kept), tmp_path / "x",
                           Progress(1, stream=io.StringIO(), tty=False)).transport.pacing is False
