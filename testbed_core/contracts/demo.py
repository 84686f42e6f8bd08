"""``demo.json``: what `testbed demo` showed (the table's rows) and what it ran (its
settings, the notes of the parts that did not run), as one typed document.

testbed/demo/files.py writes it and reads it back (`load_rows` rebuilds the table from
the demo folder with the notes kept here). Every key is written only when it was
given: a demo that failed before its run has no ``delay_backend``.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, JsonValue

from testbed_core.contracts.document import Document

__all__ = ["DemoBench", "DemoDoc", "DemoMeta", "DemoRowRecord"]


class _Part(Document):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DemoBench(_Part):
    """``meta.bench``: the transport bench's settings."""

    size_bytes: int
    streams: list[int]
    repeat: int
    iperf_seconds: float
    skipped: bool


class DemoMeta(_Part):
    """``meta``: what the demo ran and on what; each key written only when set."""

    scenario: str | None = None
    overrides: dict[str, JsonValue] = Field(default_factory=dict, description="the scenario's --set overrides")
    variants: list[str] = Field(default_factory=list)
    topology: str | None = None
    link_mbps: float | None = Field(None, description="the WAN link's nominal rate")
    rtt_ms: float | None = None
    streams: int = 8
    bench: DemoBench | None = None
    host: str | None = None
    started: str | None = Field(None, description="local time, ISO 8601")
    notes: dict[str, str] = Field(default_factory=dict, description="per part (transport, training, bubbletea): "
                                                                    "why it shows n/a")
    delay_backend: str | None = None
    duration_s: float | None = None
    failed: list[str] = Field(default_factory=list, description="the parts that failed")


DemoMeta.ABSENT_UNLESS_SET = frozenset(DemoMeta.model_fields)  # every key: only what was given


class DemoRowRecord(_Part):
    """One row of the demo table (``rows[]``), as shown."""

    result: str
    measure: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""
    shown: str
    verdict: str


class DemoDoc(_Part):
    """The whole ``demo.json``."""

    rows: list[DemoRowRecord] = Field(default_factory=list)
    meta: DemoMeta = Field(default_factory=DemoMeta)
