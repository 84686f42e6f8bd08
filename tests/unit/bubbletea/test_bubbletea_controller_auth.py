"""Only the run gets in: the prefill controller refuses, with 401 and before reading the
body, every request without the run's token; an agent syncs only as itself; a token of
another run is refused; the controller listens on the run's address only. Each refusal
leaves nothing served or recorded, and shows in the counters."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from bubbletea_agent.controller.auth import (
    TOKEN_FILE,
    AuthError,
    agent_token,
    bearer,
    client_token,
    read_token_file,
    run_secret,
    write_token_file,
)
from bubbletea_agent.controller.client import AgentLink, ControllerRefused, PrefillClient
from bubbletea_agent.controller.dispatch import Dispatcher
from bubbletea_agent.controller.server import Service, serve
from testbed_core.contracts.prefill_service import AgentHello, AgentStatus

SECRET = "5ec7e75ec7e75ec7e75ec7e75ec7e75e"
OTHER_RUN = "0the7run0the7run0the7run0the7run"
PRED = {16: 0.0016, 1024: 0.1024, 4096: 0.4096}


@pytest.fixture
def controller():
    """A controller with the run's secret on 127.0.0.1 (the run's address here), in a thread."""
    d = Dispatcher(["a", "b"], ["dc1-h2"], deadline_s=2.0, stale_s=30.0, commit_ahead_s=None)
    service = Service(d, secret=SECRET)
    started, box = threading.Event(), {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        box["loop"], box["stop"] = loop, asyncio.Event()

        def ready(port: int) -> None:
            box["port"] = port
            started.set()

        loop.run_until_complete(serve(service, "127.0.0.1", 0, ready, box["stop"]))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10)
    yield service, box["port"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(10)


def call(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         host: str = "127.0.0.1") -> tuple[int, dict, http.client.HTTPResponse]:
    c = http.client.HTTPConnection(host, port, timeout=10)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null"), r
    finally:
        c.close()


def counts(port: int) -> dict:
    code, body, _ = call(port, "GET", "/v1/status", headers=bearer(client_token(SECRET)))
    assert code == 200
    return body


def hello(name: str) -> bytes:
    return json.dumps({"hello": {"device": f"gpu-{name}", "predict_s": {"16": 0.001}, "max_prompt_tokens": 8192},
                       "status": {"at": time.time(), "epoch": time.time(), "idle_fraction": 1.0}}).encode()


def test_an_unauthenticated_submit_is_refused_before_its_body_is_read(controller, caplog):
    service, port = controller
    with caplog.at_level(logging.WARNING, logger="bubbletea_agent.controller.server"):
        code, body, resp = call(port, "POST", "/v1/prefill", b'{"prompt_tokens": 64, "id": "sneaky"}')
    assert code == 401 and body["error"] == "unauthorized"
    assert "Authorization: Bearer" in body["detail"] and TOKEN_FILE in body["detail"]
    assert resp.getheader("WWW-Authenticate", "").startswith("Bearer")
    assert "refused POST /v1/prefill from 127.0.0.1: no bearer token" in caplog.text
    # garbage without a token: 401, not 400 (nothing of it was parsed); every route, known or not
    assert call(port, "POST", "/v1/prefill", b"{not json")[0] == 401
    assert call(port, "GET", "/v1/status")[0] == 401
    assert call(port, "GET", "/v1/requests/sneaky")[0] == 401
    assert call(port, "GET", "/v1/nowhere")[0] == 401
    assert call(port, "GET", "/v1/status", headers={"Authorization": "Basic dXNlcjpwdw=="})[0] == 401
    assert call(port, "GET", "/v1/status", headers={"Authorization": "Bearer " + "0" * 64})[0] == 401
    assert "sneaky" not in service.d.entries
    c = counts(port)
    assert c["arrived"] == 0 and c["refused_bodies"] == 0
    assert c["unauthorized"] == 7 and c["unauthorized_by_reason"] == {"no_token": 6, "wrong_token": 1}
    # the run's client token goes in (the header's scheme in any case)
    code, body, _ = call(port, "POST", "/v1/prefill", b'{"prompt_tokens": 64, "id": "mine"}',
                         headers={"Authorization": f"bearer {client_token(SECRET)}"})
    assert code == 202 and body["id"] == "mine"


def test_an_agent_syncs_only_as_itself(controller):
    service, port = controller
    for token in (client_token(SECRET), agent_token(SECRET, "b"), agent_token(SECRET, "a") + "0"):
        code, body, _ = call(port, "POST", "/v1/agents/a/sync", hello("a"), bearer(token))
        assert code == 401 and "not the one of agent a in this run" in body["detail"]
    dev = service.d.devices["a"]
    assert dev.hello is None and dev.status is None and service.d.epoch is None  # the forged reports never landed
    assert counts(port)["unauthorized_by_reason"] == {"wrong_token": 3}
    code, _, _ = call(port, "POST", "/v1/agents/a/sync", hello("a"), bearer(agent_token(SECRET, "a")))
    assert code == 200 and service.d.devices["a"].hello is not None
    # a name that is no agent's, with the token the run would give it: known to be unknown
    code, body, _ = call(port, "POST", "/v1/agents/zz/sync", hello("zz"), bearer(agent_token(SECRET, "zz")))
    assert code == 404 and body["error"] == "unknown_agent"
    # the client token does not read as an agent's, nor an agent's as a client's
    assert call(port, "GET", "/v1/status", headers=bearer(agent_token(SECRET, "a")))[0] == 401


def test_a_token_of_another_run_is_refused(controller):
    service, port = controller
    stranger = PrefillClient("127.0.0.1", port, client_token(OTHER_RUN))
    with pytest.raises(ControllerRefused) as exc:
        stranger.submit(64, id="replayed")
    assert exc.value.status == 401 and exc.value.error.error == "unauthorized"
    with pytest.raises(ControllerRefused):
        stranger.status()
    link = AgentLink("127.0.0.1", port, "a", AgentHello(device="gpu-a", predict_s=PRED, max_prompt_tokens=8192),
                     wait_s=0.05, token=agent_token(OTHER_RUN, "a"))
    link.status(AgentStatus(at=time.time(), epoch=time.time(), idle_fraction=1.0))
    link.start()
    deadline = time.monotonic() + 5
    while link.errors == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    link._stop.set()
    assert link.errors >= 1 and link.syncs == 0
    assert service.d.devices["a"].hello is None and "replayed" not in service.d.entries
    c = counts(port)
    assert c["arrived"] == 0 and c["unauthorized_by_reason"]["wrong_token"] >= 3


def test_a_client_on_an_address_the_run_does_not_use_finds_nothing(controller):
    """The controller listens on the run's address (127.0.0.1 here), not every interface:
    another address of the same machine (127.0.0.2, on the loopback too) is refused by
    the kernel, so nothing reaches the controller."""
    _, port = controller
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
    c = counts(port)
    assert c["arrived"] == 0 and c["unauthorized"] == 0


def test_a_service_without_the_run_secret_does_not_serve():
    service = Service(Dispatcher(["a"], []))  # fed and ticked in tests; never on a socket
    with pytest.raises(RuntimeError, match="only with the run's secret"):
        service.app()


def test_tokens_differ_by_purpose_agent_and_run():
    tokens = {client_token(SECRET), agent_token(SECRET, "a"), agent_token(SECRET, "b"), client_token(OTHER_RUN),
              agent_token(OTHER_RUN, "a")}
    assert len(tokens) == 5 and all(len(t) == 64 for t in tokens)
    assert client_token(SECRET) == client_token(SECRET.encode())
    with pytest.raises(AuthError, match="empty"):
        client_token("")


def test_the_token_file_is_for_the_run_user_only(tmp_path: Path):
    path = tmp_path / TOKEN_FILE
    path.write_text("old\n")
    path.chmod(0o644)
    write_token_file(path, client_token(SECRET))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(tmp_path) == read_token_file(path) == client_token(SECRET)
    path.write_text("not a token\n")
    with pytest.raises(AuthError, match="not a controller token"):
        read_token_file(path)
    with pytest.raises(AuthError, match=r"cannot read the controller's client token .*readable by the run's user"):
        read_token_file(tmp_path / "missing")
    with pytest.raises(AuthError, match="ATLAS_SECRET"):
        run_secret({})
    assert run_secret({"ATLAS_SECRET": SECRET}) == SECRET


def test_the_runner_writes_the_token_and_binds_the_hosts_address(tmp_path: Path):
    from testbed.run.bubbletea import controller_bind, uses_controller, write_client_token
    from testbed_core.contracts.bubbletea import BubbleTeaSettings

    class S:
        bubbletea = BubbleTeaSettings(enabled=True, dispatch="controller")

    assert uses_controller(S) and controller_bind(S, "10.0.1.1") == "10.0.1.1"
    S.bubbletea = BubbleTeaSettings(enabled=True, compare_dispatch=["controller"], controller_bind="0.0.0.0")
    assert uses_controller(S) and controller_bind(S, "10.0.1.1") == "0.0.0.0"
    S.bubbletea = BubbleTeaSettings(enabled=True)
    assert not uses_controller(S)
    path = write_client_token(tmp_path, SECRET)
    assert path == tmp_path / TOKEN_FILE and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(tmp_path) == client_token(SECRET)


def test_the_controller_job_without_the_secret_says_where_it_comes_from(tmp_path: Path, monkeypatch):
    from bubbletea_agent.controller.server import run_job
    from testbed_core.contracts.bubbletea import BubbleTeaSettings
    from testbed_core.contracts.prefill_service import ControllerJob

    job = ControllerJob(bubbletea=BubbleTeaSettings(enabled=True, dispatch="controller"), host="127.0.0.1", port=0,
                        out=tmp_path / "ctl", agents=["a"])
    path = tmp_path / "job.json"
    path.write_text(job.model_dump_json())
    monkeypatch.delenv("ATLAS_SECRET", raising=False)
    with pytest.raises(AuthError, match="needs the run's secret in the environment variable ATLAS_SECRET"):
        run_job(path)
    assert not (tmp_path / "ctl" / TOKEN_FILE).exists()
    assert os.environ.get("ATLAS_SECRET") is None


def test_an_address_not_on_this_machine_says_how_to_choose_another(tmp_path: Path, monkeypatch):
    """A real machine's data address that is no interface's (a NAT address): the
    controller cannot bind it, and says which setting names another."""
    from bubbletea_agent.controller.server import run_job
    from testbed_core.contracts.bubbletea import BubbleTeaSettings
    from testbed_core.contracts.prefill_service import ControllerJob

    job = ControllerJob(bubbletea=BubbleTeaSettings(enabled=True, dispatch="controller"), host="192.0.2.1", port=0,
                        out=tmp_path / "ctl", agents=["a"])
    path = tmp_path / "job.json"
    path.write_text(job.model_dump_json())
    monkeypatch.setenv("ATLAS_SECRET", SECRET)
    with pytest.raises(SystemExit, match=r"cannot listen on 192\.0\.2\.1:0: .*bubbletea\.controller_bind"):
        run_job(path)
    assert read_token_file(tmp_path / "ctl") == client_token(SECRET)
