"""The quickstart topology split over two server namespaces (each with its own sshd on
a private underlay, testbed/emulation/cluster/rig.py) and checked with `topo check`,
unchanged, as on one machine; the start-up checks that refuse a split the servers
cannot carry; and `testbed clean` undoing a rig whose owner was killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed_core.constants import REPO_ROOT, TOPOLOGIES_DIR

pytestmark = [pytest.mark.root, pytest.mark.cluster]

TESTBED = [sys.executable, "-m", "testbed.cli"]


def _split(rig, tmp_path: Path, configure: str = "auto", **servers_update) -> Path:
    data = yaml.safe_load((TOPOLOGIES_DIR / "2dc.yaml").read_text())
    section = rig.servers_section({"s1": ["dc1"], "s2": ["dc2"]}, configure=configure).model_dump(mode="json",
                                                                                   exclude_none=True)
    for key, value in servers_update.items():
        if key == "machines":
            for machine, extra in zip(section["machines"], value, strict=True):
                machine.update(extra)
        elif key == "ssh":
            section["ssh"].update(value)
        else:
            section[key] = value
    data["servers"] = section
    path = tmp_path / "2dc-split.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _report(res: subprocess.CompletedProcess) -> dict:
    """The JSON on stdout; where there is none, the failure shows what the command said."""
    assert res.stdout.strip(), f"no JSON report on stdout (exit {res.returncode}); stderr:\n{res.stderr[-3000:]}"
    return json.loads(res.stdout)


def _topo_check(rig, path: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(rig.head_argv([*TESTBED, "topo", "check", str(path), "--json", *extra]), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def rig():
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(2, mtu=9000) as rig:  # jumbo underlay: 1500-byte frames inside the tunnel
        yield rig


@pytest.mark.alone  # the RTT measured: make test runs it with nothing beside it
def test_the_quickstart_split_over_two_servers_passes_topo_check(rig, tmp_path):
    """`topo check --no-tcp`, unchanged, on 2dc with dc1 on server s1 and dc2 on s2 (the
    WAN link's far leg a VXLAN tunnel over the underlay), judged with the tolerances of
    the one-machine check (tests/root/test_topo_check.py): the calibrated RTT within
    0.3 ms (+0.2 ms for a shared machine), the train losing nothing, keeping order,
    nothing early; the exit code follows the verdicts (rate and lateness verdicts fall
    with the machine's load, as on one machine). TCP's goodput across the split:
    test_tcp_across_the_split_carries_a_quarter_of_the_rate (make floors)."""
    res = _topo_check(rig, _split(rig, tmp_path), "--no-tcp")
    assert res.returncode in (0, 1), res.stderr[-3000:]
    report = _report(res)
    assert "measuring the underlay s1 -> s2" in res.stderr  # capacity measured, not assumed
    (link,) = report["links"]
    assert (res.returncode == 0) == link["ok"]
    rtt = link["rtt_ms"]["measured"]
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\nsplit 2dc: build {report['build_s']} s, RTT {rtt} ms, UDP rate "
          f"{[d['rate_mbps'] for d in link['directions']]}, ok={link['ok']} (load {load})")
    assert abs(rtt - 50.0) <= 0.5, f"RTT {rtt} ms is not within 0.3 ms (+0.2) of the configured 50 ms"
    assert link["rtt_ok"] == (abs(rtt - link["rtt_expected_ms"]) <= 0.3 + 1e-6)
    assert link["goodput_judged"] is False  # --no-tcp
    for d in link["directions"]:
        assert d["train"]["lost"] == 0 and d["train"]["reordered"] == 0 and d["train"]["early"] == 0


@pytest.mark.floor
def test_tcp_across_the_split_carries_a_quarter_of_the_rate(rig, tmp_path):
    """`topo check` with TCP across the split: each direction carries at least a quarter
    of the 1 Gbit/s rate, a floor that falls with the machine's load (make floors)."""
    res = _topo_check(rig, _split(rig, tmp_path))
    assert res.returncode in (0, 1), res.stderr[-3000:]
    (link,) = _report(res)["links"]
    rates = [d["goodput_mbps"] for d in link["directions"]]
    print(f"\nsplit 2dc TCP goodput {rates} Mbit/s, ok={link['ok']}")
    assert min(rates) >= 250, rates


@pytest.mark.alone  # the RTT measured: make test runs it with nothing beside it
def test_the_split_with_every_node_reached_over_ssh_passes_topo_check(rig, tmp_path):
    """The same split with `servers.configure: ssh`: the rig's servers are handled as
    other machines (every node configured by its node agent over SSH, every program,
    the delay line and topo check's probes included, started through `nodeagent exec`;
    nothing through this machine's /proc), and `topo check --no-tcp` judges the link as
    on one machine; nothing of the run is left on the servers afterwards."""
    res = _topo_check(rig, _split(rig, tmp_path, configure="ssh"), "--no-tcp")
    assert res.returncode in (0, 1), res.stderr[-3000:]
    for server in ("s1", "s2"):
        assert f"server {server}: nodes configured and programs started over SSH (servers.configure: ssh)" \
            in res.stderr
    report = _report(res)
    (link,) = report["links"]
    assert (res.returncode == 0) == link["ok"]
    rtt = link["rtt_ms"]["measured"]
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\nsplit 2dc over SSH: build {report['build_s']} s, RTT {rtt} ms, UDP rate "
          f"{[d['rate_mbps'] for d in link['directions']]}, ok={link['ok']} (load {load})")
    assert abs(rtt - 50.0) <= 0.5, f"RTT {rtt} ms is not within 0.3 ms (+0.2) of the configured 50 ms"
    for d in link["directions"]:
        assert d["train"]["lost"] == 0 and d["train"]["reordered"] == 0 and d["train"]["early"] == 0
        assert d["rate_mbps"] is not None  # the WAN node's counters, read by its agent, gave the shaper's rate
    prefix = re.search(r"run (tb[0-9a-f]{3}): creating nodes", res.stderr).group(1)  # type: ignore[union-attr]
    assert not Path(f"/run/testbed/{prefix}.json").exists(), res.stderr[-3000:]
    left = subprocess.run(["pgrep", "-f", f"TESTBED_RUN={prefix}|--run {prefix}|mininet:{prefix}"],
                          capture_output=True, text=True).stdout
    assert left.strip() == ""


@pytest.mark.floor  # 75 s quiet per way of reaching the nodes: make floors
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("configure", ["auto", "ssh"])
def test_bench_transport_runs_unchanged_over_the_split(rig, tmp_path, configure):
    """`testbed bench transport` across the split's WAN (nodes reached through their
    PIDs, or every node over SSH): atlas and iperf3 verified, and its own targets met
    with a margin for a shared machine (8 streams at least 0.8x iperf3 -P 8 and 4x one
    stream; it measured 0.84-0.96x and 6.1-6.8x on the idle machine)."""
    res = subprocess.run(rig.head_argv([*TESTBED, "bench", "transport", "--topology", str(_split(rig, tmp_path,
                                        configure=configure)), "--no-loopback", "--streams", "1,8", "--size", "32MiB",
                                        "--methods", "atlas,iperf3", "--json", "--out", str(tmp_path / "bench")]),
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    got = {(r["method"], r["streams"]): r for r in _report(res)["results"]}
    assert all(r["verified"] for r in got.values()), got
    atlas8, iperf8, atlas1 = (got[k]["goodput_mbps"] for k in (("atlas", 8), ("iperf3", 8), ("atlas", 1)))
    print(f"\nsplit ({configure}): atlas N=8 {atlas8} Mbit/s, iperf3 -P 8 {iperf8}, atlas N=1 {atlas1}")
    assert atlas8 >= 0.8 * iperf8 and atlas8 >= 4 * atlas1


def test_a_server_python_without_the_node_agent_is_refused(rig, tmp_path):
    res = _topo_check(rig, _split(rig, tmp_path, configure="ssh", python="/nonexistent/python3"), timeout=180)
    assert res.returncode != 0
    assert ("server s1 (10.202.0.2) is reached over SSH (servers.configure: ssh), and its Python "
            "('/nonexistent/python3', servers.python) cannot import this package's node agent") in res.stderr
    assert "install this package there" in res.stderr


def test_a_server_already_running_nodes_of_the_runs_prefix_is_refused(rig, tmp_path):
    """Run prefixes are unique on the controller only: a server reached over SSH that
    already runs a node shell of the same prefix (another controller's run) is refused
    before anything is made there."""
    ssh = rig.ssh_argv(rig.servers[1], "bash -c 'exec -a mininet:tb0d1w01 sleep 60' >/dev/null 2>&1 & echo $!")
    started = subprocess.run(rig.head_argv(ssh), capture_output=True, text=True, timeout=60)
    assert started.returncode == 0
    pid = int(started.stdout.split()[-1])  # the rig's servers share this machine's PIDs
    code = ("import sys\nfrom testbed.emulation.network import Emulation, EmulationError\n"
            "try:\n    Emulation.from_file(sys.argv[1], prefix='tb0d1').start()\n"
            "except EmulationError as exc:\n    print(exc)\n")
    try:
        res = subprocess.run(rig.head_argv([sys.executable, "-c", code, str(_split(rig, tmp_path, configure="ssh"))]),
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    finally:
        os.kill(pid, signal.SIGKILL)
    # the rig's servers share one /proc: the first server asked already sees it
    assert ("server s1 (10.202.0.2) already runs nodes of a run named tb0d1 (another controller's): run again"
            in res.stdout), res.stdout + res.stderr[-2000:]
    assert not Path("/run/testbed/tb0d1.json").exists()


def test_an_underlay_slower_than_the_wan_rates_is_refused(rig, tmp_path):
    path = _split(rig, tmp_path, machines=[{"underlay_rate": "1Gbit"}, {}])
    res = _topo_check(rig, path, timeout=180)
    assert res.returncode != 0
    assert "the underlay between servers s1 and s2 carries 1Gbit (declared underlay_rate)" in res.stderr
    assert "lower those WAN rates" in res.stderr


def test_a_login_without_the_right_key_is_refused_naming_the_server(rig, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    res = _topo_check(rig, _split(rig, tmp_path, ssh={"identity": str(other)}), timeout=180)
    assert res.returncode != 0
    assert "server s1 (root@10.202.0.2:22): SSH login failed" in res.stderr
    assert "key-based login (ssh.identity)" in res.stderr


def test_a_tunnel_mtu_too_small_is_refused(tmp_path):
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(2, mtu=1300) as small:
        res = _topo_check(small, _split(small, tmp_path), timeout=180)
    assert res.returncode != 0
    assert "has MTU 1300, which leaves 1250 bytes inside a vxlan tunnel" in res.stderr
    assert "raise the MTU of" in res.stderr


@pytest.mark.cleans
def test_testbed_clean_undoes_a_rig_whose_owner_was_killed(tmp_path):
    code = ("from testbed.emulation.cluster.rig import ServerRig\n"
            "import sys, time\n"
            "rig = ServerRig(2); rig.start()\n"
            "print(rig.prefix, rig.dir, flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()  # type: ignore[union-attr]
        assert len(line) == 2, "the rig did not start"
        prefix, folder = line
        assert Path(folder).is_dir()
        assert f"{prefix}s1:sshd" in Path(f"/run/testbed/{prefix}.json").read_text()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    res = subprocess.run([*TESTBED, "clean"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    time.sleep(0.2)
    assert not Path(folder).exists()
    assert not Path(f"/run/testbed/{prefix}.json").exists()
    leftovers = subprocess.run(["pgrep", "-f", f"mininet:{prefix}"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""
    sshds = subprocess.run(["pgrep", "-f", f"{prefix}-rig-"], capture_output=True, text=True).stdout
    assert sshds.strip() == ""


# Paced streams (transport.pacing), and the quickstart at a quarter of its size
# (workload.scale 0.25; a 250 Mbit/s WAN and 256 KB TCP windows, so one stream
# fills the same share of the link): the same transfer times, a quarter of the CPU. The rig's two servers share this machine's two cores, and at 1 Gbit/s
# atlas's 8 streams through the VXLAN tunnel and the delay line were CPU bound there
# (atlas 1.40-1.58 s split against 1.15 s on one server, baseline equal, 2026-12-02):
# the test compares the network the split builds, not the cores it shares. Unpaced, the
# two speedups came out 33-41% apart in three clean-clone CI runs in a row.
# no calibration probe (17 s of each run): both runs then plan from the same a-priori model,
# and the split's path itself is verified by the topo check tests above
RUN_REDUCED = ["--variants", "baseline,atlas", "--set", "workload.warmup=1", "--set", "workload.iterations=2",
               "--set", "bubbletea.enabled=false", "--set", "runner.calibrate=false",
               "--set", "transport.pacing=true", "--set", "workload.scale=0.25",
               "--set", "topology.wan.0.rate=250Mbit", "--set", "topology.tcp.rmem_max=256KB",
               "--set", "topology.tcp.wmem_max=256KB"]


def _run_quickstart(rig, tmp_path: Path, name: str, split: bool) -> dict:
    """The reduced quickstart run, over the split (`--servers`, every node over SSH) or on
    this machine alone; summary.json's variants."""
    argv = [*TESTBED, "run", str(REPO_ROOT / "scenarios" / "quickstart.yaml"), "-o", str(tmp_path / name),
            *RUN_REDUCED]
    if split:
        servers = tmp_path / "servers.yaml"
        servers.write_text(yaml.safe_dump(rig.servers_section({"s1": ["dc1"], "s2": ["dc2"]}, configure="ssh")
                                          .model_dump(mode="json", exclude_none=True)))
        argv = rig.head_argv([*argv, "--servers", str(servers)])
    res = subprocess.run(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=420, check=False)
    assert res.returncode == 0, f"{name}: {res.stdout[-4000:]}"
    return json.loads((tmp_path / name / "summary.json").read_text())["variants"]


@pytest.mark.slow  # 30-40 s quiet with the rig; issue 16's done-when
@pytest.mark.timeout(600)
def test_testbed_run_over_the_split_trains_baseline_and_atlas(rig, tmp_path):
    """`testbed run` on the quickstart (reduced: baseline and atlas, one warm-up, two
    iterations) with `--servers` placing dc1 on s1 and dc2 on s2, every node reached
    over SSH as on other machines (`configure: ssh`): both variants train, carry their
    tensors across the split's WAN and report their iterations. Atlas's speedup is
    printed; compared with one server's by the floor test below (make floors)."""
    variants = _run_quickstart(rig, tmp_path, "split", split=True)
    for name in ("baseline", "atlas"):
        v = variants[name]
        assert "error" not in v, (name, v.get("error"))
        assert len(v["iteration_times_s"]) == 2 and v["iteration_time_s"] > 0, v
        assert v["wan_links"]["dc1-dc2"]["bytes"] > 0
    load = Path("/proc/loadavg").read_text().split()[0]
    speedup = variants["baseline"]["iteration_time_s"] / variants["atlas"]["iteration_time_s"]
    print(f"\natlas speedup over baseline, split over two servers: {speedup:.2f} (load {load})")


@pytest.mark.floor  # 60-75 s quiet with the rig; issue 16's done-when, on a quiet machine
@pytest.mark.slow
@pytest.mark.timeout(900)  # 232-292 s measured for the pair at load 16-33 on 2 cores
def test_testbed_run_over_the_split_gives_atlas_the_speedup_of_one_server(rig, tmp_path):
    """The run above and the same run on this machine alone, one after the other:
    Atlas's speedup over baseline in the split run is within 15% of the one-server
    run's."""
    # one after the other: played at once on 2 cores, one run's atlas overlapped the other's
    # baseline or calibration and the two speedups came out 12-41% apart (CI, 2026-12-02)
    speedup = {}
    for name in ("split", "one"):
        v = _run_quickstart(rig, tmp_path, name, split=name == "split")
        speedup[name] = v["baseline"]["iteration_time_s"] / v["atlas"]["iteration_time_s"]
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\natlas speedup over baseline: split {speedup['split']:.2f}, one server {speedup['one']:.2f} "
          f"(load {load})")
    assert abs(speedup["split"] / speedup["one"] - 1) <= 0.15, speedup
