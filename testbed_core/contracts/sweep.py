"""The files a `testbed sweep` writes and `testbed report` reads back: ``sweep.json``
(the plan), ``<point>/point.json`` (one point's run record) and ``kept.json`` (where
kept results came from, `testbed report --keep`).

Writer and readers go through these models (testbed/sweep.py writes the first two,
testbed/report/loading.py reads them, testbed/report/keep.py writes kept.json), so a
key renamed on one side fails validation on the other instead of turning into a
missing column. The files are written with ``json.dumps(model.to_data(), indent=2)``:
the text stays what it was before the models (ASCII, two-space indentation).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.contracts.document import Document

__all__ = ["GitState", "KeptRecord", "PointRecord", "PointStatus", "SweepParameter", "SweepPointRef", "SweepRecord"]

PointStatus = Literal["running", "ok", "failed", "interrupted"]
"""A point's state in its point.json: running (or killed before it could say), ok,
failed (``error`` says why), interrupted (Ctrl-C or the sweep stopped)."""


class _Record(Document):
    """A sweep file: unknown keys are refused (a renamed key is a bug in the writer or a
    reader), and the keys named in ``ABSENT_UNLESS_SET`` are written only when given."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_data(self) -> Any:
        """The JSON value written to the file (its keys as the file spells them)."""
        return self.model_dump(mode="json", by_alias=True)


class PointRecord(_Record):
    """``point.json``: one point of a sweep, rewritten as it starts and ends."""

    ABSENT_UNLESS_SET = frozenset({"started_at", "pid"})

    id: str = Field(description="the point's folder name, e.g. p003-delay=50ms")
    index: int = Field(description="its place in the sweep, from 1")
    parameters: dict[str, Any] = Field(description="swept field (dotted path) -> value as written in the sweep file")
    seed: int  # the point's seed (one per repeat)
    status: PointStatus  # running, ok, failed or interrupted
    error: str | None = None  # failed: the error's first line (traceback.txt has the rest)
    started_at: str | None = Field(None, description="UTC, ISO 8601; absent when the sweep recorded a point "
                                                     "whose own process never started its record")
    finished_at: str | None = None  # UTC, ISO 8601 (None: not finished)
    duration_s: float | None = None  # the point's wall time, seconds
    attempts: int = Field(1, ge=1, description="runs of this point so far (a rerun counts on)")
    config_hash: str = Field(description="hash of the resolved scenario: a finished point with the same hash "
                                         "is not run again")
    pid: int | None = Field(None, description="the process that ran it")


class SweepParameter(BaseModel):
    """One swept field of ``sweep.json``."""

    model_config = ConfigDict(extra="forbid")

    path: str  # the swept field's dotted path in the resolved scenario
    label: str  # its short name in point ids and tables
    values: list[Any]  # its values, as written in the sweep file


class SweepPointRef(BaseModel):
    """A point as ``sweep.json`` lists it (its folder holds the rest)."""

    model_config = ConfigDict(extra="forbid")

    id: str  # the point's folder name
    parameters: dict[str, Any]  # swept field (dotted path) -> value
    seed: int  # the point's seed


class SweepRecord(_Record):
    """``sweep.json``: what a sweep ran, enough for `testbed report` to rebuild everything."""

    name: str  # the sweep's name
    description: str = ""  # the sweep file's description
    sweep_file: str  # the sweep file it was run from
    base: str = Field(description="the base scenario file")
    mode: Literal["grid", "zip"]  # grid: every combination; zip: the values side by side
    repeat: int | list[int]  # seeds per point (a count, or the seeds)
    parameters: list[SweepParameter]  # the swept fields and their values
    fixed: dict[str, Any] = Field(alias="set", description="the sweep file's fixed overrides")
    cli_set: dict[str, Any] = Field(default_factory=dict, description="--set overrides")
    points: list[SweepPointRef]  # every point of the sweep
    updated_at: str | None = None  # when this file was last written (UTC, ISO 8601)


class GitState(BaseModel):
    """The toolkit checkout's commit and dirtiness (null outside a git tree)."""

    model_config = ConfigDict(extra="forbid")

    commit: str | None  # the checkout's commit (None: not a git checkout)
    dirty: bool | None  # the working tree had uncommitted changes


class KeptRecord(_Record):
    """``kept.json``: where kept sweep results came from, when, and every kept file's size."""

    kept_at: str  # when they were kept (UTC, ISO 8601)
    source: str = Field(description="the sweep folder they were copied from")
    sweep: str  # the sweep's name
    git: GitState  # the checkout's git state when they were kept
    points: dict[str, str] = Field(description="point id -> its status")
    rebuild: str = Field(description="the command that rebuilds the table and plots")
    files: dict[str, int] = Field(description="kept file (relative) -> bytes")
