"""Stand-ins for `testbed.run.runner.run_scenario` used by the sweep and report tests.

They write what the real runner writes (summary.json through its model, built with
summary_builders.py, and scenario.resolved.yaml) with
figures derived from the point's parameters by a simple window-limited TCP model,
so aggregation and plots are exercised on real files whose numbers move with the
swept values. Importable by name (`sweep_fakes:fake_runner`) so that the
`--runner` option and `--jobs` worker processes can load them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import summary_builders as builders  # noqa: E402

from testbed_core.contracts.summary import Summary, VariantResult  # noqa: E402

BYTES_PER_ITERATION = 40e6  # what crosses the WAN per iteration, bytes
COMPUTE_S = 1.0


def make_summary(scenario: Any) -> Summary:
    link = scenario.topology.wan[0]
    rtt, rate = link.rtt_s, link.rate
    window = scenario.topology.tcp_for(link.between[0]).window_limited_rate(rtt)
    streams = scenario.transport.streams if isinstance(scenario.transport.streams, int) else 8
    noise = 1 + 0.02 * ((scenario.seed * 7919) % 5) / 5

    def variant(name: str, n_streams: int, share: float, crossings: int) -> VariantResult:
        goodput = min(rate, n_streams * window)
        it = (COMPUTE_S + share * BYTES_PER_ITERATION * 8 / goodput + crossings * rtt) * noise
        util = 0.9 * COMPUTE_S / it
        return builders.variant(
            name, it, predicted_s=it * 1.03, device_utilization=util, streams=n_streams, bubble_fraction=1 - util / 0.9,
            wan={link.name: builders.wan_link(int(BYTES_PER_ITERATION * 3), goodput / 1e6)},
        )

    variants: dict[str, VariantResult] = {
        "baseline": variant("baseline", 1, 1.0, 4),
        "multi-tcp": variant("multi-tcp", streams, 1.0, 4),
        "atlas": variant("atlas", streams, 0.3, 2),
    }
    variants = {k: v for k, v in variants.items() if k in scenario.variants}
    if scenario.bubbletea.enabled:
        load = min(1.0, scenario.bubbletea.requests.rate / 10)
        for name in list(variants):
            base = variants[name]
            variants[f"{name}+bubbletea"] = builders.with_bubbletea(
                base, f"{name}+bubbletea", iteration_time_s=base.iteration_time_s * 1.004,
                device_utilization=base.device_utilization + (1 - base.device_utilization) * 0.9 * load,
                training_slowdown=0.004, served=int(200 * load), rejected=3,
                ttft_p50=0.2 + rtt, ttft_p95=0.5 + 2 * rtt,
            )
    return builders.summary(dict(variants), scenario=scenario.name, seed=scenario.seed)


def fake_runner(scenario: Any, resolved: dict[str, Any], out_dir: Path, progress: Any = None) -> Summary:
    summary = make_summary(scenario)
    pause = float(os.environ.get("FAKE_RUNNER_SLEEP", "0"))
    if progress is not None:
        progress.set_total(len(summary.variants))
    for name in summary.variants:
        if progress is not None:
            progress.start(name)
        time.sleep(pause / max(1, len(summary.variants)))
        if progress is not None:
            progress.done(name)
    (out_dir / "scenario.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (out_dir / "summary.json").write_text(summary.to_json())
    return summary


def failing_runner(scenario: Any, resolved: dict[str, Any], out_dir: Path, progress: Any = None) -> Summary:
    raise RuntimeError("emulation failed: no free run prefix")


def flaky_runner(scenario: Any, resolved: dict[str, Any], out_dir: Path, progress: Any = None) -> Summary:
    """Fails on the long-RTT points only."""
    if scenario.topology.wan[0].rtt_s > 0.15:
        raise RuntimeError(f"relay lost its queue at RTT {scenario.topology.wan[0].rtt_s * 1000:g} ms")
    return fake_runner(scenario, resolved, out_dir, progress)


def returning_runner(scenario: Any, resolved: dict[str, Any], out_dir: Path, progress: Any = None) -> Summary:
    """Returns the summary without writing it: the sweep must write summary.json itself."""
    return make_summary(scenario)


TOPOLOGY = {
    "name": "t2",
    "tcp": {"rmem_max": "1MB", "wmem_max": "1MB"},
    "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}],
    "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}],
}
WORKLOAD = {
    "name": "tiny",
    "model": {"layers": 4, "hidden": 256, "seq_len": 128, "vocab": 1000, "heads": 4},
    "parallelism": {"pp": 2, "num_micro_batches": 4},
    "gpu": {"type": "A100"},
}


def write_base(folder: Path, *, bubbletea: bool = False, name: str = "base.yaml") -> Path:
    """A small valid base scenario (topology and workload in files of their own)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "topo.yaml").write_text(yaml.safe_dump(TOPOLOGY))
    (folder / "wl.yaml").write_text(yaml.safe_dump(WORKLOAD))
    scenario = {"name": "base", "topology": "topo.yaml", "workload": "wl.yaml", "bubbletea": {"enabled": bubbletea}}
    path = folder / name
    path.write_text(yaml.safe_dump(scenario))
    return path


def write_sweep(folder: Path, body: dict[str, Any], name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", **body}, sort_keys=False))
    return path


def fail_if_called(scenario: Any, resolved: dict[str, Any], out_dir: Path, progress: Any = None) -> Summary:
    raise AssertionError("a point ran although the sweep should have been refused")
