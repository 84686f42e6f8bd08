"""``transport-calibration.json``: what the atlas transport itself costs per transfer on
the machine a program was profiled on, measured before any prediction (never fitted
to a launch being predicted), and the checks that it fits the profile it goes with.

Why: the program's predictor (testbed_core/program/predict.py) gives a transfer what
the network gives it: the link's rate, the window per round trip, the one-way delay.
atlas's transport is Python around the sockets; on a short round trip, where neither
the window nor the link holds a striped channel back, its own CPU can: at 10 ms on
topologies/2dc.yaml a 16 MiB burst of the pipeline example moved at about 90 MB/s
against the link's 119 (results/program-predict/README.md), which the network model
cannot show and a profile at 50 ms (window-bound) does not reveal. The measure
(testbed/launch/transport_calibration.py: two ranks of the atlas backend on
127.0.0.1) times transfers of a ladder of sizes per pattern; each pattern is fitted
to ``overhead + bytes / rate`` (`fit_calibration`), and the predictor gives no
transfer of that pattern less time than that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.program.profile import ProfileError, ProgramProfile

CALIBRATION_FILE = "transport-calibration.json"
CALIBRATION_FORMAT = 1
Pattern = Literal["send", "exchange"]
PATTERNS: tuple[Pattern, ...] = ("send", "exchange")
# backends whose transfers the calibration covers (gloo's C++ transport moves 0.5-4 MiB at the link's
# rate here: the kept gloo predictions at 10 ms are within 5.2% without it)
CALIBRATED_BACKENDS = frozenset({"atlas"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CalibrationPoint(_Model):
    """One pattern and size as measured: the median over the repeats."""

    pattern: Pattern = Field(description="'send': a blocking send to the other rank, done at its confirmation; "
                                         "'exchange': an all-reduce between two sites (each sends and receives)")
    bytes: int = Field(gt=0, description="the tensor's bytes")
    median_s: float = Field(gt=0, description="the median seconds per transfer")
    samples_s: list[float] = Field(default_factory=list, description="every timed repeat")


class PatternCost(_Model):
    """A pattern's fitted cost: ``overhead_s + bytes / rate_Bps`` per transfer."""

    pattern: Pattern = Field(description="the pattern fitted ('send' or 'exchange', as in its points)")
    overhead_s: float = Field(ge=0, description="seconds per transfer beyond its bytes (the fit's intercept, >= 0)")
    rate_Bps: float = Field(gt=0, description="bytes per second the transport moves (the fit's slope's inverse)")

    def seconds(self, nbytes: float) -> float:
        return self.overhead_s + nbytes / self.rate_Bps


class TransportCalibration(_Model):
    """``transport-calibration.json``: the atlas transport's cost per transfer on this machine."""

    format: Literal[1] = Field(CALIBRATION_FORMAT, description="this file's format version")
    backend: Literal["atlas"] = Field("atlas", description="the backend measured")
    streams: int = Field(gt=0, description="TCP streams per pair during the measure (the WAN's count)")
    fingerprint: str = Field(description="sha256 over atlas_transport's source files when measured: a calibration of "
                                         "another version of the transport is refused")
    measured_utc: str = Field(description="when the measure started")
    load_average: float = Field(description="the machine's 1-minute load average then")
    took_s: float = Field(0.0, description="the measure's wall time")
    points: list[CalibrationPoint] = Field(description="every pattern and size measured")
    costs: list[PatternCost] = Field(description="each pattern's fit")

    def cost(self, pattern: Pattern) -> PatternCost:
        for c in self.costs:
            if c.pattern == pattern:
                return c
        raise ProfileError(f"the transport calibration has no '{pattern}' cost (it has "
                           f"{', '.join(c.pattern for c in self.costs) or 'none'}); measure it again")


def fit_pattern(points: list[CalibrationPoint], pattern: Pattern) -> PatternCost:
    """Least squares of median seconds on bytes over a pattern's points: the slope's
    inverse is the rate, the intercept (at least 0) the per-transfer overhead; one point,
    or a fit whose slope is not positive, gives the rate through the origin of the largest."""
    pts = sorted((p for p in points if p.pattern == pattern), key=lambda p: p.bytes)
    if not pts:
        raise ValueError(f"no '{pattern}' points to fit")
    n = len(pts)
    mx = sum(p.bytes for p in pts) / n
    my = sum(p.median_s for p in pts) / n
    sxx = sum((p.bytes - mx) ** 2 for p in pts)
    slope = sum((p.bytes - mx) * (p.median_s - my) for p in pts) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return PatternCost(pattern=pattern, overhead_s=0.0, rate_Bps=pts[-1].bytes / pts[-1].median_s)
    intercept = my - slope * mx
    if intercept < 0:  # no negative overhead: the line through the origin instead
        slope = sum(p.bytes * p.median_s for p in pts) / sum(p.bytes ** 2 for p in pts)
        intercept = 0.0
    return PatternCost(pattern=pattern, overhead_s=intercept, rate_Bps=1 / slope)


def fit_calibration(points: list[CalibrationPoint], *, streams: int, measured_utc: str, load_average: float,
                    fingerprint: str, took_s: float = 0.0) -> TransportCalibration:
    costs = [fit_pattern(points, p) for p in PATTERNS if any(x.pattern == p for x in points)]
    return TransportCalibration(streams=streams, fingerprint=fingerprint, measured_utc=measured_utc,
                                load_average=load_average, took_s=took_s, points=points, costs=costs)


def needs_calibration(profile: ProgramProfile) -> bool:
    """Whether the profile has a calibrated backend's group spanning DCs (its transfers cross a WAN)."""
    dc_of = {r.rank: r.dc for r in profile.ranks}
    for r in profile.ranks:
        for g in r.groups:
            if g.backend in CALIBRATED_BACKENDS and len({dc_of.get(m) for m in (g.ranks or dc_of)} - {None}) > 1:
                return True
    return False


def read_calibration(directory: Path, profile: ProgramProfile) -> TransportCalibration | None:
    """The calibration in the profile's folder (None where there is none), checked
    against the profile: its format, and the transport version both were made with
    (where the profile names it)."""
    path = Path(directory)
    path = path / CALIBRATION_FILE if path.is_dir() else path.parent / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ProfileError(f"{path}: not JSON ({exc}); measure it again: testbed whatif --program "
                           f"{path.parent} --transport-cost measure") from None
    if isinstance(data, dict) and data.get("format") != CALIBRATION_FORMAT:
        raise ProfileError(f"{path}: format {data.get('format')!r}, this version reads format {CALIBRATION_FORMAT}; "
                           f"measure it again: testbed whatif --program {path.parent} --transport-cost measure")
    try:
        cal = TransportCalibration.model_validate(data)
    except ValueError as exc:
        raise ProfileError(f"{path}: not a transport calibration this version reads ({str(exc).splitlines()[0]}); "
                           f"measure it again: testbed whatif --program {path.parent} --transport-cost measure") from None
    if profile.transport_fingerprint and cal.fingerprint != profile.transport_fingerprint:
        raise ProfileError(f"{path}: measured on another version of atlas_transport than the profiled program ran "
                           f"with (sources sha256 {cal.fingerprint[:12]} there, {profile.transport_fingerprint[:12]} "
                           "in profile.json): its cost is not the program's; measure it again with this version: "
                           f"testbed whatif --program {path.parent} --transport-cost measure")
    return cal
