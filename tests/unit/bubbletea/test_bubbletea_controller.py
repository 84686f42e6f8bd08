"""The prefill controller's dispatcher (sans-IO): where each request goes, and every refusal."""

from __future__ import annotations

import math

import pytest

from bubbletea_agent.controller.dispatch import Dispatcher, Predictor, Refusal, capacity_times
from bubbletea_agent.requests import Request
from testbed_core.contracts.prefill_service import (
    AgentHello,
    AgentStatus,
    AgentSync,
    EndedRequest,
    Window,
)

T0 = 1000.0
PRED = {16: 0.0016, 1024: 0.1024, 4096: 0.4096}  # 0.1 ms per token


def hello(dev: str, decode: str | None = "dc1-h2", context: int = 8192) -> AgentHello:
    return AgentHello(device=dev, decode_host=decode, predict_s=PRED, max_prompt_tokens=context)


def status(now: float = T0, **kw) -> AgentStatus:
    base = dict(at=now, epoch=T0 - 1, live_end=None, upcoming=[], idle_fraction=0.5, backlog_s=0.0)
    base.update(kw)
    return AgentStatus(**base)


def ready(d: Dispatcher, name: str, now: float = T0, decode: str | None = "dc1-h2", **kw) -> None:
    d.sync(name, AgentSync(hello=hello(name, decode), status=status(now, **kw)), now)


def req(rid: str, tokens: int = 1024, deadline: float | None = 2.0, at: float = T0) -> Request:
    return Request(rid, at, tokens, 0, deadline)


def eager(*args, **kw) -> Dispatcher:
    """A dispatcher that sends each request on arrival (no late binding): for tests of
    where a request goes, with statuses that never change."""
    return Dispatcher(*args, commit_ahead_s=None, **kw)


def test_predictor_interpolates_and_extrapolates():
    p = Predictor(PRED)
    assert p(1024) == pytest.approx(0.1024)
    assert p(2048) == pytest.approx(0.2048)
    assert p(8192) == pytest.approx(0.8192)  # beyond the points: the last segment's slope
    assert p(8) == pytest.approx(0.0008)
    with pytest.raises(ValueError, match="no prefill predictions"):
        Predictor({})


def test_capacity_walks_live_window_slots_then_idle_share():
    st = status(live_end=T0 + 0.1, upcoming=[Window(start=T0 + 0.5, end=T0 + 0.7)], idle_fraction=0.25)
    a, b, c = capacity_times(st, T0, [0.05, 0.2, 0.4])
    assert a == pytest.approx(T0 + 0.05)  # inside the open window
    assert b == pytest.approx(T0 + 0.6)  # 0.1 from the window, 0.1 into the slot
    assert c == pytest.approx(T0 + 0.7 + 0.1 / 0.25)  # past the known slots: the idle share


def test_request_goes_to_the_device_that_finishes_it_soonest():
    d = Dispatcher(["a", "b"], ["dc1-h2"])
    ready(d, "a", backlog_s=1.0)
    ready(d, "b", backlog_s=0.0)
    e = d.submit(req("r1"), T0)
    assert e.device == "b" and e.state == "dispatched"
    reply = d.sync("b", AgentSync(status=status()), T0)
    assert [w.id for w in reply.work] == ["r1"] and reply.work[0].deadline_s == 2.0


def test_work_sent_since_the_last_status_counts_against_the_device():
    d = eager(["a", "b"], ["dc1-h2"])
    ready(d, "a")
    ready(d, "b")
    devices = [d.submit(req(f"r{i}"), T0).device for i in range(6)]
    assert devices.count("a") == 3 and devices.count("b") == 3  # a burst between syncs spreads


def test_deadline_unreachable_is_rejected_with_the_reason():
    d = Dispatcher(["a"], ["dc1-h2"])
    ready(d, "a", backlog_s=2.0, idle_fraction=0.5)  # 4 s of wall time before it could start
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1", deadline=1.0), T0)
    assert exc.value.code == "deadline_unreachable"
    assert "within its 1 s deadline" in exc.value.detail
    assert d.ledger.get("r1").reason == "deadline_unreachable"


def test_longer_than_the_context_is_too_long():
    d = Dispatcher(["a"], ["dc1-h2"])
    ready(d, "a")
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1", tokens=10000), T0)
    assert exc.value.code == "too_long" and exc.value.field == "prompt_tokens"
    assert "10000 prompt tokens exceed the model context (8192)" in exc.value.detail


def test_bigger_than_any_bubble_could_hold_is_too_long():
    d = Dispatcher(["a"], ["dc1-h2"], horizon_s=10.0)
    ready(d, "a", idle_fraction=0.02)  # 4096 tokens = 0.41 s of device time = 20 s of wall time
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1", tokens=4096, deadline=None), T0)
    assert exc.value.code == "too_long"
    assert "even on the emptiest device's bubbles (limit 10 s)" in exc.value.detail


def test_unknown_decode_host_names_the_known_ones():
    d = Dispatcher(["a"], ["dc1-h2", "dc2-h2"])
    ready(d, "a")
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1"), T0, decode_host="dc9-h1")
    assert exc.value.code == "unknown_decode_host" and exc.value.field == "decode_host"
    assert "unknown decode host 'dc9-h1' (decode hosts: dc1-h2, dc2-h2)" in exc.value.detail
    d.ledger.check()


def test_decode_host_restricts_the_devices():
    d = eager(["a", "b"], ["dc1-h2", "dc2-h2"])
    ready(d, "a", decode="dc1-h2")
    ready(d, "b", decode="dc2-h2", backlog_s=0.5)
    assert d.submit(req("r1"), T0, decode_host="dc2-h2").device == "b"


def test_duplicate_id_is_refused_and_not_recorded_twice():
    d = Dispatcher(["a"], ["dc1-h2"])
    ready(d, "a")
    d.submit(req("r1"), T0)
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1"), T0)
    assert exc.value.code == "duplicate_id" and not exc.value.recorded
    assert d.ledger.counts()["arrived"] == 1


def test_queued_until_a_device_is_ready_then_dispatched_or_expired():
    d = Dispatcher(["a"], ["dc1-h2"])
    e1 = d.submit(req("r1", deadline=1.0), T0)
    e2 = d.submit(req("r2", deadline=5.0), T0)
    assert e1.state == e2.state == "queued"
    d.tick(T0 + 1.5)
    assert d.ledger.get("r1").reason == "deadline_passed"
    ready(d, "a", now=T0 + 2)
    d.tick(T0 + 2)
    assert e2.state == "dispatched" and e2.device == "a"


def test_agent_reports_end_requests_with_controller_ttft():
    d = eager(["a"], ["dc1-h2"])
    ready(d, "a")
    d.submit(req("r1"), T0)
    d.submit(req("r2"), T0)
    d.sync("a", AgentSync(status=status()), T0)
    ended = [EndedRequest(id="r1", status="served", kv_arrival=T0 + 0.3, start=T0 + 0.1, end=T0 + 0.2, chunks=1),
             EndedRequest(id="r2", status="rejected", reason="deadline_passed", detail="waited")]
    d.sync("a", AgentSync(status=status(), ended=ended), T0 + 0.4)
    assert d.ledger.get("r1").ttft == pytest.approx(0.3)
    assert d.ledger.get("r2").reason == "deadline_passed" and "at a: waited" in d.ledger.get("r2").detail
    d.ledger.check()
    assert d.served_ttfts() == [pytest.approx(0.3)]


def test_agent_that_stops_with_open_work_loses_it_with_a_reason():
    d = Dispatcher(["a"], ["dc1-h2"])
    ready(d, "a")
    d.submit(req("r1"), T0)
    reply = d.sync("a", AgentSync(status=status(), final=True), T0)
    assert reply.stop
    assert d.ledger.get("r1").reason == "agent_lost"
    with pytest.raises(Refusal) as exc:
        d.submit(req("r2"), T0)
    assert exc.value.code == "no_device"


def test_finish_ends_everything_open():
    d = Dispatcher(["a"], ["dc1-h2"])
    d.submit(req("r1", deadline=100), T0)
    ready(d, "a")
    d.submit(req("r2"), T0)
    d.finish(T0 + 1)
    assert {r.reason for r in d.ledger.records.values()} == {"run_ended"}
    d.ledger.check()


def test_unknown_agent_and_missing_hello_are_refused():
    d = Dispatcher(["a"], [])
    with pytest.raises(Refusal, match="agent 'zz' is not one of this controller's agents"):
        d.sync("zz", AgentSync(status=status()), T0)
    with pytest.raises(Refusal, match="the first sync must carry a hello"):
        d.sync("a", AgentSync(status=status()), T0)


def test_status_ended_device_takes_no_work():
    d = eager(["a", "b"], ["dc1-h2"])
    ready(d, "a", ended=True)
    ready(d, "b", backlog_s=0.3)
    assert d.submit(req("r1"), T0).device == "b"
    assert not math.isinf(d.devices["b"].open["r1"])


def test_work_in_a_lost_reply_is_sent_again_until_the_agent_confirms_it():
    d = eager(["a"], ["dc1-h2"])
    ready(d, "a")
    d.submit(req("r1"), T0)
    first = d.sync("a", AgentSync(status=status()), T0)
    assert [w.id for w in first.work] == ["r1"] and first.first == 0
    again = d.sync("a", AgentSync(status=status(), received=0), T0)  # the first reply never arrived
    assert [w.id for w in again.work] == ["r1"]
    d.submit(req("r2"), T0)
    after = d.sync("a", AgentSync(status=status(), received=1), T0)
    assert [w.id for w in after.work] == ["r2"] and after.first == 1


def test_an_agent_not_heard_from_gets_no_new_work():
    d = eager(["a", "b"], ["dc1-h2"], stale_s=1.0)
    ready(d, "a", now=T0)
    ready(d, "b", now=T0 + 2.0, backlog_s=0.5)
    assert d.submit(req("r1", at=T0 + 2.0), T0 + 2.0).device == "b"  # a is silent for 2 s


def test_queued_requests_wait_for_a_sync_and_expire_in_order():
    # no device is ready when they arrive: they wait undecided, and expire while no device is
    d = Dispatcher(["a"], ["dc1-h2"])
    for i in range(3):
        d.submit(req(f"r{i}", deadline=1.0, at=T0 + 0.1 * i), T0 + 0.1 * i)
    d.tick(T0 + 1.05)  # r0 expired (waited 1.05 s), r1 not yet: the scan stops there
    assert d.ledger.get("r0").reason == "deadline_passed" and list(d.queue) == ["r1", "r2"]
    ready(d, "a", now=T0 + 0.7, idle_fraction=1.0)
    d.tick(T0 + 0.7)
    assert not d.queue and d.entries["r1"].device == "a"
    # r2 would finish after r1: 0.7 + 2 x 0.1024 s, 0.8 s after it arrived, within its 1 s
    assert d.entries["r2"].device == "a"


def test_a_request_is_refused_at_arrival_when_no_device_finishes_it_within_its_deadline():
    d = eager(["a"], ["dc1-h2"])
    ready(d, "a", idle_fraction=0.1)  # 0.1024 s of prefill takes ~1 s of wall time
    with pytest.raises(Refusal) as exc:
        d.submit(req("r1", deadline=0.9), T0)
    assert exc.value.code == "deadline_unreachable" and "prefill it within its 0.9 s" in exc.value.detail
    assert d.submit(req("r2", deadline=1.1), T0).device == "a"


def test_late_binding_holds_a_request_until_its_bubble_is_near_then_sends_it():
    d = Dispatcher(["a"], ["dc1-h2"], commit_ahead_s=0.1)
    ready(d, "a", upcoming=[Window(start=T0 + 0.5, end=T0 + 0.9)], idle_fraction=0.1)
    e = d.submit(req("r1", deadline=1.0), T0)
    assert e.state == "queued" and e.device is None and e.planned == "a"
    assert e.predicted_start == pytest.approx(T0 + 0.5)
    # the next arrival is planned behind it (r1's 0.1024 s on the same device)
    e2 = d.submit(req("r2", deadline=1.0), T0)
    assert e2.predicted_start == pytest.approx(T0 + 0.6024)
    assert not d.sync("a", AgentSync(status=status(upcoming=[Window(start=T0 + 0.5, end=T0 + 0.9)])), T0).work
    d.tick(T0 + 0.3)  # 0.2 s before the bubble: not yet
    assert e.state == "queued"
    d.tick(T0 + 0.41)  # within the lead: sent, ahead of the bubble; r2 not yet
    assert e.state == "dispatched" and e.device == "a" and e.dispatched_at == pytest.approx(T0 + 0.41)
    assert e2.state == "queued"
    reply = d.sync("a", AgentSync(status=status(T0 + 0.41, upcoming=[Window(start=T0 + 0.5, end=T0 + 0.9)])),
                   T0 + 0.41)
    assert [w.id for w in reply.work] == ["r1"]


def test_late_binding_sends_to_the_device_whose_bubble_really_came_first():
    d = Dispatcher(["a", "b"], ["dc1-h2"], commit_ahead_s=0.1)
    ready(d, "a", upcoming=[Window(start=T0 + 0.4, end=T0 + 0.8)], idle_fraction=0.1)
    ready(d, "b", upcoming=[Window(start=T0 + 0.6, end=T0 + 1.0)], idle_fraction=0.1)
    e = d.submit(req("r1", deadline=1.0), T0)
    assert e.planned == "a" and e.state == "queued"
    ready(d, "b", now=T0 + 0.1, live_end=T0 + 0.5)  # b's window opened early: it syncs that
    d.tick(T0 + 0.1)
    assert e.state == "dispatched" and e.device == "b"
    assert not d.devices["a"].sent and d._planned == {}


def test_late_binding_serves_what_it_admitted_and_frees_its_planned_time():
    d = Dispatcher(["a"], ["dc1-h2"], commit_ahead_s=0.1)
    ready(d, "a", upcoming=[Window(start=T0 + 0.8, end=T0 + 0.83)], idle_fraction=0.01)
    e = d.submit(req("r1", tokens=256, deadline=1.0), T0)
    assert e.state == "queued" and d._planned["a"] == pytest.approx(0.0256)
    with pytest.raises(Refusal) as exc:  # the next bubble is 0.8 s away
        d.submit(req("r2", tokens=256, deadline=0.5), T0)
    assert exc.value.code == "deadline_unreachable"
    e3 = d.submit(req("r3", tokens=16, deadline=0.9), T0)  # behind r1, in the window: waits here
    assert e3.state == "queued" and d._planned["a"] == pytest.approx(0.0256 + 0.0016)
    d.tick(T0 + 0.5)
    assert e.state == e3.state == "queued"
    d.tick(T0 + 0.95)  # nobody synced: r3 waited past its deadline here, but it was admitted: sent all the same
    assert d.ledger.get("r3").reason is None and e3.state == "dispatched"
    assert e.state == "dispatched" and not d.queue and d._planned == {}
    d.finish(T0 + 2.0)


def test_waiting_requests_go_shortest_first_and_arrival_order_is_kept_when_asked():
    for order, first in (("shortest", "short"), ("arrival", "long")):
        d = Dispatcher(["a"], ["dc1-h2"], commit_ahead_s=0.1, order=order)
        ready(d, "a", upcoming=[Window(start=T0 + 0.5, end=T0 + 0.9)], idle_fraction=0.01)
        d.submit(req("long", tokens=2048, deadline=1.0), T0)
        short = d.submit(req("short", tokens=256, deadline=1.0), T0 + 0.01)
        # shortest first: the short one is planned ahead of the long one (which arrived first)
        assert short.predicted_start == pytest.approx(T0 + 0.5 if order == "shortest" else T0 + 0.7048)
        d.tick(T0 + 0.45)
        sent = [w.id for w in d.devices["a"].sent]
        assert sent and sent[0] == first, (order, sent)


def test_backlog_drains_from_when_the_agent_reported_it():
    d = Dispatcher(["a"], ["dc1-h2"], commit_ahead_s=None)
    ready(d, "a", now=T0, live_end=T0 + 1.0, backlog_s=0.3)  # an open window, 0.3 s queued at T0
    e = d.submit(req("r1", tokens=16, at=T0 + 0.2), T0 + 0.2)
    assert e.predicted_start == pytest.approx(T0 + 0.3)  # 0.1 s of it left at T0 + 0.2, not 0.3
    e2 = d.submit(req("r2", tokens=16, at=T0 + 0.5), T0 + 0.5)
    assert e2.predicted_start == pytest.approx(T0 + 0.5)  # all of it done by now: starts at once


def test_shortest_first_counts_only_the_shorter_work_sent_ahead():
    d = Dispatcher(["a", "b"], ["dc1-h2"], order="shortest")
    ready(d, "a", live_end=T0 + 10.0)
    ready(d, "b", live_end=T0 + 10.0)
    for i in range(4):  # long ones, two per device
        d.submit(req(f"long{i}", tokens=4096, deadline=5.0), T0)
    ready(d, "a", live_end=T0 + 10.0, backlog_s=2 * 0.4096, taken=2)
    ready(d, "b", live_end=T0 + 10.0, backlog_s=2 * 0.4096, taken=2)
    short = d.submit(req("short", tokens=16, deadline=0.1), T0)  # runs before the long ones queued
    assert short.state == "dispatched" and short.predicted_start == pytest.approx(T0)
    # another short one goes behind the first short one, to the other device
    short2 = d.submit(req("short2", tokens=16, deadline=0.1), T0)
    assert short2.device != short.device and short2.predicted_start == pytest.approx(T0)
    # a longer one than all of them waits for all: FIFO's estimate
    late = d.submit(req("later", tokens=4096, deadline=5.0, at=T0 + 0.01), T0 + 0.01)
    assert late.predicted_start == pytest.approx(T0 + 2 * 0.4096 + 0.0016)


def test_a_source_request_is_sent_ahead_and_placed_for_its_arrival():
    from bubbletea_agent.controller.server import Service

    d = Dispatcher(["a"], ["dc1-h2"])
    ready(d, "a", live_end=T0 + 10.0)
    svc = Service(d, [Request("s0", 1.0, 256, 0, 1.0)], clock=lambda: T0, presend_s=0.3)
    d.epoch = T0  # request time zero: s0 arrives at T0 + 1.0
    assert svc.feed(T0 + 0.5) == pytest.approx(0.01)  # not yet: 0.2 s before its release
    assert "s0" not in d.entries
    svc.feed(T0 + 0.71)  # 0.29 s before it arrives: sent, placed for its arrival
    e = d.entries["s0"]
    assert e.state == "dispatched" and e.arrival == T0 + 1.0 and e.dispatched_at == pytest.approx(T0 + 0.71)
    assert e.predicted_start == pytest.approx(T0 + 1.0)  # not before it arrives
    reply = d.sync("a", AgentSync(status=status(T0 + 0.72, live_end=T0 + 10.0)), T0 + 0.72)
    assert reply.work[0].arrival == T0 + 1.0
    assert d.ledger.get("s0").arrival == T0 + 1.0  # TTFT counts from its arrival


def test_admission_stretches_a_device_by_how_much_slower_it_finished_its_recent_requests():
    d = eager(["a", "b"], ["dc1-h2"])
    ready(d, "a", idle_fraction=1.0)
    ready(d, "b", idle_fraction=0.25)
    for i in range(8):  # a ended 8 admitted requests 4x later after arrival than its bubbles predicted
        e = d.submit(req(f"r{i}", tokens=1024, deadline=2.0), T0)
        assert e.device == "a"
        end = T0 + 4 * (e.admitted_finish - T0)
        d.sync("a", AgentSync(status=status(T0, idle_fraction=1.0, taken=i + 1), received=i + 1, ended=[
            EndedRequest(id=f"r{i}", status="served", start=end - 0.1, end=end, kv_arrival=end)]), T0)
    assert d.devices["a"].slowness(T0 + 1.0) == pytest.approx(4.0)
    # a would finish 0.1 s after arrival by its bubbles, 0.4 s stretched; b 0.41 s: a still
    assert d.submit(req("x", deadline=2.0), T0).device == "a"
    with pytest.raises(Refusal):  # neither finishes within 0.3 s
        d.submit(req("y", deadline=0.3), T0)
    # ratios older than LATE_AGE_S no longer count (x, still open, is overdue by then: it counts)
    d.devices["a"].pop_open("x")
    assert d.devices["a"].slowness(T0 + 10.0) == 1.0


def test_a_request_is_refused_at_arrival_when_no_agent_synced_lately():
    d = eager(["a"], ["dc1-h2"], stale_s=1.0)
    ready(d, "a", now=T0)
    with pytest.raises(Refusal) as exc:  # training runs, but a has been silent for 2 s
        d.submit(req("r1", at=T0 + 2.0), T0 + 2.0)
    assert exc.value.code == "no_device" and "synced for 2.00 s" in exc.value.detail
    assert not d.queue


def test_a_device_whose_admitted_requests_are_overdue_is_stretched_before_any_ends():
    d = eager(["a"], ["dc1-h2"])
    ready(d, "a", idle_fraction=1.0)
    e = d.submit(req("r1", tokens=1024, deadline=2.0), T0)
    assert d.devices["a"].slowness(T0 + 0.05) == 1.0  # not due yet
    # predicted to finish 0.1024 s after arrival; 0.5 s later it has not ended: 4.9x
    assert d.devices["a"].slowness(T0 + 0.5) == pytest.approx(0.5 / (e.admitted_finish - T0))
    d.sync("a", AgentSync(status=status(T0 + 0.5, idle_fraction=1.0, taken=1), received=1, ended=[
        EndedRequest(id="r1", status="served", start=T0 + 0.4, end=T0 + 0.5, kv_arrival=T0 + 0.5)]), T0 + 0.5)
    assert d.devices["a"].slowness(T0 + 0.6) == 1.0  # ended: one ratio is not LATE_MIN of them
