"""Programs written as outside users write them (tests/programs/: DDP, FSDP2, 2-D FSDP x
tensor parallel, pipelining, DTensor + MoE all_to_all, DDP + ZeRO + Join), not from examples/, each run with
``testbed launch`` on topologies/2dc.yaml and topologies/1dc-lan.yaml with gloo and with
atlas (plain env://, ``import atlas_transport.torch`` when BACKEND=atlas). Each must give
the parameters its own one-process ``--reference`` gives, within 2e-5 relative
(tests/programs/compare.py: max|got - want| / max|want| per tensor, and elementwise).

Long: 4 ranks import torch per launch, 2dc has a 50 ms RTT. Run one cell under the lock:
    flock /tmp/emulation.lock .venv/bin/pytest -q -p no:xdist tests/root/test_heldback_programs.py \\
        -k "ddp_cnn and 2dc and atlas"      # TESTBED_LONG_TESTS=1
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed_core.constants import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.long]

PROGRAMS_DIR = REPO_ROOT / "tests" / "programs"
sys.path.insert(0, str(PROGRAMS_DIR))
from compare import compare  # noqa: E402

TESTBED = [sys.executable, "-m", "testbed.cli"]
HAS_ATLAS = importlib.util.find_spec("atlas_transport.torch") is not None
RTOL = 2e-5

# name -> (file, program args, hosts per topology or None for all four, reference args)
CASES = {
    "ddp_cnn": ("ddp_cnn.py", [], None, ["--world", "4"]),
    "fsdp2_blocks": ("fsdp2_blocks.py", [], None, ["--world", "4"]),
    "tp_fsdp_2d": ("tp_fsdp_2d.py", [], None, ["--world", "4"]),
    "pipe_1f1b_4": ("pipe_sched.py", ["--schedule", "1f1b", "--microbatches", "8"], None,
                    ["--microbatches", "8"]),
    "pipe_gpipe_trace_2": ("pipe_sched.py", ["--schedule", "gpipe", "--split", "trace"],
                           {"2dc": "dc1-h1,dc2-h1", "1dc-lan": "dc1-h1,dc1-h2"}, []),
    "dtensor_moe": ("dtensor_moe.py", [], None, ["--world", "4"]),
    "ddp_zero_join": ("ddp_zero_join.py", [], None, ["--world", "4"]),
}
TOPOLOGIES = ["2dc", "1dc-lan"]
BACKENDS = ["gloo", "atlas"]
_REFERENCES: dict[str, dict] = {}


def reference(name: str, tmp: Path) -> dict:
    import torch

    if name not in _REFERENCES:
        file, args, _, ref_args = CASES[name]
        out = tmp / f"ref-{name}.pt"
        subprocess.run([sys.executable, str(PROGRAMS_DIR / file), "--reference", *args, *ref_args,
                        "--out", str(out)], check=True, capture_output=True, text=True, timeout=300)
        _REFERENCES[name] = torch.load(out)
    return _REFERENCES[name]


def launch(name: str, topology: str, backend: str, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    file, args, hosts, _ = CASES[name]
    params = tmp / f"{name}-{topology}-{backend}.pt"
    cmd = [*TESTBED, "launch", str(REPO_ROOT / "topologies" / f"{topology}.yaml"), "--env", f"BACKEND={backend}",
           "--timeout", "400", "--out", str(tmp / f"launch-{name}-{topology}-{backend}"), "-q"]
    if hosts:
        cmd += ["--hosts", hosts[topology]]
    cmd += ["--", sys.executable, str(PROGRAMS_DIR / file), *args, "--out", str(params)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=560)
    return done, params


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("name", list(CASES))
def test_program_under_launch_equals_one_process(name: str, topology: str, backend: str,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    import torch

    if backend == "atlas" and not HAS_ATLAS:
        pytest.skip("atlas_transport.torch is not installed")
    tmp = tmp_path_factory.mktemp("heldback")
    want = reference(name, tmp_path_factory.getbasetemp())
    done, params = launch(name, topology, backend, tmp)
    assert done.returncode == 0, (f"{name} on {topology} with {backend}: launch exited {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    res = compare(torch.load(params), want, RTOL)
    print(json.dumps({"program": name, "topology": topology, "backend": backend, **res}))
    assert res["ok"], f"{name} on {topology} with {backend}: {res}"
