"""The prefill controller's HTTP front end (aiohttp) and its run loop.

Routes (bodies are JSON, one model of testbed_core/contracts/prefill_service.py each):

* ``POST /v1/prefill`` (`ClientRequest`): 202 `Accepted`, or a 4xx `ApiError`;
* ``GET /v1/requests/<id>``: 200 `RequestView`, 404 if unknown;
* ``GET /v1/status``: the counts (arrived, served, rejected by reason, per device);
* ``POST /v1/agents/<name>/sync`` (`AgentSync`): 200 `SyncReply` (long-polled up to
  ``wait_s`` when there is no work for it).

Every request carries ``Authorization: Bearer <token>`` (auth.py): the run's client token
on the first three routes, agent <name>'s own token on its sync. A missing or wrong
token is answered 401 ``unauthorized`` before the body is read: nothing is parsed,
recorded or sent, the refusal is counted (``unauthorized`` in the status and in
controller.json, by reason) and logged with the peer's address.

Refusals: 400 ``bad_json`` (not JSON), 422 ``invalid_request`` (a field missing, unknown
or out of range; `field` names it), 413 ``body_too_large`` (above MAX_BODY_BYTES), 415
``not_json`` (another content type), 409 ``duplicate_id``, 422 ``too_long`` /
``unknown_decode_host`` / ``deadline_unreachable`` / ``no_device`` / ``queue_full``
(the request was recorded as rejected with that reason), 404 ``unknown_agent`` /
``not_found``. A refusal never stops the server.

Requests of the scenario's source arrive here too (`feed`): from the moment the first
agent saw training start (its epoch) until the run's last iteration began; the rest
count as not arrived.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from bubbletea_agent.controller.auth import (
    TOKEN_FILE,
    agent_token,
    client_token,
    matches,
    presented,
    run_secret,
    write_token_file,
)
from bubbletea_agent.controller.dispatch import Dispatcher, Refusal
from bubbletea_agent.requests import Reason, Request
from testbed_core.contracts.prefill_service import (
    MAX_BODY_BYTES,
    Accepted,
    AgentSync,
    ApiError,
    ClientRequest,
)

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

# The scenario's source is known ahead (a trace, or a seeded Poisson stream): its requests
# are placed and sent to their agent this long before they arrive, and the agent holds each
# until its arrival time, as per-agent shards hold theirs. A request then does not wait for
# the agent's next sync after it arrives (measured under load: a median 0.07-0.31 s between
# sending and the agent taking it). Clients' requests arrive when they are posted.
PRESEND_S = 0.15

REFUSAL_STATUS = {"duplicate_id": 409, "unknown_agent": 404, "not_found": 404, "body_too_large": 413,
                  "not_json": 415, "bad_json": 400, "unauthorized": 401}
LOG_REFUSALS = 20  # the first refusals are logged one by one; then one line per LOG_EVERY
LOG_EVERY = 1000


def _error(code: str, detail: str, field: str | None = None, status: int | None = None) -> web.Response:
    body = ApiError(error=code, detail=detail, field=field).model_dump_json(exclude_none=True)
    return web.Response(status=status or REFUSAL_STATUS.get(code, 422), text=body, content_type="application/json")


def _json(model: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=model.model_dump_json(exclude_none=True), content_type="application/json")


def validation_detail(exc: ValidationError) -> tuple[str, str, str | None]:
    """(code, detail, field) of a body that failed its model."""
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        return "bad_json", f"the body is not JSON ({errors[0]['msg']})", None
    if errors and errors[0]["type"] == "model_type" and not errors[0]["loc"]:
        return "invalid_request", "the body must be a JSON object", None
    parts, first = [], None
    for e in errors:
        loc = ".".join(str(p) for p in e["loc"]) or "(body)"
        first = first or loc
        msg = "unknown field" if e["type"] == "extra_forbidden" else (
            "required field is missing" if e["type"] == "missing" else e["msg"])
        parts.append(f"{loc}: {msg}")
    return "invalid_request", "; ".join(parts), first


class Service:
    """The controller: a Dispatcher behind HTTP, fed by the scenario's request source.
    `secret` is the run's (auth.py derives the tokens from it); a Service without one
    can be fed and ticked but not served (`app` refuses)."""

    def __init__(self, dispatcher: Dispatcher, source: Sequence[Request] = (), clock: Callable[[], float] = time.time,
                 on_end: Callable[[dict[str, Any]], None] | None = None, tick_s: float = 0.01,
                 presend_s: float = PRESEND_S, *, secret: str | bytes | None = None) -> None:
        self.d = dispatcher
        self._secret = secret
        self._client = None if secret is None else client_token(secret)
        self._agents = {} if secret is None else {name: agent_token(secret, name) for name in dispatcher.devices}
        self.unauthorized: dict[str, int] = {}  # refusals for who sent them, by reason
        self._refusals = itertools.count(1)
        self.source = list(source)
        self.clock = clock
        self.tick_s = tick_s
        self.presend_s = presend_s
        self._next = 0
        self._events: dict[str, asyncio.Event] = {}
        self.stopping = False
        if on_end is not None:
            entries = dispatcher.entries

            def hook(rec: Any) -> None:
                row = rec.to_json()
                e = entries.get(rec.id)
                if e is not None:
                    # where the time went: sent to its device at `dispatched` (late binding:
                    # it waited here until then), predicted to start and end there
                    row.update(origin=e.origin, device=e.device, dispatched=e.dispatched_at,
                               predicted_start=e.predicted_start, predicted_finish=e.predicted_finish)
                on_end(row)

            dispatcher.ledger.on_end = hook

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        if self._client is None:
            raise RuntimeError("the controller serves only with the run's secret: Service(..., secret=...)")
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._authenticate])
        app.router.add_post("/v1/prefill", self.submit)
        app.router.add_get("/v1/requests/{rid}", self.get_request)
        app.router.add_get("/v1/status", self.status)
        app.router.add_post("/v1/agents/{name}/sync", self.sync)
        return app

    # ------------------------------------------------------------------ who

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        """Every route, known or not, needs the run's token: agent <name>'s own on its
        sync, the client token elsewhere. Checked before the body is read."""
        token = presented(request.headers.get("Authorization"))
        name = request.match_info.get("name") if request.path.startswith("/v1/agents/") else None
        if name is not None:
            # a name no agent has needs its token too (only the run can make it): then 404 unknown_agent
            expected = self._agents.get(name) or agent_token(self._secret, name)  # type: ignore[arg-type]
            who = f"agent {name}"
        else:
            expected, who = self._client, "a client"
        if matches(token, expected):  # type: ignore[arg-type]
            return await handler(request)
        reason = "no_token" if token is None else "wrong_token"
        return self._unauthorized(request, reason, who)

    def _unauthorized(self, request: web.Request, reason: str, who: str) -> web.Response:
        self.unauthorized[reason] = self.unauthorized.get(reason, 0) + 1
        n = next(self._refusals)
        if n <= LOG_REFUSALS or n % LOG_EVERY == 0:
            log.warning("refused %s %s from %s: %s (%d refused so far)", request.method, request.path,
                        request.remote, "no bearer token" if reason == "no_token" else f"not the token of {who}", n)
        detail = ("this controller needs 'Authorization: Bearer <token>': the run's client token is in "
                  "prefill-client.token in the run's output folder" if reason == "no_token" else
                  f"the token is not the one of {who} in this run (a token of another run, or of another agent, "
                  "is refused)")
        resp = _error("unauthorized", detail)
        resp.headers["WWW-Authenticate"] = 'Bearer realm="prefill-controller"'
        return resp

    def counts(self) -> dict[str, Any]:
        """The dispatcher's counts and the requests refused for who sent them."""
        return {**self.d.counts(), "unauthorized": sum(self.unauthorized.values()),
                "unauthorized_by_reason": dict(self.unauthorized)}

    # ------------------------------------------------------------------ bodies

    async def _body(self, request: web.Request) -> bytes | web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            self.d.refused_bodies += 1
            return _error("body_too_large", f"the body is {request.content_length} bytes; at most "
                                            f"{MAX_BODY_BYTES} are read")
        if request.content_type not in ("application/json", "application/octet-stream", ""):
            self.d.refused_bodies += 1
            return _error("not_json", f"content type {request.content_type!r}; send application/json")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.d.refused_bodies += 1
            return _error("body_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")

    async def _message(self, request: web.Request, model: type[M],
                       invalid: Callable[[str], None]) -> M | web.Response:
        """The body as a `model`, or the 4xx answer (too large, not JSON, fields at fault);
        `invalid` is told the detail of a body that is not a valid `model`."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        try:
            return model.model_validate_json(body)
        except ValidationError as exc:
            code, detail, field = validation_detail(exc)
            invalid(detail)
            return _error(code, detail, field)

    def _refused_body(self, detail: str) -> None:
        self.d.refused_bodies += 1

    async def submit(self, request: web.Request) -> web.Response:
        msg = await self._message(request, ClientRequest, self._refused_body)
        if isinstance(msg, web.Response):
            return msg
        now = self.clock()
        rid = msg.id or self.d.new_client_id()
        req = Request(rid, now, msg.prompt_tokens, 0, msg.deadline_s)
        try:
            entry = self.d.submit(req, now, "client", msg.decode_host)
        except Refusal as r:
            if not r.recorded:
                self.d.refused_bodies += 1
            return _error(str(r.code), r.detail, r.field)
        self._wake(entry.device)
        state = "dispatched" if entry.state == "dispatched" else "queued"
        return _json(Accepted(id=rid, status=state, device=entry.device), status=202)  # type: ignore[arg-type]

    async def get_request(self, request: web.Request) -> web.Response:
        view = self.d.view(request.match_info["rid"])
        if view is None:
            return _error("not_found", f"no request {request.match_info['rid']!r} was submitted here")
        return _json(view)

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.counts())

    async def sync(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        msg = await self._message(request, AgentSync,
                                  lambda detail: log.warning("agent %s sent an invalid sync: %s", name, detail))
        if isinstance(msg, web.Response):
            return msg
        try:
            reply = self.d.sync(name, msg, self.clock())
        except Refusal as r:
            return _error(str(r.code), r.detail, r.field)
        if not reply.work and not reply.stop and msg.wait_s > 0 and not self.stopping:
            ev = self._events.setdefault(name, asyncio.Event())
            ev.clear()
            try:
                await asyncio.wait_for(ev.wait(), msg.wait_s)
            except TimeoutError:
                pass
            more = self.d.sync(name, msg.model_copy(update={"hello": None, "ended": [], "final": False}),
                               self.clock()) if self.d.devices[name].outbox else reply
            reply = more
        return _json(reply)

    def _wake(self, device: str | None) -> None:
        if device is not None and device in self._events:
            self._events[device].set()

    # ------------------------------------------------------------------ feed

    def feed(self, now: float) -> float:
        """Release the source's requests due by `now + presend_s` (each placed for its
        arrival time); returns seconds until the next is to be released."""
        d = self.d
        if d.epoch is None:
            return self.tick_s
        # ahead only once every agent has reported training started: one released earlier
        # could go only to the devices that had (at startup, a request 0.05 s after the epoch
        # was rejected as deadline_unreachable: the one ready device had a long backlog)
        ready = all(dev.final or dev.ready(now, d.stale_s) for dev in d.devices.values())
        lead = self.presend_s if ready else 0.0
        while self._next < len(self.source):
            req = self.source[self._next]
            at = d.epoch + req.arrival_s
            if d.arrivals_closed_at is not None and at > d.arrivals_closed_at:
                return self.tick_s  # after the arrival window: not arrived
            if at > now + lead:
                return min(self.tick_s, at - now - lead)
            self._next += 1
            try:
                entry = d.submit(Request(req.id, at, req.prompt_tokens, req.generated_tokens, req.deadline_s),
                                 min(now, at), "source", arrival=at)
            except Refusal:
                continue  # recorded as rejected with its reason
            self._wake(entry.device)
        return self.tick_s

    @property
    def not_arrived(self) -> int:
        return len(self.source) - self._next

    async def loop(self) -> None:
        while not self.stopping:
            now = self.clock()
            before = {n: len(dev.outbox) for n, dev in self.d.devices.items()}
            self.d.tick(now)
            wait = self.feed(now)
            for n, dev in self.d.devices.items():
                if len(dev.outbox) > before[n]:
                    self._wake(n)
            await asyncio.sleep(max(0.001, wait))

    def summary(self, started: float, ended: float) -> dict[str, Any]:
        from bubbletea_agent.metrics import percentiles

        ttfts = self.d.served_ttfts()
        counts = self.counts()
        counts["not_arrived"] = self.not_arrived
        counts["source_requests"] = len(self.source)
        mean = sum(ttfts) / len(ttfts) if ttfts else None
        return {"dispatch": "controller", **counts, "ttft_s": {**percentiles(ttfts), "mean": mean},
                "epoch": self.d.epoch, "started": started, "ended": ended}


async def serve(service: Service, host: str, port: int, ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (SIGTERM/SIGINT set it when not given)."""
    runner = web.AppRunner(service.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        bound = server.sockets[0].getsockname()[1]
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(service.loop())
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
    finally:
        service.stopping = True
        for ev in service._events.values():
            ev.set()
        task.cancel()
        await runner.cleanup()


def run_job(job_path: str | Path) -> dict[str, Any]:
    """Run the controller of a ControllerJob file until SIGTERM, on `job.host` (the
    run's address of its host) only, answering only requests with the run's tokens
    (derived from ``ATLAS_SECRET``, auth.py); writes `<out>/prefill-client.token` (0600,
    the client token), `<out>/requests.jsonl` (one line per request as it ends: the
    agents' fields plus origin and device; times are time.time() seconds) and
    `<out>/controller.json`."""
    from bubbletea_agent.config import request_source
    from bubbletea_agent.requests import load_requests
    from testbed_core.contracts.prefill_service import ControllerJob
    from testbed_runtime.readiness import announce_ready

    path = Path(job_path)
    try:
        job = ControllerJob.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise SystemExit(f"{path}: cannot use the controller job: {exc}") from None
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    bt = job.bubbletea
    source = load_requests(request_source(bt, seed=job.seed, duration_s=job.duration_s, base_dir=job.base_dir,
                                          shard_index=0, shard_count=1, id_prefix="s"))
    d = Dispatcher(list(job.agents), list(job.decode_hosts), deadline_s=bt.requests.deadline,
                   horizon_s=job.horizon_s)
    secret = run_secret()
    write_token_file(out / TOKEN_FILE, client_token(secret))
    started = time.time()
    with open(out / "requests.jsonl", "w", buffering=1) as rows:
        service = Service(d, source, on_end=lambda row: rows.write(json.dumps(row) + "\n"), secret=secret)

        def ready(port: int) -> None:
            log.info("prefill controller listening on %s:%d for agents %s (%d source requests)", job.host, port,
                     ", ".join(job.agents), len(source))
            announce_ready(port=port, pid=os.getpid())

        try:
            asyncio.run(serve(service, job.host, job.port, ready))
        except OSError as exc:
            raise SystemExit(f"{path}: the controller cannot listen on {job.host}:{job.port}: "
                             f"{exc.strerror or exc} (host is the address it binds: one of this machine's "
                             "interfaces; a scenario sets it with bubbletea.controller_bind)") from None
        d.finish(time.time())
    summary = service.summary(started, time.time())
    (out / "controller.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


__all__ = ["Service", "serve", "run_job", "Reason"]
