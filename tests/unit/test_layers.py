"""The package structure holds: the import-linter contracts in pyproject.toml (layers,
the testbed run in data-flow order, the transport as a leaf, BubbleTea on the core, the
runtime and the transport only, training without BubbleTea, the runtime alone, the core
pure, no cycles between sibling subpackages) are all kept, and the ones the structure
rests on are there."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports is not installed: pip install -e '.[dev]' (import-linter is in the dev extras)"
    return exe


def test_every_import_contract_is_kept() -> None:
    proc = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout


def test_a_broken_layer_is_caught(tmp_path: Path) -> None:
    """The contract is not vacuous: a core module importing the run layer breaks it."""
    cfg = tmp_path / "contract.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_packages = ["testbed", "testbed_core"]\n'
        '[[tool.importlinter.contracts]]\nname = "run above core"\ntype = "layers"\n'
        'layers = ["testbed_core", "testbed.run"]\n'
    )
    proc = subprocess.run([_lint_imports(), "--no-cache", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout


def _forbidden() -> dict[str, set[str]]:
    """Each forbidden contract of pyproject.toml: its source module -> what it may not import."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    out: dict[str, set[str]] = {}
    for c in contracts:
        if c["type"] == "forbidden":
            for source in c["source_modules"]:
                out.setdefault(source, set()).update(c["forbidden_modules"])
    return out


def test_the_runtime_layer_contracts_are_declared() -> None:
    """Training meets BubbleTea only through the runtime, the runtime stands alone and the
    core stays pure: removing one of these contracts fails here, not silently."""
    forbidden = _forbidden()
    assert "bubbletea_agent" in forbidden.get("testbed.training", set())
    assert {"testbed", "bubbletea_agent"} <= forbidden.get("testbed_runtime", set())
    assert "testbed_runtime" in forbidden.get("testbed_core", set())
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers" and "testbed_runtime" in c["layers"])
    assert layers.index("testbed_runtime") == layers.index("testbed_core | atlas_transport") - 1  # just above the core
