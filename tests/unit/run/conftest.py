"""Fixtures the calibration tests share."""

from __future__ import annotations

import pytest


class _NoAgents:
    """Probe agents that start nothing: the probes themselves are faked or recorded."""

    def __init__(self, *a, **k) -> None:
        pass

    def start(self, hosts) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def no_probe_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    """testbed.run.calibration without probe agents (`calibrate_variants` starts them)."""
    import testbed.run.calibration as calibration

    monkeypatch.setattr(calibration, "ProbeAgents", _NoAgents)
