"""The example programs (examples/) under a local multi-process run on 127.0.0.1 equal
their one-process ``--reference``: the same loss at every step and the same final
parameters, within 1e-5; with gloo, and with atlas once atlas_transport.torch exists.

`make test` runs each example once, the backends alternating so that both are covered
(gloo and atlas each carry a pipeline schedule, one of ddp and hybrid, and one of fsdp2
and moe, 2 ranks each); the other combinations of the matrix (the 2-D mesh's 4 ranks
among them) are marked ``long`` (make test-long)."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest
import torch
import zygote  # tests/zygote.py: programs forked from a process that imported torch once

from testbed_core.constants import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
TOL = 1e-5
HAS_ATLAS = importlib.util.find_spec("atlas_transport.torch") is not None
NO_ATLAS = pytest.mark.skipif(
    not HAS_ATLAS, reason="atlas_transport.torch (the torch.distributed backend) is not in this checkout yet")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def run_local(script: str, world: int, args: list[str], backend: str, child_env: dict[str, str],
              timeout: float = 240) -> list[list[dict]]:
    """`world` processes of the example with torchrun's environment on 127.0.0.1; each
    rank's JSON lines."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(child_env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   BACKEND=backend, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(zygote.popen([str(EXAMPLES / script), *args], env))
    outs = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{err[-3000:]}"
            outs.append(json_lines(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def run_reference(script: str, args: list[str], child_env: dict[str, str]) -> list[dict]:
    proc = zygote.popen([str(EXAMPLES / script), "--reference", *args], child_env)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"the reference exited {proc.returncode}:\n{err[-3000:]}"
    return json_lines(out)


def run_alone(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`python argv...` with `env` (forked from the zygote: the refusals below are the
    program's own, torch imported or not): its exit status and stderr."""
    proc = zygote.popen([str(a) for a in argv], env)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err  # type: ignore[return-value]


def losses(lines: list[dict]) -> dict[int, float]:
    return {d["step"]: d["loss"] for d in lines if "loss" in d}


def compare_params(ranks: int, save: Path) -> None:
    ref = torch.load(save / "reference.pt")
    seen: set[str] = set()
    for k in range(ranks):
        mine = torch.load(save / f"rank-{k}.pt")
        for name, tensor in mine.items():
            assert name in ref, f"rank {k}: parameter {name} not in the reference ({sorted(ref)})"
            diff = (tensor - ref[name]).abs().max().item()
            assert diff <= TOL, f"rank {k}: {name} differs from the reference by {diff:g}"
            seen.add(name)
    assert seen == set(ref), f"parameters no rank holds: {sorted(set(ref) - seen)}"


CASES = {
    "pipeline-gpipe": ("pipeline.py", 2, ["--schedule", "gpipe", "--rows", "512", "--hidden", "16"],
                       ["--stages", "2"]),
    "pipeline-1f1b": ("pipeline.py", 2, ["--schedule", "1f1b", "--rows", "512", "--hidden", "16",
                                         "--layers-per-stage", "2"], ["--stages", "2"]),
    "ddp": ("ddp.py", 2, ["--batch", "64", "--hidden", "128"], ["--world", "2"]),
    "hybrid": ("hybrid.py", 4, ["--rows", "128", "--hidden", "16"], ["--world", "4"]),
    "fsdp2": ("fsdp2.py", 2, ["--batch", "16", "--dim", "32", "--hidden", "64", "--blocks", "2"], ["--world", "2"]),
    "mesh2d": ("mesh2d.py", 4, ["--tp", "2", "--batch", "16", "--dim", "32", "--hidden", "64", "--blocks", "2"],
               ["--world", "4"]),
    "moe": ("moe.py", 2, ["--tokens", "32", "--dim", "16", "--hidden", "32"], ["--world", "2"]),
    "moe-c10d": ("moe.py", 3, ["--tokens", "32", "--dim", "16", "--hidden", "32", "--a2a", "c10d", "--top-k", "1",
                               "--experts-per-rank", "1"], ["--world", "3"]),
}


# (case, backend) in make test; the rest of the matrix under `long`
DEFAULT = {("pipeline-gpipe", "gloo"), ("pipeline-1f1b", "atlas"), ("ddp", "atlas"), ("hybrid", "gloo"),
           ("fsdp2", "atlas"), ("moe", "gloo")}
MATRIX = [pytest.param(case, backend, id=f"{case}-{backend}",
                       marks=[*([NO_ATLAS] if backend == "atlas" else []),
                              *([] if (case, backend) in DEFAULT else [pytest.mark.long])])
          for case in CASES for backend in ("gloo", "atlas")]


@pytest.mark.slow
@pytest.mark.spread
@pytest.mark.parametrize(("case", "backend"), MATRIX)
def test_example_equals_reference(case: str, backend: str, child_env: dict[str, str], tmp_path: Path) -> None:
    script, world, args, ref_args = CASES[case]
    common = [*args, "--steps", "3", "--seed", "7"]
    ranks = run_local(script, world, [*common, "--save", str(tmp_path)], backend, child_env)
    ref = run_reference(script, [*common, *ref_args, "--save", str(tmp_path)], child_env)
    got: dict[int, float] = {}
    for lines in ranks:
        got.update(losses(lines))
    want = losses(ref)
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for step, value in want.items():
        assert abs(got[step] - value) <= TOL, f"step {step}: loss {got[step]} vs the reference's {value}"
    steps0 = [d for d in ranks[0] if "step" in d]
    assert [d["step"] for d in steps0] == [0, 1, 2] and all(d["step_s"] > 0 for d in steps0)
    assert all(any(d.get("final") for d in lines) for lines in ranks), "a rank printed no final digest"
    compare_params(world, tmp_path)


def test_unknown_backend_is_refused(child_env: dict[str, str]) -> None:
    env = dict(child_env, BACKEND="nccl2", RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    rc, err = run_alone([EXAMPLES / "ddp.py"], env)
    assert rc != 0
    assert "BACKEND='nccl2': unknown backend; use one of gloo, atlas" in err


def test_missing_environment_says_how_to_start(child_env: dict[str, str]) -> None:
    env = {k: v for k, v in child_env.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    rc, err = run_alone([EXAMPLES / "pipeline.py"], env)
    assert rc != 0
    assert "missing RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT" in err
    assert "testbed launch" in err


def test_bad_size_flag_is_refused(child_env: dict[str, str]) -> None:
    rc, err = run_alone([EXAMPLES / "pipeline.py", "--reference", "--steps", "0"], child_env)
    assert rc == 2
    assert "--steps must be at least 1, got 0" in err


@pytest.mark.parametrize(("script", "args", "message"), [
    ("mesh2d.py", ["--world", "3", "--tp", "2"], "--world 3 is not a multiple of --tp 2"),
    ("mesh2d.py", ["--hidden", "30", "--tp", "4"], "--hidden 30 is not a multiple of --tp 4"),
    ("moe.py", ["--top-k", "0"], "--top-k must be at least 1, got 0"),
    ("moe.py", ["--top-k", "5", "--world", "2"], "--top-k 5 is more than the 4 experts (--experts-per-rank 2 x --world 2)"),
])
def test_bad_mesh_or_moe_flag_is_refused(script: str, args: list[str], message: str,
                                         child_env: dict[str, str]) -> None:
    rc, err = run_alone([EXAMPLES / script, "--reference", *args], child_env)
    assert rc == 2
    assert message in err
