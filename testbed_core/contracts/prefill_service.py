"""The prefill service's contracts: what crosses the sockets of the BubbleTea controller
(bubbletea_agent/controller/) and the job file the scenario runner hands it.

Three parties talk to the controller over HTTP with JSON bodies (one model per body,
validated on arrival with ``model_validate_json``; nothing is read as a loose dict):

* **clients** submit prefill requests (`ClientRequest` -> `Accepted` or `ApiError`) and
  look them up (`RequestView`);
* **agents** sync (`AgentSync` -> `SyncReply`): each sync carries the agent's live status
  (its device's current and upcoming idle windows, the work it still has queued) and
  the requests that ended there, and returns the requests dispatched to it;
* the **runner** starts it with a `ControllerJob` and reads its `controller.json`.

Field meanings and the HTTP routes are in bubbletea_agent/controller/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.contracts.bubbletea import BubbleTeaSettings

DISPATCH_MODES = ("controller", "shards", "naive")
"""How prefill requests reach the devices (``bubbletea.dispatch``): ``controller``: one
controller per cluster sends each to the device whose next bubbles serve it soonest;
``shards``: each agent takes a fixed share of the request stream; ``naive``: shards, and
each device prefills whenever it is free, without a guard (colocation)."""

Dispatch = Literal["controller", "shards", "naive"]

MAX_BODY_BYTES = 64 * 1024
"""Largest request body the controller reads; a larger one is refused with HTTP 413."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- clients


class ClientRequest(_Strict):
    """A prefill request submitted by a client (``POST /v1/prefill``)."""

    id: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                           description="the client's id for it (unique); none: the controller names it")
    prompt_tokens: int = Field(gt=0, le=1 << 24, description="prompt length in tokens")
    deadline_s: float | None = Field(None, gt=0, le=3600, description="seconds it may wait for its first "
                                                                      "chunk; none: the scenario's deadline")
    decode_host: str | None = Field(None, description="the decode host that must receive its KV cache; none: "
                                                      "any (the serving device's own)")


class Accepted(_Strict):
    """The controller's answer to an accepted submission (HTTP 202): the request is
    queued or dispatched; its end is read with ``GET /v1/requests/<id>``."""

    id: str
    status: Literal["queued", "dispatched", "served", "rejected"]
    device: str | None = None


class ApiError(_Strict):
    """Every refusal (HTTP 4xx): `error` a stable code, `detail` what was wrong and what
    is allowed."""

    error: str
    detail: str
    field: str | None = None


class RequestView(_Strict):
    """One request as the controller sees it (``GET /v1/requests/<id>``); times are
    ``time.time()`` seconds."""

    id: str
    origin: Literal["source", "client"]
    prompt_tokens: int
    arrival: float
    status: Literal["queued", "dispatched", "served", "rejected"]
    device: str | None = None
    reason: str | None = None
    detail: str | None = None
    ttft_s: float | None = None


# --------------------------------------------------------------------------- agents


class Window(_Strict):
    """An idle window of a device: [start, end), time.time() seconds."""

    start: float
    end: float


class AgentStatus(_Strict):
    """What an agent tells the controller about its device at `at`."""

    at: float = Field(description="time.time() of this status")
    epoch: float | None = Field(None, description="the agent's request time zero (none: training has not "
                                                  "started; nothing is dispatched to it yet)")
    live_end: float | None = Field(None, description="the live guarantee: training leaves the device alone "
                                                     "until then (none: no window open now)")
    upcoming: list[Window] = Field(default_factory=list, description="planned idle slots ahead (corrected)")
    idle_fraction: float = Field(0.0, ge=0, le=1, description="share of recent wall time the device was idle "
                                                              "(what later bubbles will hold)")
    backlog_s: float = Field(0.0, ge=0, description="predicted device seconds of work queued at the agent")
    queued: int = Field(0, ge=0)
    taken: int = Field(0, ge=0, description="requests from the controller the agent has taken into its queue "
                                            "so far (the rest sent is not in backlog_s yet)")
    arrivals_closed_at: float | None = Field(None, description="the run's last iteration began: requests "
                                                               "stop arriving then")
    ended: bool = Field(False, description="training ended: this device takes no more work")


class EndedRequest(_Strict):
    """A request dispatched to an agent that ended there; times are time.time() seconds."""

    id: str
    status: Literal["served", "rejected"]
    reason: str | None = None
    detail: str | None = None
    start: float | None = None
    end: float | None = None
    kv_arrival: float | None = Field(None, description="the last KV byte reached the decode host (or the "
                                                       "prefill ended, without one)")
    chunks: int = 0
    prefilled_tokens: int = 0
    kv_bytes: int = 0


class AgentHello(_Strict):
    """Sent once with an agent's first sync: who it is, and what its prefill costs."""

    device: str
    decode_host: str | None = None
    predict_s: dict[int, float] = Field(default_factory=dict, description="predicted prefill seconds by "
                                                                          "prompt tokens (no cache before)")
    max_prompt_tokens: int = Field(gt=0, description="the model's context")


class AgentSync(_Strict):
    """``POST /v1/agents/<name>/sync``: status, ended requests; the reply carries new work."""

    hello: AgentHello | None = None
    status: AgentStatus
    ended: list[EndedRequest] = Field(default_factory=list)
    final: bool = Field(False, description="the agent stops: whatever it was sent has ended (listed)")
    received: int = Field(0, ge=0, description="work items received so far: the controller sends the rest "
                                              "again (a reply lost on the way is not lost work)")
    wait_s: float = Field(0.0, ge=0, le=5, description="hold the reply this long unless work comes")


class WorkItem(_Strict):
    """A request dispatched to an agent; `arrival` is time.time() at the controller."""

    id: str
    arrival: float
    prompt_tokens: int
    deadline_s: float | None = None


class SyncReply(_Strict):
    work: list[WorkItem] = Field(default_factory=list)
    first: int = Field(0, ge=0, description="the sequence number of work[0] among all work sent to this agent")
    stop: bool = False


# --------------------------------------------------------------------------- runner


class ControllerJob(_Strict):
    """The controller's job (``python -m bubbletea_agent controller <job.json>``)."""

    bubbletea: BubbleTeaSettings
    seed: int = 1
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(7080, ge=0, le=65535)
    out: Path = Field(description="folder for controller.json and requests.jsonl")
    agents: list[str] = Field(description="the agents that will sync (their names)")
    decode_hosts: list[str] = Field(default_factory=list, description="decode hosts the agents ship to "
                                                                      "(a client may name one)")
    base_dir: Path | None = None
    duration_s: float = Field(600.0, gt=0)
    horizon_s: float = Field(30.0, gt=0, description="a request whose prefill the emptiest device could not "
                                                     "finish within this long is refused as too_long")


class ControllerSummaryRead(BaseModel):
    """The controller's ``controller.json`` (bubbletea_agent/controller/server.py), the
    keys the runner reads into the variant's ``prefill_service``; the rest is ignored."""

    model_config = ConfigDict(extra="ignore")

    not_arrived: int | None = None
    by_device: dict[str, int] | None = None
    by_origin: dict[str, int] | None = None
    refused_bodies: int | None = None
