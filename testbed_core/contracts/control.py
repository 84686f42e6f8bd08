"""The messages of the runner's control socket (testbed/run/workers.py `Controller`, the
worker's end in testbed/training/worker/control.py).

One JSON object per line, each a model below picked by its ``type``. A worker says
``hello`` (once connected), ``ready`` (its channels are open, it waits for ``go``),
``iter_done`` per iteration, then ``bye``, or ``error`` when it fails; the runner says
``go`` (an iteration and its common start, wall clock) and ``stop``. Both ends write
and read through these models, so a field renamed on one side is an error on the other,
not a silently missing key.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class ControlError(ValueError):
    """A control-socket line that is not one of the messages below."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def line(self) -> bytes:
        """The message as one newline-terminated JSON line."""
        return (self.model_dump_json() + "\n").encode()


class _FromWorker(_Msg):
    """A worker's message: its type, then the worker's name (a subclass narrows `type`
    to its own literal; the field keeps its place)."""

    type: str
    worker: str


class Hello(_FromWorker):
    type: Literal["hello"] = "hello"
    pid: int
    host: str


class Ready(_FromWorker):
    type: Literal["ready"] = "ready"


class IterDone(_FromWorker):
    type: Literal["iter_done"] = "iter_done"
    iteration: int = Field(ge=0)
    end: float  # wall clock: the end of the worker's last work of the iteration
    busy: float = Field(ge=0)  # seconds the worker's device worked in the iteration
    token_timeouts: int = Field(ge=0)  # temporal plan: tokens waited for in vain (sent anyway)
    loss: float | None  # real mode: the iteration's loss on the last stage; None otherwise
    allreduce_s: float | None = Field(ge=0)  # modelled DP all-reduce: seconds it took; None: none ran


class Bye(_FromWorker):
    type: Literal["bye"] = "bye"


class WorkerFailed(_FromWorker):
    type: Literal["error"] = "error"
    message: str
    trace: str


class Go(_Msg):
    type: Literal["go"] = "go"
    iteration: int = Field(ge=0)
    at: float  # wall clock: the iteration's common start


class Stop(_Msg):
    type: Literal["stop"] = "stop"


WorkerMessage = Annotated[Hello | Ready | IterDone | Bye | WorkerFailed, Field(discriminator="type")]
RunnerMessage = Annotated[Go | Stop, Field(discriminator="type")]
_WORKER: TypeAdapter[Hello | Ready | IterDone | Bye | WorkerFailed] = TypeAdapter(WorkerMessage)
_RUNNER: TypeAdapter[Go | Stop] = TypeAdapter(RunnerMessage)


def _parse(adapter: TypeAdapter, line: bytes | str, sender: str) -> object:
    try:
        return adapter.validate_json(line)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        text = line if isinstance(line, str) else line.decode(errors="replace")
        raise ControlError(f"malformed control message from the {sender}: {text.strip()[:200]!r} ({problems}); "
                           "are the runner and the worker from the same checkout?") from None


def parse_worker_message(line: bytes | str) -> Hello | Ready | IterDone | Bye | WorkerFailed:
    """A line a worker sent; ControlError when it is not a worker message."""
    return _parse(_WORKER, line, "worker")  # type: ignore[return-value]


def parse_runner_message(line: bytes | str) -> Go | Stop:
    """A line the runner sent; ControlError when it is not a runner message."""
    return _parse(_RUNNER, line, "runner")  # type: ignore[return-value]
