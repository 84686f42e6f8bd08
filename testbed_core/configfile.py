"""Shared plumbing for the YAML files users write (topologies, workloads, scenarios,
sweeps): reading them, and turning pydantic's errors into messages that name the
file, the field as a dotted path, and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class ConfigError(ValueError):
    """A user-written file that cannot be used; the message says where and why."""


def read_yaml_mapping(path: str | Path, kind: str, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """The top-level mapping of a YAML file; a missing file, bad YAML or a non-mapping
    raises `error` naming the file and the `kind` of file expected."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {kind} file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: a {kind} file must be a YAML mapping of fields")
    return data


def format_validation_error(source: str, exc: ValidationError, kind: str, prefix: str = "") -> str:
    """pydantic's errors as one message: the file, then one line per problem with the
    field as a dotted path (after `prefix`, for a section validated on its own) and
    pydantic's wording made plainer for missing, unknown and enumerated fields."""
    count = exc.error_count()
    lines = [f"{source}: invalid {kind} ({count} problem{'s' if count > 1 else ''}):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = f"unknown field (check the spelling; see README for the {kind} format)"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        lines.append(f"  - {loc or '(top level)'}: {msg}")
    return "\n".join(lines)
