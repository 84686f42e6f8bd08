"""Parsing of the human units used in topology, workload and scenario files.

Rates are bits per second ("1Gbit", "500Mbit", "2.5Gbps", "1e9"); "bps" means bits,
as in the networking literature (tc's own "bps" means bytes: we never accept it
silently, "Bps"/"MBps" are rejected with a hint). Sizes are bytes ("1MB" = 10**6,
"1MiB" = 2**20). Times are seconds ("25ms", "0.5s", "100us").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from pydantic import BeforeValidator

_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_RATE_UNITS = {
    "": 1, "bit": 1, "bps": 1, "bit/s": 1,
    "kbit": 1e3, "kbps": 1e3, "kbit/s": 1e3,
    "mbit": 1e6, "mbps": 1e6, "mbit/s": 1e6,
    "gbit": 1e9, "gbps": 1e9, "gbit/s": 1e9,
    "tbit": 1e12, "tbps": 1e12, "tbit/s": 1e12,
}
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_TIME_UNITS = {"": 1, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60}


class UnitError(ValueError):
    """A value whose unit or number could not be understood."""


def _finite(value: int | float, what: str, shown: object = None) -> float:
    """`value` as a float; infinities, NaNs and numbers beyond a float's range are refused."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        text = repr(shown if shown is not None else value)
        raise UnitError(f"{text if len(text) <= 40 else text[:37] + '...'} is not a finite {what}")
    return number


def _split(text: str, what: str, allowed: dict[str, float]) -> tuple[float, str]:
    m = re.fullmatch(_NUM + r"\s*([a-zA-Zµ/]*)", text.strip())
    if not m:
        raise UnitError(f"{_short(text)} is not a {what} (expected a number with a unit, e.g. {_example(what)})")
    return _finite(float(m.group(1)), what, text), m.group(2)


def _short(text: str, limit: int = 40) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _example(what: str) -> str:
    return {"rate": "'1Gbit' or '500Mbit'", "size": "'4MB' or '256KiB'", "duration": "'25ms' or '1.5s'"}[what]


def _allowed(units: dict[str, float]) -> str:
    return ", ".join(sorted({u for u in units if u}, key=lambda u: (units[u], u)))


def _scaled(value: str | int | float, what: str, word: str, units: dict[str, float],
            key: Callable[[str], str] = str.lower) -> float:
    """`value` in the base unit of `units`: a number as it is (finite), a text as its
    number times its unit's factor (the unit looked up as `key` writes it). `what`
    names the quantity in errors, `word` its kind of unit."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a {what}")
    if isinstance(value, (int, float)):
        return _finite(value, what)
    number, unit = _split(value, what, units)
    factor = units.get(key(unit))
    if factor is None:
        raise UnitError(f"{_short(value)}: unknown {word} unit {_short(unit, 20)} (allowed: {_allowed(units)})")
    return number * factor


def parse_rate(value: str | int | float) -> float:
    """Bits per second."""
    if isinstance(value, str):
        number, unit = _split(value, "rate", _RATE_UNITS)
        if unit and unit != unit.lower() and unit.endswith("Bps"):
            raise UnitError(
                f"{value!r}: 'Bps' (bytes per second) is ambiguous here; write the rate in bits, "
                f"e.g. '{number * 8:g}{unit[:-3]}bit'"
            )
    return _scaled(value, "rate", "rate", _RATE_UNITS)


def parse_size(value: str | int | float) -> int:
    """Bytes (a number as given, truncated; a text rounded to whole bytes)."""
    size = _scaled(value, "size", "size", _SIZE_UNITS)
    return int(size) if isinstance(value, (int, float)) else int(round(size))


def parse_duration(value: str | int | float) -> float:
    """Seconds."""
    return _scaled(value, "duration", "time", _TIME_UNITS, key=lambda unit: unit if unit == "µs" else unit.lower())


def parse_fraction(value: str | int | float) -> float:
    """A probability: '0.1%' or 0.001."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a fraction")
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise UnitError(f"{_short(value)} is not a fraction (e.g. '0.1%' or 0.001)") from None
        return _finite(number, "fraction", value)
    return _finite(value, "fraction")


def format_rate(bps: float) -> str:
    """A rate in bits per second as the largest unit that keeps it >= 1: '2.5Gbit', '500Mbit'."""
    for unit, factor in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bps >= factor:
            return f"{bps / factor:g}{unit}"
    return f"{bps:g}bit"


def format_size(nbytes: float) -> str:
    """A size in bytes in binary units, three significant digits: '1MiB', '6.25MiB', '512B'."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g}{unit}"
    return f"{int(nbytes)}B"


def convert_unit(parser: Callable[[str | int | float], float | int], value: Any) -> Any:
    """A model field's raw `value` through `parser` (parse_rate, ...): a text or number
    converted, None and other types left to the field's own validation; a yes/no value
    or a unit error is a ValueError that pydantic reports with the field's place."""
    if value is None:
        return value
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a yes/no value, not a {parser.__name__.removeprefix('parse_')}")
    if isinstance(value, (str, int, float)):
        try:
            return parser(value)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    return value


def unit_validator(parser: Callable[[str | int | float], float | int]) -> BeforeValidator:
    """A field validator that reads the field through `parser` (`convert_unit`): a
    model field ``Annotated[float, unit_validator(parse_rate)]`` takes '1Gbit' or 1e9."""
    def convert(value: Any) -> Any:
        return convert_unit(parser, value)

    return BeforeValidator(convert)
