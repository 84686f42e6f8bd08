"""Admission decisions (bubbletea_agent/admission.py): fits, does not fit, chunking,
guard adaptation, and the layer-granular pieces of a preemptible hold."""

from __future__ import annotations

from typing import Any

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
from bubbletea_agent.latency import FunctionLatency, QuadraticLatency
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


# ------------------------------------------------------------------ layer-granular pieces (preemptible holds)


LAYERS = 4


def layer_charge(tokens: int, context: int) -> float:
    """4 ms per chunk (the weights) + 100 us per token."""
    return 0.004 + 1e-4 * tokens


def hold_admission(**cfg: Any) -> Admission:
    return Admission(FunctionLatency(layer_charge), AdmissionConfig(**cfg),
                     AdaptiveGuard(GuardConfig(initial_rel=0.0, rel_floor=0.0, abs_floor_s=0.0005)))


def test_pieces_within_counts_layers_that_fit_with_the_guard() -> None:
    a = hold_admission()
    assert a.guard.hold_margin == 0.005  # no overrun seen yet: the ceiling
    assert a.pieces_within(0.010, 4, 0.0455) == 4
    assert a.pieces_within(0.010, 4, 0.0349) == 2  # 3 x 10 ms + 5 ms guard would not fit
    assert a.pieces_within(0.010, 4, 0.0140) == 0
    assert a.pieces_within(0.010, 2, 1.0) == 2  # never more than are left
    assert a.pieces_within(0.010, 2, float("inf")) == 2


def test_the_hold_guard_learns_how_late_layer_groups_end() -> None:
    g = AdaptiveGuard(GuardConfig(abs_floor_s=0.0005, hold_ceiling_s=0.005, min_samples=4))
    for late in (0.0001, 0.0002, 0.0001, 0.0003):
        g.observe(0.010, 0.010 + late)
    assert g.hold_margin == 0.0005  # small overruns: the floor
    for _ in range(20):
        g.observe(0.002, 0.004)  # 2 ms late, whatever the group's length
    assert g.hold_margin == pytest.approx(0.002)
    for _ in range(50):
        g.observe(0.002, 0.050)
    assert g.hold_margin == 0.005  # clamped: a stalled host is not what the guard is for


def test_next_pieces_continues_the_started_chunk_first() -> None:
    a = hold_admission()
    started = Pending(Request("r1", 0.0, 1000), chunk_tokens=1000, chunk_pieces_done=3)
    fresh = Pending(Request("r2", 0.1, 10))
    run = a.next_pieces(0.5, [fresh, started], LAYERS, chunk_cap=2048)
    assert run is not None and run.pending is started and run.pieces == 1 and run.finishes_chunk
    assert run.piece_s == pytest.approx(layer_charge(1000, 0) / LAYERS)
    # no room for its next layer: nothing else jumps ahead of it
    assert a.next_pieces(0.02, [fresh, started], LAYERS, chunk_cap=2048) is None


def test_next_pieces_cuts_new_chunks_at_the_cap() -> None:
    a = hold_admission()
    p = Pending(Request("r1", 0.0, 5000))
    run = a.next_pieces(10.0, [p], LAYERS, chunk_cap=2048)
    assert run.tokens == 2048 and run.pieces == LAYERS
    capped = hold_admission(max_chunk_tokens=256).next_pieces(10.0, [p], LAYERS, chunk_cap=2048)
    assert capped.tokens == 256
