"""The variant registry: every way of running the same training that the testbed compares.

Each variant is defined once here, with what makes it what it is: where its stages go
(placement), how many TCP streams each WAN channel gets (stream policy), how channels
crossing one WAN link use it (sharing), and how it is drawn (colour, report order).
Scenario validation, the CLI's help, the planner, the run and the report all derive
from this table, so a new variant is one entry here plus whatever is new about it.

A run of a variant with BubbleTea agents beside the workers is a `RunVariant` whose
``bubbletea`` field is true; its display name (the key in ``summary.json``) is the
variant's name plus ``+bubbletea``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

StreamPolicy = Literal["one", "configured", "fill-link"]
"""``one``: a single TCP stream per channel (plain TCP); ``configured``: the scenario's
``transport.streams`` (or the calibrated best for ``auto``); ``fill-link``: at least
enough streams to fill the link (Atlas: giving the link to one transfer at a time only
pays if that transfer can use all of it)."""

SharingPolicy = Literal["shared", "auto"]
"""``shared``: all pipelines send when ready and share the link; ``auto``: Atlas's
temporal plan, kept where it is predicted to pay (``runner.atlas_sharing``)."""

CommPolicy = Literal["atlas", "gloo"]
"""``atlas``: every tensor over atlas_transport channels; ``gloo``: torch.distributed with
the gloo backend (one TCP connection per pair of ranks, ``dist.all_reduce`` for DP)."""

SchedulePolicy = Literal["configured", "auto"]
"""``configured``: the workload's pipeline schedule; ``auto``: Atlas's scheduling, the
schedule predicted fastest among those the devices can hold (``runner.atlas_schedule``,
testbed_core/planning/schedule.py)."""

PlacementPolicy = Literal["atlas", "baseline", "dp-across"]
"""``atlas``: the DC-selection heuristic; ``baseline``: the scenario's
``runner.baseline_placement`` (even by default); ``dp-across``: each DP replica in another
DC (plain DDP across regions)."""

BUBBLETEA_SUFFIX = "+bubbletea"
DISPATCH_TWINS = ("controller", "shards", "naive")
"""``bubbletea.compare_dispatch``: a +bubbletea run may have twins that dispatch prefill
otherwise, named ``<variant>+bubbletea-<mode>`` (testbed_core/contracts/prefill_service.py)."""


class VariantError(ValueError):
    """An unknown variant name; the message lists the known ones."""


@dataclass(frozen=True)
class VariantDef:
    """One variant: what it does differently, as policies the planner and the runner
    dispatch on (never on the name). ``default``: compared when a scenario or
    `testbed plan` names no variants (``dp-across-dc`` is not: only its DP
    all-reduce crosses the WAN, so it needs ``runner.dp_allreduce``, and its
    all-reduce of a large model's gradients over the WAN is slow to emulate)."""

    name: str
    description: str
    placement: PlacementPolicy
    streams: StreamPolicy
    sharing: SharingPolicy
    colour: str
    default: bool = True
    comm: CommPolicy = "atlas"
    schedule: SchedulePolicy = "configured"


REGISTRY: dict[str, VariantDef] = {
    v.name: v
    for v in (
        VariantDef("baseline", "one TCP stream per transfer; all pipelines send when ready and share the link",
                   placement="baseline", streams="one", sharing="shared", colour="#d62728"),
        VariantDef("multi-tcp", "N TCP streams per transfer (transport.streams), no plan",
                   placement="baseline", streams="configured", sharing="shared", colour="#ff7f0e"),
        VariantDef("atlas", "Atlas: its placement, enough streams to fill the link, temporal bandwidth sharing "
                   "(with runner.atlas_schedule: auto, also the pipeline schedule predicted fastest)",
                   placement="atlas", streams="fill-link", sharing="auto", colour="#1f77b4", schedule="auto"),
        VariantDef("dp-across-dc", "each DP replica in another DC (plain DDP across regions), one TCP stream "
                   "per flow, shared links",
                   placement="dp-across", streams="one", sharing="shared", colour="#9467bd",
                   default=False),
        VariantDef("torch-gloo", "baseline's placement, every send/recv and the DP all-reduce through "
                   "torch.distributed (gloo) over the same network: what is run today",
                   placement="baseline", streams="one", sharing="shared", colour="#8c564b", default=False,
                   comm="gloo"),
    )
}
"""Every variant, in report order."""

EXTRA_COLOURS = ("#2ca02c", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


def variant_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def default_names() -> tuple[str, ...]:
    """The variants compared when none are named, in registry order."""
    return tuple(name for name, v in REGISTRY.items() if v.default)


def allowed_text(bubbletea: bool = False) -> str:
    """The known names, for error messages and help: 'baseline, multi-tcp, ...'
    (with `bubbletea`, saying that each may take the suffix)."""
    text = ", ".join(REGISTRY)
    return f"{text}, each optionally {BUBBLETEA_SUFFIX}" if bubbletea else text


def help_text() -> str:
    """One line per variant, for command-line help: '<name>: <description>'."""
    return "\n".join(f"{v.name}: {v.description}" for v in REGISTRY.values())


def get_variant(name: str) -> VariantDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise VariantError(f"unknown variant {name!r} (allowed: {allowed_text()})") from None


@dataclass(frozen=True)
class RunVariant:
    """One run of a variant: the variant, with or without BubbleTea agents beside it."""

    variant: VariantDef
    bubbletea: bool = False
    dispatch: str | None = None  # a dispatch twin's mode (None: the scenario's bubbletea.dispatch)

    @property
    def name(self) -> str:
        twin = f"-{self.dispatch}" if self.bubbletea and self.dispatch else ""
        return self.variant.name + (BUBBLETEA_SUFFIX if self.bubbletea else "") + twin

    @property
    def base(self) -> str:
        return self.variant.name


def parse_run_variant(name: str) -> RunVariant:
    """'atlas', 'atlas+bubbletea' or 'atlas+bubbletea-naive' -> RunVariant; unknown names
    raise VariantError."""
    bt = has_bubbletea(name)
    base = base_name(name)
    twin = dispatch_of(name)
    try:
        return RunVariant(get_variant(base), bt, twin)
    except VariantError:
        raise VariantError(f"unknown variant {name!r} (allowed: {allowed_text(bubbletea=True)})") from None


def parse_variants(names: Iterable[str]) -> list[VariantDef]:
    """The variants named, in the order given; a VariantError names every unknown one."""
    names = list(names)
    _refuse_unknown([n for n in names if n not in REGISTRY], bubbletea=False)
    return [REGISTRY[n] for n in names]


def parse_run_variants(names: Iterable[str]) -> list[RunVariant]:
    """The runs named ('atlas', 'atlas+bubbletea', ...), in the order given, each once;
    a VariantError names every unknown one."""
    names = list(dict.fromkeys(names))
    _refuse_unknown([n for n in names if base_name(n) not in REGISTRY], bubbletea=True)
    return [parse_run_variant(n) for n in names]


def _refuse_unknown(unknown: list[str], bubbletea: bool) -> None:
    if unknown:
        raise VariantError(f"unknown variant(s) {', '.join(unknown)} (allowed: {allowed_text(bubbletea)})")


def dispatch_of(name: str) -> str | None:
    """A dispatch twin's mode: 'atlas+bubbletea-naive' -> 'naive'; None for any other name."""
    for mode in DISPATCH_TWINS:
        if name.endswith(f"{BUBBLETEA_SUFFIX}-{mode}"):
            return mode
    return None


def base_name(name: str) -> str:
    """The variant a run name belongs to: 'atlas+bubbletea' (or a dispatch twin,
    'atlas+bubbletea-naive') -> 'atlas' (unknown names pass)."""
    twin = dispatch_of(name)
    if twin is not None:
        name = name.removesuffix(f"-{twin}")
    return name.removesuffix(BUBBLETEA_SUFFIX)


def has_bubbletea(name: str) -> bool:
    return name.endswith(BUBBLETEA_SUFFIX) or dispatch_of(name) is not None


def sort_key(name: str) -> tuple[int, int, str]:
    """Report order: registry order, each variant before its BubbleTea twin; unknown last."""
    order = list(REGISTRY)
    base = base_name(name)
    return (order.index(base) if base in REGISTRY else len(order), int(has_bubbletea(name)), name)


def colour(name: str, extra: dict[str, str] | None = None) -> str:
    """The colour of a variant (its BubbleTea twin shares it). Unknown names get the next
    of EXTRA_COLOURS, remembered in `extra` so that a figure stays consistent."""
    base = base_name(name)
    if base in REGISTRY:
        return REGISTRY[base].colour
    palette = extra if extra is not None else {}
    if base not in palette:
        palette[base] = EXTRA_COLOURS[len(palette) % len(EXTRA_COLOURS)]
    return palette[base]
