"""Talking to the prefill controller: `PrefillClient` for clients (submit a request, read
its end), `AgentLink` for agents (a background thread that syncs the device's status and
the requests that ended, and hands the agent the work the controller sends).

Both use the standard library's HTTP client: an agent must not pull an event loop into
the process that times prefills on the device. Both send the run's token (auth.py): a
client the client token (`read_token_file` reads it from a run's output folder), an
agent its own (`agent_token(secret, name)`).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from bubbletea_agent.controller.auth import bearer
from bubbletea_agent.requests import Request
from testbed_core.contracts.prefill_service import (
    Accepted,
    AgentHello,
    AgentStatus,
    AgentSync,
    ApiError,
    ClientRequest,
    EndedRequest,
    RequestView,
    SyncReply,
)

log = logging.getLogger(__name__)


class ControllerRefused(Exception):
    """The controller refused a call: `status` (HTTP), `error` (its ApiError)."""

    def __init__(self, status: int, error: ApiError) -> None:
        super().__init__(f"HTTP {status} {error.error}: {error.detail}")
        self.status, self.error = status, error


def _call(host: str, port: int, method: str, path: str, body: bytes | None = None,
          timeout: float = 10.0, conn: http.client.HTTPConnection | None = None,
          token: str | None = None) -> tuple[int, bytes]:
    own = conn is None
    c = conn or http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token is not None:
            headers.update(bearer(token))
        c.request(method, path, body=body, headers=headers)
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        if own:
            c.close()


def _refused(status: int, raw: bytes) -> ControllerRefused:
    try:
        err = ApiError.model_validate_json(raw)
    except ValidationError:
        err = ApiError(error="http_error", detail=raw[:200].decode(errors="replace"))
    return ControllerRefused(status, err)


class PrefillClient:
    """A client of the prefill service at host:port, with the run's client `token`
    (auth.client_token of the run's secret, or `auth.read_token_file(<run folder>)`)."""

    def __init__(self, host: str, port: int, token: str, timeout: float = 10.0) -> None:
        self.host, self.port, self.token, self.timeout = host, port, token, timeout

    def submit(self, prompt_tokens: int, *, deadline_s: float | None = None, decode_host: str | None = None,
               id: str | None = None) -> Accepted:  # noqa: A002 - the API's field name
        body = ClientRequest(id=id, prompt_tokens=prompt_tokens, deadline_s=deadline_s,
                             decode_host=decode_host).model_dump_json(exclude_none=True).encode()
        status, raw = _call(self.host, self.port, "POST", "/v1/prefill", body, self.timeout, token=self.token)
        if status != 202:
            raise _refused(status, raw)
        return Accepted.model_validate_json(raw)

    def get(self, rid: str) -> RequestView:
        status, raw = _call(self.host, self.port, "GET", f"/v1/requests/{rid}", None, self.timeout, token=self.token)
        if status != 200:
            raise _refused(status, raw)
        return RequestView.model_validate_json(raw)

    def wait(self, rid: str, timeout_s: float = 30.0, poll_s: float = 0.05) -> RequestView:
        """The request once it ended (served or rejected); TimeoutError if not by then."""
        give_up = time.monotonic() + timeout_s
        while True:
            view = self.get(rid)
            if view.status in ("served", "rejected"):
                return view
            if time.monotonic() > give_up:
                raise TimeoutError(f"request {rid} still {view.status} after {timeout_s:g} s")
            time.sleep(poll_s)

    def status(self) -> dict[str, Any]:
        status, raw = _call(self.host, self.port, "GET", "/v1/status", None, self.timeout, token=self.token)
        if status != 200:
            raise _refused(status, raw)
        return json.loads(raw)


def ended_from_row(row: dict[str, Any], epoch: float) -> EndedRequest:
    """An agent's request record (times after its epoch) as the controller takes it (time.time())."""
    def abs_(x: float | None) -> float | None:
        return None if x is None else epoch + x

    return EndedRequest(id=row["id"], status=row["status"], reason=row.get("reason"), detail=row.get("detail"),
                        start=abs_(row.get("start")), end=abs_(row.get("end")),
                        kv_arrival=abs_(row.get("kv_arrival")), chunks=row.get("chunks", 0),
                        prefilled_tokens=row.get("prefilled_tokens", 0), kv_bytes=row.get("kv_bytes", 0))


class AgentLink:
    """An agent's side of the controller: a thread that long-polls ``sync`` (status and
    ended requests out, work in). `status` and `ended` are called from the agent's
    loop; `take` hands it the work received (as Requests relative to its epoch).
    `token` is this agent's (auth.agent_token(run secret, name)): the controller takes
    a sync for `name` with no other."""

    def __init__(self, host: str, port: int, name: str, hello: AgentHello, wait_s: float = 0.1,
                 connect_timeout_s: float = 30.0, timeout_s: float = 2.0, *, token: str) -> None:
        self.host, self.port, self.name, self.hello, self.token = host, port, name, hello, token
        # a sync not answered within timeout_s is given up and sent again (its work is re-sent)
        self.wait_s, self.connect_timeout_s, self.timeout_s = wait_s, connect_timeout_s, timeout_s
        self._status: AgentStatus | None = None
        self._ended: deque[EndedRequest] = deque()
        self._work: deque[Any] = deque()
        self._epoch: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.syncs = 0
        self.errors = 0
        self.received = 0
        self.stopped_by_controller = False
        self.on_work: Any = None  # called (from the link's thread) when new work came: wakes the agent
        # The link's thread stays at normal priority, never SCHED_FIFO: in a run the agent
        # is in a cgroup with a small real-time budget (testbed/run/cpu.py, 100 ms a
        # second) that its device holds need; a real-time thread that syncs 20 times a
        # second spends it, and then every hold of every agent in the group is frozen until
        # the next period (measured: holds ending at the same instant of each second,
        # training waiting up to 0.4 s on them).

    # -- agent side
    def status(self, st: AgentStatus) -> None:
        self._status = st
        self._epoch = st.epoch

    def ended(self, row: dict[str, Any], epoch: float | None) -> None:
        if epoch is not None:
            self._ended.append(ended_from_row(row, epoch))

    def take(self) -> Sequence[Request]:
        out = []
        while self._work:
            w = self._work.popleft()
            epoch = self._epoch if self._epoch is not None else w.arrival
            out.append(Request(w.id, w.arrival - epoch, w.prompt_tokens, 0, w.deadline_s))
        return out

    # -- thread
    def start(self) -> AgentLink:
        self._thread = threading.Thread(target=self._run, name=f"controller-link-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _sync(self, conn: http.client.HTTPConnection, final: bool = False) -> SyncReply:
        with self._lock:
            ended = [self._ended.popleft() for _ in range(len(self._ended))]
        st = self._status or AgentStatus(at=time.time())
        msg = AgentSync(hello=self.hello if self.syncs == 0 else None, status=st, ended=ended, final=final,
                        wait_s=0.0 if final else self.wait_s, received=self.received)
        try:
            status, raw = _call(self.host, self.port, "POST", f"/v1/agents/{self.name}/sync",
                                msg.model_dump_json(exclude_none=True).encode(), conn=conn, token=self.token)
        except Exception:
            with self._lock:
                self._ended.extendleft(reversed(ended))  # sent again with the next sync
            raise
        if status != 200:
            raise _refused(status, raw)
        self.syncs += 1
        return SyncReply.model_validate_json(raw)

    def _run(self) -> None:
        give_up = time.monotonic() + self.connect_timeout_s
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        while not self._stop.is_set():
            try:
                reply = self._sync(conn)
            except ControllerRefused as exc:
                self.errors += 1
                log.error("controller refused %s's sync: %s", self.name, exc)
                self._stop.wait(0.5)
                continue
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                if self.syncs == 0 and time.monotonic() < give_up:
                    self._stop.wait(0.1)  # the controller may still be starting
                    continue
                self.errors += 1
                log.warning("sync with the controller at %s:%d failed: %s", self.host, self.port, exc)
                self._stop.wait(0.1)
                continue
            new = reply.work[max(0, self.received - reply.first):]  # what a lost reply carried comes again
            self.received += len(new)
            self._work.extend(new)
            if new and self.on_work is not None:
                self.on_work()
            if reply.stop:
                self.stopped_by_controller = True
                break
        conn.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and send the last sync (every ended request, `final`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        give_up = time.monotonic() + timeout_s
        while True:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=5.0)
            try:
                self._sync(conn, final=True)
                return
            except (OSError, http.client.HTTPException, ControllerRefused) as exc:
                if time.monotonic() > give_up:
                    log.error("could not send the last sync to the controller: %s", exc)
                    return
                time.sleep(0.2)
            finally:
                conn.close()
