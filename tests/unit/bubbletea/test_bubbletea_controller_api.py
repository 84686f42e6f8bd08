"""The prefill controller's HTTP API: clients, agents over the real socket, and garbage."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time

import pytest

from bubbletea_agent.controller.auth import agent_token, bearer, client_token
from bubbletea_agent.controller.client import AgentLink, ControllerRefused, PrefillClient
from bubbletea_agent.controller.dispatch import Dispatcher
from bubbletea_agent.controller.server import Service, serve
from bubbletea_agent.requests import Request
from testbed_core.contracts.prefill_service import MAX_BODY_BYTES, AgentHello, AgentStatus

PRED = {16: 0.0016, 1024: 0.1024, 4096: 0.4096}
SECRET = "0123456789abcdef0123456789abcdef"  # the run's secret (ATLAS_SECRET in a run)


@pytest.fixture
def controller():
    """A controller on a free localhost port, in a thread; yields (service, port)."""
    # a busy test machine syncs late; sent on arrival (no late binding): the statuses here never change
    d = Dispatcher(["a", "b"], ["dc1-h2"], deadline_s=2.0, stale_s=30.0, commit_ahead_s=None)
    rows: list[dict] = []
    service = Service(d, [Request("s0", 0.05, 256, 0, 2.0)], on_end=rows.append, secret=SECRET)
    service.rows = rows
    started = threading.Event()
    box: dict = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        stop = asyncio.Event()
        box["stop"] = stop

        def ready(port: int) -> None:
            box["port"] = port
            started.set()

        loop.run_until_complete(serve(service, "127.0.0.1", 0, ready, stop))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10)
    yield service, box["port"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(10)


def raw(port: int, method: str, path: str, body: bytes | None, ctype: str = "application/json"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": ctype} if body is not None else {}
        c.request(method, path, body=body, headers={**headers, **bearer(token_for(path))})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def token_for(path: str) -> str:
    """The run's token for `path`: the agent's own on its sync, the client token elsewhere."""
    parts = path.split("/")
    return agent_token(SECRET, parts[3]) if path.startswith("/v1/agents/") else client_token(SECRET)


def link(port: int, name: str) -> AgentLink:
    return AgentLink("127.0.0.1", port, name, AgentHello(device=f"gpu-{name}", decode_host="dc1-h2",
                                                         predict_s=PRED, max_prompt_tokens=8192), wait_s=0.05,
                     token=agent_token(SECRET, name))


def test_garbage_gets_a_json_refusal_and_the_server_goes_on(controller):
    _, port = controller
    code, body = raw(port, "POST", "/v1/prefill", b"{not json")
    assert code == 400 and body["error"] == "bad_json" and "not JSON" in body["detail"]
    code, body = raw(port, "POST", "/v1/prefill", b'{"prompt_tokens": 10, "colour": "red"}')
    assert code == 422 and body["error"] == "invalid_request" and body["field"] == "colour"
    assert "colour: unknown field" in body["detail"]
    code, body = raw(port, "POST", "/v1/prefill", b'{"deadline_s": 1}')
    assert code == 422 and body["field"] == "prompt_tokens" and "required field is missing" in body["detail"]
    code, body = raw(port, "POST", "/v1/prefill", b'{"prompt_tokens": -5}')
    assert code == 422 and "prompt_tokens: Input should be greater than 0" in body["detail"]
    code, body = raw(port, "POST", "/v1/prefill", b'[1, 2]')
    assert code == 422 and body["detail"] == "the body must be a JSON object"
    code, body = raw(port, "POST", "/v1/prefill", b"x" * (MAX_BODY_BYTES + 1))
    assert code == 413 and body["error"] == "body_too_large" and str(MAX_BODY_BYTES) in body["detail"]
    code, body = raw(port, "POST", "/v1/prefill", b"prompt_tokens=5", ctype="text/plain")
    assert code == 415 and body["error"] == "not_json" and "send application/json" in body["detail"]
    code, body = raw(port, "GET", "/v1/requests/nope", None)
    assert code == 404 and body["error"] == "not_found"
    code, body = raw(port, "POST", "/v1/agents/zz/sync", b'{"status": {"at": 1}}')
    assert code == 404 and body["error"] == "unknown_agent"
    code, body = raw(port, "POST", "/v1/agents/a/sync", b'{"status": 5}')
    assert code == 422 and body["field"] == "status"
    code, counts = raw(port, "GET", "/v1/status", None)
    assert code == 200 and counts["refused_bodies"] == 7 and counts["arrived"] == 0


def test_client_refusals_are_recorded_as_rejections(controller):
    service, port = controller
    la = link(port, "a")
    la.status(AgentStatus(at=time.time(), epoch=time.time(), idle_fraction=0.5))
    la.start()
    try:
        client = PrefillClient("127.0.0.1", port, client_token(SECRET))
        deadline = time.monotonic() + 5
        while service.d.devices["a"].hello is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(ControllerRefused) as exc:
            client.submit(9000, id="big")
        assert exc.value.status == 422 and exc.value.error.error == "too_long"
        assert "exceed the model context (8192)" in exc.value.error.detail
        with pytest.raises(ControllerRefused) as exc:
            client.submit(100, decode_host="dc7-h1", id="where")
        assert exc.value.error.error == "unknown_decode_host" and "dc1-h2" in exc.value.error.detail
        assert client.get("big").status == "rejected" and client.get("big").reason == "too_long"
        client.submit(100, id="once")
        with pytest.raises(ControllerRefused) as exc:
            client.submit(100, id="once")
        assert exc.value.status == 409 and exc.value.error.error == "duplicate_id"
    finally:
        la.close()


def test_request_round_trip_over_the_socket(controller):
    """A client's request is dispatched to the agent that syncs, the agent reports it
    served, and the client reads the TTFT measured at the controller; the source's
    request arrives after the epoch the agent reported."""
    service, port = controller
    epoch = time.time()
    la, lb = link(port, "a"), link(port, "b")
    la.status(AgentStatus(at=epoch))  # training not started yet: no epoch
    lb.status(AgentStatus(at=epoch))
    pokes: list[int] = []
    lb.on_work = lambda: pokes.append(1)  # the agent's wake-up (its worker's FIFO in a run)
    la.start()
    lb.start()
    try:
        deadline = time.monotonic() + 5
        while any(d.hello is None for d in service.d.devices.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        epoch = time.time()  # training starts: the source's requests arrive from now on
        # b reports the epoch first: the source's s0 (0.05 s after the first epoch the
        # controller hears) must find b's bubbles, not only a's 5 s backlog, whatever the load
        lb.status(AgentStatus(at=epoch, epoch=epoch, idle_fraction=0.5))
        while service.d.epoch is None and time.monotonic() < deadline:
            time.sleep(0.02)
        la.status(AgentStatus(at=epoch, epoch=epoch, idle_fraction=0.5, backlog_s=5.0))
        while (service.d.devices["a"].status is None or service.d.devices["a"].status.epoch is None) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        client = PrefillClient("127.0.0.1", port, client_token(SECRET))
        acc = client.submit(512, deadline_s=3.0)
        assert acc.status == "dispatched" and acc.device == "b"
        got: list = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += lb.take()
            time.sleep(0.01)
        assert sorted(r.id for r in got) == sorted([acc.id, "s0"]), (service.d.view("s0"), service.d.devices["b"].sent)
        for r in got:  # served: its KV cache arrived 0.2 s after it arrived at the controller
            arrival_abs = lb._epoch + r.arrival_s
            lb.ended({"id": r.id, "status": "served", "kv_arrival": arrival_abs + 0.2 - lb._epoch, "chunks": 1},
                     lb._epoch)
        assert pokes  # new work woke the agent
        view = client.wait(acc.id, timeout_s=5)
        assert view.status == "served" and view.device == "b"
        assert view.ttft_s == pytest.approx(0.2, abs=1e-6)
    finally:
        la.close()
        lb.close()
    assert service.d.devices["a"].final and service.d.devices["b"].final
    service.d.finish(time.time())
    assert {r["id"] for r in service.rows} == {acc.id, "s0"}
    assert all(r["origin"] in ("client", "source") for r in service.rows)
