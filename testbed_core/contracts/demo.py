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

    size_bytes: int  # bytes per timed transfer
    streams: list[int]  # the atlas stream counts measured
    repeat: int  # timed transfers per measurement (the median is shown)
    iperf_seconds: float  # seconds of each iperf3 test
    skipped: bool  # the bench was left out (--skip-bench)


class DemoMeta(_Part):
    """``meta``: what the demo ran and on what; each key written only when set."""

    scenario: str | None = None  # the scenario the demo ran
    overrides: dict[str, JsonValue] = Field(default_factory=dict, description="the scenario's --set overrides")
    variants: list[str] = Field(default_factory=list)  # the variants it ran
    topology: str | None = None  # the topology's name
    link_mbps: float | None = Field(None, description="the WAN link's nominal rate")
    rtt_ms: float | None = None  # the WAN round-trip time, ms
    streams: int = 8  # atlas's streams per channel
    bench: DemoBench | None = None  # the transport bench's settings
    host: str | None = None  # the machine's host name
    started: str | None = Field(None, description="local time, ISO 8601")
    notes: dict[str, str] = Field(default_factory=dict, description="per part (transport, training, bubbletea): "
                                                                    "why it shows n/a")
    delay_backend: str | None = None  # the delay backend of the WAN link (netem or relay)
    duration_s: float | None = None  # the demo's wall time, seconds
    failed: list[str] = Field(default_factory=list, description="the parts that failed")


DemoMeta.ABSENT_UNLESS_SET = frozenset(DemoMeta.model_fields)  # every key: only what was given


class DemoRowRecord(_Part):
    """One row of the demo table (``rows[]``), as shown."""

    result: str  # which of the three results the row belongs to
    measure: str  # what the row measures
    value: float | None  # the figure (None: not measured)
    unit: str  # its unit
    target: str = ""  # what the mission asks of it
    ok: bool | None = None  # whether it met the target (None: no target, or not measured)
    note: str = ""  # why it shows n/a, or a caveat
    shown: str  # the figure as the table shows it
    verdict: str  # the table's verdict: ok, MISS, or empty (no target)


class DemoDoc(_Part):
    """The whole ``demo.json``."""

    rows: list[DemoRowRecord] = Field(default_factory=list)  # the table's rows, in order
    meta: DemoMeta = Field(default_factory=DemoMeta)  # what the demo ran and on what
