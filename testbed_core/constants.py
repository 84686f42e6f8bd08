"""Constants shared across the layers: where the source tree and its shipped files lie."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout (or installed tree) that holds the packages and the shipped files."""

TOPOLOGIES_DIR = REPO_ROOT / "topologies"
SCENARIOS_DIR = REPO_ROOT / "scenarios"
WORKLOADS_DIR = SCENARIOS_DIR / "workloads"
