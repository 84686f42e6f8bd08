"""The prefill controller in a real run (root): a short run of atlas, atlas+bubbletea with
the controller and its shards and naive twins on the emulated 2dc topology (quickstart's
workload, 1 warm-up + 1 measured iteration). Checks that every variant accounts for every
request, that the controller dispatched to the devices, and that the naive twin is marked
as such; timing is not asserted (the machine is shared).

Only the run gets in: once the controller variant's agents are ready, every TCP listener
of every emulated host (workers' channels, decode servers, the controller) is probed
from inside the host and from the root namespace, as a stranger: an HTTP request without
the run's token and an atlas handshake with another run's secret are each refused (401,
or the connection closed or never made); the controller listens on its host's address
only (not loopback), refuses another run's token, and counts the refusals."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.ports import PortPlan
from testbed.run.runner import run_scenario
from testbed.run.scenario import RunnerSettings, load_scenario

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import listener_probe  # noqa: E402 - the probe beside this file, also run inside the hosts

REFUSED = ("http 401", "closed", "reset", "refused", "unreachable")  # nothing served


def _probe_inside(net, host: str, controller: dict | None) -> dict:
    """The probe run in emulated host `host`'s namespace: its listeners, as a stranger."""
    args = {"own_ip": net.host(host).ip, "controller": controller}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = net.host(host).popen([sys.executable, str(ROOT / "tests/root/listener_probe.py"), json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (host, err[-2000:])
    return json.loads(out.strip().splitlines()[-1])


def _stranger_refused(row: dict) -> bool:
    return row["http"] in REFUSED and row["atlas"] != "accepted"


@pytest.mark.long  # 80 s on a quiet 2-core machine: make test-long
@pytest.mark.timeout(400)
def test_controller_shards_and_naive_in_one_run(tmp_path: Path, namespaces, monkeypatch) -> None:
    before = namespaces()
    overrides = {
        "variants": ["atlas"], "workload.warmup": 1, "workload.iterations": 1, "runner.calibrate": False,
        "runner.base_port": 39700, "bubbletea.requests.rate": 40, "bubbletea.dispatch": "controller",
        "bubbletea.compare_dispatch": ["shards", "naive"],
    }
    if "bubbletea_idle_twin" in RunnerSettings.model_fields:
        overrides["runner.bubbletea_idle_twin"] = False
    scenario, resolved = load_scenario(ROOT / "scenarios/quickstart.yaml", overrides)
    out = tmp_path / "out"
    hosts = [f"{dc.name}-{h}" for dc in scenario.topology.dcs for h in dc.hosts]
    probes: dict = {}
    import testbed.run.workers as workers

    weigh = workers.weigh_agents

    def probing(net, variant, *args, **kwargs):  # called once the variant's agents and servers are ready
        if variant == "atlas+bubbletea" and not probes:
            job = json.loads((out / variant / "jobs" / "controller.json").read_text())
            ctl_host = next(h for h in hosts if net.host(h).ip == job["host"])
            ctl = {"ip": job["host"], "port": job["port"], "token_file": str(out / "prefill-client.token")}
            probes["job"] = job
            probes["inside"] = {h: _probe_inside(net, h, ctl if h == ctl_host else None) for h in hosts}
            targets = [tuple(r["target"]) for p in probes["inside"].values() for r in p["listeners"]]
            probes["outside"] = listener_probe.probe("0.0.0.0", targets)  # from the root namespace
        return weigh(net, variant, *args, **kwargs)

    monkeypatch.setattr(workers, "weigh_agents", probing)
    log = io.StringIO()
    run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["variants"]) == ["atlas", "atlas+bubbletea", "atlas+bubbletea-shards",
                                         "atlas+bubbletea-naive"]
    for name, mode in (("atlas+bubbletea", "controller"), ("atlas+bubbletea-shards", "shards"),
                       ("atlas+bubbletea-naive", "naive")):
        v = summary["variants"][name]
        assert "error" not in v, (name, v.get("error"))
        svc = v["prefill_service"]
        assert svc["dispatch"] == mode and svc["accounted"], (name, svc)
        assert svc["arrived"] == svc["served"] + svc["rejected"] > 0
        assert v["training_slowdown"] is not None
    ctl = summary["variants"]["atlas+bubbletea"]["prefill_service"]
    assert ctl["served"] > 0 and sum(ctl["by_device"].values()) > 0
    assert set(ctl["by_device"]) == {"p0r0", "p0r1", "p1r0", "p1r1"}
    rows = [json.loads(line) for line in (out / "atlas+bubbletea" / "controller" / "requests.jsonl")
            .read_text().splitlines()]
    assert len(rows) == ctl["arrived"] and all(r["status"] in ("served", "rejected") for r in rows)
    assert all(r["reason"] for r in rows if r["status"] == "rejected")
    # only the run got in: every listener of every host refused the stranger, inside and out
    inside = [r for p in probes["inside"].values() for r in p["listeners"]]
    print(json.dumps(probes, indent=1))
    # listening then: the controller and a decode server per DC (the workers' channel listeners
    # close once their channels are open: probed in unit tests, as atlas listeners)
    ports = {r["listen"][1] for r in inside}
    decode = {PortPlan(scenario.runner.base_port).decode.port(k) for k in range(len(scenario.topology.dcs))}
    assert {probes["job"]["port"], *decode} <= ports, inside
    assert all(_stranger_refused(r) for r in inside), [r for r in inside if not _stranger_refused(r)]
    outside = probes["outside"]["listeners"]
    assert len(outside) == len(inside) and all(_stranger_refused(r) for r in outside), outside
    job = probes["job"]
    assert job["host"] != "0.0.0.0"
    ctl_rows = [r for r in inside if r["listen"][1] == job["port"]]
    assert [r["listen"][0] for r in ctl_rows] == [job["host"]]  # its host's address in the run, no other
    assert ctl_rows[0]["http"] == "http 401" and "Authorization: Bearer" in ctl_rows[0]["http_body"]
    ctl_probe = next(p for p in probes["inside"].values() if "status" in p)
    assert ctl_probe["other_run_token"] == "http 401" and ctl_probe["loopback"] == "refused"
    assert ctl_probe["status"] == "http 200", ctl_probe  # the run's client token, from the run's folder, goes in
    assert ctl_probe["counts"]["unauthorized"] >= 2 and ctl_probe["counts"]["arrived"] == 0
    assert stat.S_IMODE((out / "prefill-client.token").stat().st_mode) == 0o600
    ctl_summary = json.loads((out / "atlas+bubbletea" / "controller" / "controller.json").read_text())
    assert ctl_summary["unauthorized"] >= 2
    assert namespaces() == before
