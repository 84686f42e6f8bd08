"""Reading a worker's job file: the runner's model (testbed_core/contracts/worker_job.py),
validated as it was written; errors name the file and the field."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from testbed_core.contracts.worker_job import WORKER_JOB, ProbeJob, RingProbeJob, TrainJob


class WorkerError(RuntimeError):
    """A worker that cannot start or run; the message names the worker and the cause."""


ROLES = "train, probe-send, probe-recv"


def parse_job(text: str | bytes, source: str = "<job>") -> TrainJob | ProbeJob | RingProbeJob:
    """A job file's JSON text, validated; errors name the source and the field."""
    try:
        return WORKER_JOB.validate_json(text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        kind = first["type"]
        if kind == "json_invalid":
            raise WorkerError(f"{source}: not JSON: {first['msg']}") from None
        if kind in ("dict_type", "model_attributes_type"):
            raise WorkerError(f"{source}: a job is a JSON object with a 'role' ({ROLES})") from None
        if kind == "union_tag_not_found":
            raise WorkerError(f"{source}: the job has no 'role'; give one of {ROLES}") from None
        if kind == "union_tag_invalid":
            raise WorkerError(f"{source}: role {first['ctx']['tag']!r} is not one of {ROLES}") from None
        loc = first["loc"][1:]  # the first element is the role that picked the model
        where = ".".join(str(p) for p in loc)
        raise WorkerError(f"{source}: {where}: {first['msg']}") from None


def load_job(path: str | Path) -> TrainJob | ProbeJob | RingProbeJob:
    """The job file at `path`, validated."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise WorkerError(f"{path}: no such job file") from None
    return parse_job(text, str(path))
