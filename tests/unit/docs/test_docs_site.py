"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor, a
page missing from the navigation, a failed include or reference fails it), offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may carry !!python/name tags; this test reads only plain keys."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def test_site_is_built_offline():
    config = _config()
    assert config["theme"]["name"] == "material"
    assert config["theme"].get("font") is False, "theme.font must be false: no web fonts fetched at build time"
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])]
    for fetching in ("social", "privacy", "optimize"):
        assert not any(p.endswith(fetching) for p in plugins), f"plugin {fetching} downloads at build time"
    assert config.get("strict") is True


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{out[-4000:]}"
    assert "WARNING" not in out, out[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "results/paper.html", "reference/cli.html", "reference/api.html",
                 "reference/formats/scenario.html"):
        assert (site / page).is_file(), f"{page} not built"
    cli = (site / "reference" / "cli.html").read_text()
    assert "testbed run" in cli and "--set" in cli, "the CLI reference did not come from the click commands"
    api = (site / "reference" / "api.html").read_text()
    assert "TransportConfig" in api and "streams" in api, "the Python API did not come from the docstrings"
    atlas = (site / "atlas.html").read_text()
    assert "Wire protocol" in atlas, "atlas_transport/README.md was not included"
    paper = (site / "results" / "sweep-paper.html").read_text()
    assert 'src="../repo/results/sweep-paper/atlas_speedup.png"' in paper
    assert (site / "repo" / "results" / "sweep-paper" / "atlas_speedup.png").is_file()
