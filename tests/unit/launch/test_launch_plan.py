"""testbed.launch.plan: rank order, torchrun's environment, and every input refusal's message."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.launch.plan import (
    HostSlot,
    LaunchError,
    max_ranks,
    parse_env,
    parse_hosts,
    plan_ranks,
    rank_env,
    rank_label,
    resolve_command,
)

SLOTS = [HostSlot("dc1-h1", "dc1", "10.200.1.10", "tb123d0h1-eth0"),
         HostSlot("dc1-h2", "dc1", "10.200.1.11", "tb123d0h2-eth0"),
         HostSlot("dc2-h1", "dc2", "10.200.2.10", "tb123d1h1-eth0"),
         HostSlot("dc2-h2", "dc2", "10.200.2.11", "tb123d1h2-eth0")]


def test_default_is_one_rank_per_host_in_topology_order():
    plans = plan_ranks(SLOTS, None, 1)
    assert [(p.rank, p.host.name, p.local_rank, p.group_rank) for p in plans] == [
        (0, "dc1-h1", 0, 0), (1, "dc1-h2", 0, 1), (2, "dc2-h1", 0, 2), (3, "dc2-h2", 0, 3)]


def test_hosts_pick_and_order_and_nproc_per_host_numbers_like_torchrun():
    plans = plan_ranks(SLOTS, ["dc2-h1", "dc1-h1"], 2)
    assert [(p.rank, p.host.name, p.local_rank, p.local_world_size, p.group_rank) for p in plans] == [
        (0, "dc2-h1", 0, 2, 0), (1, "dc2-h1", 1, 2, 0), (2, "dc1-h1", 0, 2, 1), (3, "dc1-h1", 1, 2, 1)]
    assert rank_label(plans[2]) == "rank 2 dc1/dc1-h1"


def test_unknown_host_lists_the_valid_ones():
    with pytest.raises(LaunchError, match=r"--hosts: 'dc3-h1' is not a host of the topology "
                                          r"\(hosts: dc1-h1, dc1-h2, dc2-h1, dc2-h2\)"):
        plan_ranks(SLOTS, ["dc1-h1", "dc3-h1"], 1)


def test_duplicate_host_points_at_nproc_per_host():
    with pytest.raises(LaunchError, match="dc1-h1 is named twice.*--nproc-per-host"):
        plan_ranks(SLOTS, ["dc1-h1", "dc1-h1"], 1)


def test_empty_hosts_and_bad_nproc():
    with pytest.raises(LaunchError, match="--hosts is empty"):
        plan_ranks(SLOTS, [], 1)
    with pytest.raises(LaunchError, match="--nproc-per-host 0: give 1 or more"):
        plan_ranks(SLOTS, None, 0)


def test_too_many_ranks_names_the_limit_and_what_to_do():
    with pytest.raises(LaunchError) as exc:
        plan_ranks(SLOTS, None, 20, limit=64)
    msg = str(exc.value)
    assert "80 ranks (4 hosts x 20 per host)" in msg and "at most 64" in msg
    assert "--hosts" in msg and "--nproc-per-host" in msg


def test_max_ranks_rule():
    assert max_ranks(1 * 2**30) == 64  # the floor
    assert max_ranks(64 * 2**30) == 256  # memory / 256 MiB
    assert max_ranks() >= 64


def test_parse_hosts():
    assert parse_hosts(None) is None
    assert parse_hosts("dc1-h1, dc2-h1,") == ["dc1-h1", "dc2-h1"]


def test_parse_env():
    assert parse_env(["A=1", "B=x=y", "A=2", "C="]) == {"A": "2", "B": "x=y", "C": ""}
    with pytest.raises(LaunchError, match=r"--env 'BACKEND': give KEY=VALUE \(e.g. --env BACKEND=gloo\)"):
        parse_env(["BACKEND"])
    with pytest.raises(LaunchError, match="the KEY before '=' is empty"):
        parse_env(["=gloo"])
    with pytest.raises(LaunchError, match="spaces around it"):
        parse_env([" A=1"])


def test_rank_env_is_torchruns_plus_the_hosts_interface():
    plan = plan_ranks(SLOTS, None, 2)[5]  # dc2-h1, local rank 1
    env = rank_env({"PATH": "/bin", "OMP_NUM_THREADS": "4"}, plan, 8, "10.200.1.10", 29500, {"BACKEND": "gloo"},
                   "tb123-1")
    assert env["PATH"] == "/bin"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (
        "5", "8", "1", "2", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.200.1.10", "29500")
    assert (env["TESTBED_DC"], env["TESTBED_HOST"]) == ("dc2", "dc2-h1")
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "tb123d1h1-eth0"
    assert env["OMP_NUM_THREADS"] == "4"  # the caller's wins over the default
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["BACKEND"] == "gloo"
    assert rank_env({}, plan, 8, "a", 1, {"RANK": "99"})["RANK"] == "99"  # --env wins over everything
    assert rank_env({}, plan, 8, "a", 1, {})["OMP_NUM_THREADS"] == "1"


def test_rank_env_sets_atlas_site_to_the_dc_unless_given():
    plan = plan_ranks(SLOTS, None, 2)[5]  # dc2-h1
    assert rank_env({}, plan, 8, "a", 1, {})["ATLAS_SITE"] == "dc2"
    assert rank_env({"ATLAS_SITE": "mine"}, plan, 8, "a", 1, {})["ATLAS_SITE"] == "mine"  # the user's own value
    assert rank_env({}, plan, 8, "a", 1, {"ATLAS_SITE": "x"})["ATLAS_SITE"] == "x"  # --env wins


def test_resolve_command(tmp_path: Path):
    assert resolve_command(["sh", "-c", "true"], tmp_path).endswith("/sh")
    with pytest.raises(LaunchError, match="no command to launch: put it after `--`"):
        resolve_command([], tmp_path)
    with pytest.raises(LaunchError, match="command not found: no-such-prog-xyz \\(not on PATH"):
        resolve_command(["no-such-prog-xyz"], tmp_path)
    with pytest.raises(LaunchError, match="command not found: ./missing.py \\(no such file, looked in"):
        resolve_command(["./missing.py"], tmp_path)
    script = tmp_path / "prog.py"
    script.write_text("print(1)\n")
    with pytest.raises(LaunchError, match="not an executable file; run it through its interpreter, e.g. -- python"):
        resolve_command(["./prog.py"], tmp_path)
    script.chmod(0o755)
    assert resolve_command(["./prog.py"], tmp_path) == str(tmp_path / "prog.py")
