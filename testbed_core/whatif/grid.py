"""A what-if grid: GPUs x DCs x RTT x bandwidth, each point a topology and a workload.

The grid file (YAML, e.g. scenarios/whatif-scale.yaml) names a base workload, the
pipeline and tensor degrees that stay fixed, and the values of each axis. A point's
data-parallel degree is its GPU count over ``pp x tp``; its topology is ``dcs`` DCs
joined in a chain (dc1 - dc2 - ...), every link at the point's bandwidth and half its
RTT one way, sized as GPU counts (no hosts: prediction only). The pp stages are split
over the DCs as evenly as the count allows, the remainder to the first ones, so the
DCs differ in size by at most one stage, the largest first: the baseline's even
placement and Atlas's largest-first placement then both fit (and coincide), and the
variants differ in how they use the WAN. Errors name the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from testbed_core.configfile import ConfigError, format_validation_error, read_yaml_mapping
from testbed_core.topology import TcpSettings, Topology
from testbed_core.units import parse_duration, parse_rate, unit_validator
from testbed_core.variants import REGISTRY, VariantError, parse_variants
from testbed_core.workload import Workload, load_workload


class GridError(ConfigError):
    """A grid file that cannot be used; the message names the file, the field and the fix."""


Rate = Annotated[float, unit_validator(parse_rate), Field(gt=0)]
Duration = Annotated[float, unit_validator(parse_duration), Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Axes(_Model):
    gpus: list[int] = Field(min_length=1, description="total GPUs of a point")
    dcs: list[int] = Field(min_length=1, description="DCs the GPUs are spread over")
    rtt: list[Duration] = Field(min_length=1, description="round-trip time of every WAN link")
    bandwidth: list[Rate] = Field(min_length=1, description="rate of every WAN link")

    @model_validator(mode="after")
    def _positive(self) -> Axes:
        if min(self.gpus) < 1 or min(self.dcs) < 1:
            raise ValueError("gpus and dcs take counts of at least 1")
        return self


class Prefill(_Model):
    chunk_tokens: int = Field(512, ge=1, description="BubbleTea's chunk of a prompt")
    min_tokens: int = Field(32, ge=1, description="smallest chunk admitted")
    guard: float = Field(0.05, ge=0, description="margin, as a fraction of a chunk's predicted time")


class Grid(_Model):
    name: str  # the grid's name: it names the output folder (results/whatif-<name>-<time>/) and each point's topology
    description: str = ""  # free text: what the grid explores
    workload: str = Field(description="workload file, relative to the grid file")
    pp: int = Field(ge=1, description="pipeline stages, fixed over the grid")
    tp: int = Field(1, ge=1, description="tensor-parallel GPUs per stage, fixed over the grid")
    # variants predicted at every point (names from testbed_core/variants.py; default: all of them);
    # `testbed whatif --variants` replaces the list when given
    variants: list[str] = Field(default_factory=lambda: list(REGISTRY))
    streams: int = Field(8, ge=1, le=64)  # TCP streams per channel for the variants that use N streams (not one)
    # placement of the variants placed like the baseline: atlas, in-order, even or round-robin
    # (testbed_core/planning/placement.py)
    baseline_placement: str = "even"
    lan_rate: Rate = 400e9  # every DC's LAN rate at each point, bits per second (a number or text like 400Gbit)
    tcp: TcpSettings = TcpSettings()  # TCP settings of every point's topology (they cap one flow's rate to window/RTT)
    grid: Axes  # the axes: every combination of their values is one point
    prefill: Prefill = Prefill()  # BubbleTea's prefill settings for the capacity each point predicts

    @model_validator(mode="after")
    def _check(self) -> Grid:
        try:
            parse_variants(self.variants)
        except VariantError as exc:
            raise ValueError(f"variants: {exc}") from None
        if max(self.grid.dcs) > self.pp:
            raise ValueError(f"grid.dcs goes up to {max(self.grid.dcs)} DCs, more than pp={self.pp} stages: "
                             "every DC needs a stage")
        return self


class GridPoint(_Model):
    gpus: int
    dcs: int
    rtt_s: float
    bandwidth_bps: float

    @property
    def label(self) -> str:
        return (f"{self.gpus} GPUs, {self.dcs} DCs, {self.rtt_s * 1e3:g} ms RTT, "
                f"{self.bandwidth_bps / 1e9:g} Gbit/s")


def load_grid(path: str | Path) -> tuple[Grid, Workload]:
    """The grid file and its base workload; GridError names the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise GridError(f"{path}: no such grid file (shipped: scenarios/whatif-scale.yaml)")
    data = read_yaml_mapping(path, "what-if grid", GridError)
    try:
        grid = Grid.model_validate(data)
    except ValidationError as exc:
        raise GridError(format_validation_error(str(path), exc, "what-if grid")) from None
    wl_path = path.parent / grid.workload
    try:
        workload = load_workload(wl_path)
    except ConfigError as exc:
        raise GridError(f"{path}: workload: {exc}") from None
    if workload.model.layers < grid.pp * workload.parallelism.chunks:
        raise GridError(f"{path}: pp: {grid.pp} stages for a model of {workload.model.layers} layers")
    if workload.model.heads % grid.tp:
        raise GridError(f"{path}: tp: {grid.tp} does not divide the model's {workload.model.heads} heads")
    return grid, workload


def points(grid: Grid) -> list[GridPoint]:
    a = grid.grid
    return [GridPoint(gpus=g, dcs=d, rtt_s=r, bandwidth_bps=b)
            for g in a.gpus for d in a.dcs for r in a.rtt for b in a.bandwidth]


class PointError(ValueError):
    """A grid point that cannot be built (e.g. GPUs not a multiple of pp x tp)."""


def point_setup(grid: Grid, base: Workload, point: GridPoint) -> tuple[Topology, Workload]:
    """The topology and the workload of one point (see the module docstring)."""
    unit = grid.pp * grid.tp
    if point.gpus % unit:
        raise PointError(f"{point.gpus} GPUs is not a multiple of pp x tp = {unit}")
    dp = point.gpus // unit
    stages = [grid.pp // point.dcs + (1 if i < grid.pp % point.dcs else 0) for i in range(point.dcs)]
    names = [f"dc{i + 1}" for i in range(point.dcs)]
    dcs = [{"name": n, "gpus": s * dp * grid.tp, "lan_rate": grid.lan_rate} for n, s in zip(names, stages, strict=True)]
    wan = [{"between": [a, b], "rate": point.bandwidth_bps, "delay": point.rtt_s / 2}
           for a, b in zip(names, names[1:], strict=False)]
    try:
        topo = Topology.model_validate({"name": f"{grid.name}-{point.dcs}dc", "tcp": grid.tcp.model_dump(),
                                        "dcs": dcs, "wan": wan})
    except ValidationError as exc:
        raise PointError(f"topology: {format_validation_error('grid point', exc, 'topology')}") from None
    data = base.model_dump()
    data["parallelism"].update(dp=dp, pp=grid.pp, tp=grid.tp)
    try:
        workload = Workload.model_validate(data)
    except ValidationError as exc:
        raise PointError(format_validation_error("grid point", exc, "workload")) from None
    return topo, workload
