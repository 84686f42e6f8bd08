"""Admission decisions: fits, does not fit, chunking, guard adaptation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bubbletea_agent.admission import (
    Action,
    AdaptiveGuard,
    Admission,
    AdmissionConfig,
    GuardConfig,
    Pending,
)
from bubbletea_agent.latency import QuadraticLatency
from bubbletea_agent.requests import Request

MODEL = QuadraticLatency(a=0.001, b=1e-5, c=0.0)  # 1 ms + 10 us/token


def guard(**kw) -> AdaptiveGuard:
    base = dict(initial_rel=0.1, rel_floor=0.0, rel_ceiling=1.0, abs_floor_s=0.0, min_samples=4)
    return AdaptiveGuard(GuardConfig(**(base | kw)))


def adm(**kw) -> Admission:
    g = kw.pop("guard", None) or guard()
    return Admission(MODEL, AdmissionConfig(**kw), g)


def req(rid: str, tokens: int) -> Pending:
    return Pending(Request(rid, 0.0, tokens))


def test_fits_whole():
    a = adm()
    # 500 tokens: 6 ms predicted + 10% guard = 6.6 ms
    d = a.decide(0.0067, [req("r", 500)])
    assert d.action is Action.RUN and d.tokens == 500 and not d.chunked
    assert d.predicted_s == pytest.approx(0.006) and d.guard_s == pytest.approx(0.0006)


def test_does_not_fit_without_chunking():
    a = adm(chunking=False)
    d = a.decide(0.0065, [req("r", 500)])
    assert d.action is Action.WAIT and "nothing fits" in d.why
    assert a.decide(0.0, [req("r", 10)]).why == "slot over"
    assert a.decide(1.0, []).why == "queue empty"


def test_chunking_takes_the_largest_chunk_that_fits():
    a = adm(chunk_granularity=16, min_chunk_tokens=32)
    d = a.decide(0.0045, [req("r", 500)])
    assert d.action is Action.RUN and d.chunked
    assert d.tokens % 16 == 0 and d.tokens >= 32
    assert d.predicted_s + d.guard_s <= 0.0045
    assert MODEL.predict(d.tokens + 16) * 1.1 > 0.0045  # the next size up would not fit
    # the next chunk continues the prompt and goes first
    p = d.pending
    p.done_tokens += d.tokens
    d2 = a.decide(1.0, [req("other", 10), p])
    assert d2.pending is p and d2.context == d.tokens and d2.tokens == 500 - d.tokens


def test_chunk_below_minimum_is_not_run():
    a = adm(min_chunk_tokens=200)
    d = a.decide(0.002, [req("r", 500)])  # room for ~80 tokens only
    assert d.action is Action.WAIT


def test_chunk_size_cap():
    a = adm(max_chunk_tokens=64, chunk_granularity=16)
    d = a.decide(1.0, [req("r", 500)])
    assert d.tokens == 64 and d.chunked
    assert a.decide(1.0, [req("s", 50)]).tokens == 50


def test_lookahead_fills_the_slot_end_with_a_short_request():
    a = adm(chunking=False, lookahead=4)
    q = [req("long", 2000), req("short", 100)]
    d = a.decide(0.003, q)
    assert d.pending.request.id == "short"


def test_one_partial_cache_at_a_time():
    a = adm(max_in_progress=1, min_chunk_tokens=16)
    started = req("a", 1000)
    started.done_tokens = 500
    # "a" cannot fit its min chunk after 500 tokens? it can; make slot tiny so only fresh whole fits
    d = a.decide(0.0025, [started, req("b", 900), req("c", 50)])
    # a's chunk of ~100 tokens fits and it is in progress: it goes first
    assert d.pending is started
    d = adm(max_in_progress=1, min_chunk_tokens=400).decide(0.0025, [started, req("b", 900), req("c", 50)])
    # a's minimum chunk does not fit; "b" would need chunking (not allowed: one partial already); "c" fits whole
    assert d.pending.request.id == "c"


def test_guard_adapts_to_observed_errors():
    g = guard(quantile=0.9, min_samples=4, window=50)
    assert g.rel_margin == pytest.approx(0.1)  # initial, before enough samples
    for _ in range(30):
        g.observe(0.010, 0.0125)  # always 25% slower than predicted
    assert g.rel_margin == pytest.approx(0.25)
    a = Admission(MODEL, AdmissionConfig(chunking=False), g)
    # 500 tokens: 6 ms + 25% = 7.5 ms; fits in 7.6 ms, not in 7.4 ms
    assert a.decide(0.0076, [req("r", 500)]).action is Action.RUN
    assert a.decide(0.0074, [req("r", 500)]).action is Action.WAIT
    for _ in range(50):  # predictions become accurate: the window forgets the old errors
        g.observe(0.010, 0.0100)
    assert g.rel_margin == pytest.approx(0.0)


def test_guard_floor_and_ceiling():
    g = guard(rel_floor=0.05, rel_ceiling=0.3, abs_floor_s=0.0005, min_samples=1)
    g.observe(0.01, 0.005)  # faster than predicted: margin would be negative
    assert g.rel_margin == 0.05
    assert g.guard_s(0.01) == pytest.approx(0.0005 + 0.0005)
    for _ in range(10):
        g.observe(0.01, 0.05)  # 5x slower: clamp at the ceiling
    assert g.rel_margin == 0.3
    g.observe(0.0, 1.0)  # ignored (no prediction)
    with pytest.raises(ValidationError, match="rel_ceiling .* below rel_floor"):
        GuardConfig(rel_floor=0.5, rel_ceiling=0.1)


def test_too_long():
    a = adm(max_prompt_tokens=4096, min_chunk_tokens=64)
    r = Request("r", 0.0, 5000)
    assert "exceed the model context (4096)" in a.too_long(r, 1.0)
    ok = Request("ok", 0.0, 4000)
    assert a.too_long(ok, None) is None  # no slot known yet: only the context limit
    assert a.too_long(ok, 0.01) is None  # chunks of 64 tokens fit a 10 ms slot
    why = a.too_long(ok, 0.0012)  # 64 tokens need 1.64 ms + guard
    assert why is not None and "smallest chunk (64 tokens)" in why and "1.20 ms" in why
    whole = adm(chunking=False)
    assert "4000-token prefill" in whole.too_long(ok, 0.03)  # 41 ms needed
    assert whole.too_long(ok, 0.05) is None
