"""The package structure holds: the import-linter contracts in pyproject.toml (layers,
the transport as a leaf, BubbleTea on the core and transport only, no I/O in the core's
models, no cycles between sibling subpackages) are all kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
