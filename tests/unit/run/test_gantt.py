"""The Gantt chart labels each iteration while they fit; a soak's hundred get every k-th."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.gantt import MAX_ITERATION_LABELS, gantt_png
from testbed_core.device_records import WorkRecord


def _labels(tmp_path: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from matplotlib.axes import Axes

    said: list[str] = []
    real = Axes.text

    def text(self, x, y, s, *a, **kw):  # noqa: ANN001, ANN202
        if str(s).startswith("iteration "):
            said.append(str(s))
        return real(self, x, y, s, *a, **kw)

    monkeypatch.setattr(Axes, "text", text)
    recs = [WorkRecord("d", "forward", "t", f"F{i}", float(i), float(i), i + 0.5, "modelled") for i in range(n)]
    gantt_png({"d": recs}, [], [float(i) for i in range(n)], [i + 0.9 for i in range(n)], 0, tmp_path / "g.png")
    return said


def test_few_iterations_each_get_a_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _labels(tmp_path, 5, monkeypatch) == [f"iteration {i}: 0.900 s" for i in range(5)]


def test_a_soak_labels_every_kth_iteration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = _labels(tmp_path, 100, monkeypatch)
    assert 0 < len(said) <= MAX_ITERATION_LABELS and said[0].startswith("iteration 0:")
