"""Request sources (Poisson, CSV trace) and the request ledger's accounting."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from bubbletea_agent.requests import (
    FixedLength,
    LedgerError,
    LogNormalLength,
    PoissonSource,
    Reason,
    Request,
    RequestLedger,
    TraceError,
    TraceSource,
    UniformLength,
    load_requests,
)

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_poisson_rate_and_seed():
    src = PoissonSource(rate_per_s=50, lengths=FixedLength(tokens=128), seed=3, duration_s=40)
    reqs = src.requests()
    assert abs(len(reqs) / 40 - 50) < 50 * 0.1  # within 10% of the rate
    assert all(r.prompt_tokens == 128 for r in reqs)
    assert all(0 < r.arrival_s < 40 for r in reqs)
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    assert reqs == src.requests()  # same seed, same requests
    other = PoissonSource(rate_per_s=50, lengths=FixedLength(tokens=128), seed=4, duration_s=40)
    assert other.requests() != reqs
    gaps = np.diff([r.arrival_s for r in reqs])
    assert abs(gaps.std() / gaps.mean() - 1) < 0.15  # exponential gaps: CV ~ 1


def test_poisson_count_and_zero_rate():
    src = PoissonSource(rate_per_s=10, lengths=FixedLength(tokens=8), count=7, deadline_s=2)
    reqs = src.requests()
    assert len(reqs) == 7 and len({r.id for r in reqs}) == 7
    assert reqs[0].expires_at() == reqs[0].arrival_s + 2
    assert PoissonSource(rate_per_s=0, lengths=FixedLength(tokens=8), count=5).requests() == []


def test_poisson_needs_an_end():
    with pytest.raises(ValidationError, match="duration_s or count"):
        PoissonSource(rate_per_s=1, lengths=FixedLength(tokens=8))


def test_length_distributions():
    rng = np.random.default_rng(0)
    u = UniformLength(min=10, max=20).sample(rng, 5000)
    assert u.min() >= 10 and u.max() <= 20 and set(np.unique(u)) == set(range(10, 21))
    ln = LogNormalLength(median=500, sigma=0.8, min=16, max=4000).sample(rng, 20000)
    assert ln.min() >= 16 and ln.max() <= 4000
    assert abs(np.median(ln) / 500 - 1) < 0.05
    ln_mean = LogNormalLength(mean=500, sigma=0.8, max=10**7).sample(rng, 40000)
    assert abs(ln_mean.mean() / 500 - 1) < 0.05
    with pytest.raises(ValidationError, match="max .* below min"):
        UniformLength(min=30, max=20)
    with pytest.raises(ValidationError, match="exactly one of median or mean"):
        LogNormalLength(sigma=1)


def test_trace_azure_shape(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_HEAD
                    + "2023-11-16 18:15:46.6805900,374,44\n"
                    + "2023-11-16 18:15:50.9951690,396,109\n"
                    + "2023-11-16 18:15:47.0000000,879,20\n")
    reqs = TraceSource(path=path).requests()
    assert [r.prompt_tokens for r in reqs] == [374, 879, 396]  # kept in time order
    assert reqs[0].arrival_s == 0
    assert reqs[1].arrival_s == pytest.approx(0.31941, abs=1e-5)
    assert reqs[2].arrival_s == pytest.approx(4.314579, abs=1e-5)
    assert reqs[2].generated_tokens == 109
    fast = TraceSource(path=path, speedup=2.0, start_s=1.0, limit=2, deadline_s=3).requests()
    assert len(fast) == 2 and fast[1].arrival_s == pytest.approx(1 + 0.31941 / 2, abs=1e-5)
    assert fast[0].deadline_s == 3


def test_trace_custom_columns_numeric_time(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("ts,prompt,extra\n10.5,100,x\n11.0,200,y\n")
    reqs = load_requests(TraceSource(path=path, timestamp_column="ts", tokens_column="prompt",
                                     generated_column=None))
    assert [(r.arrival_s, r.prompt_tokens) for r in reqs] == [(0.0, 100), (0.5, 200)]


@pytest.mark.parametrize("body, message", [
    ("2023-11-16 18:15:46,374,44\nyesterday,12,3\n", r"t.csv:3: timestamp 'yesterday'"),
    ("1.0,374,44\n2.0,many,3\n", r"t.csv:3: ContextTokens 'many' is not a number"),
    ("1.0,374,44\n2.0,-5,3\n", r"t.csv:3: ContextTokens '-5' is not a whole, non-negative"),
    ("1.0,374,44\n2.0,12.5,3\n", r"t.csv:3: ContextTokens '12.5' is not a whole"),
    ("1.0,374,44\n2.0,0,3\n", r"t.csv:3: ContextTokens is 0"),
    ("1.0,374,44\n2.0,300\n", r"t.csv:3: expected 3 fields"),
    ("1.0,374,44\n2.0,300,3,9\n", r"t.csv:3: expected 3 fields"),
    ("1.0,374,44\n2.0,300,lots\n", r"t.csv:3: GeneratedTokens 'lots'"),
])
def test_trace_malformed_rows_name_the_line(tmp_path, body, message):
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEAD + body)
    with pytest.raises(TraceError, match=message):
        TraceSource(path=path).requests()


def test_trace_missing_column_file_and_empty(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,tokens\n1,2\n")
    with pytest.raises(TraceError, match=r"t.csv:1: no column 'TIMESTAMP' .*timestamp_column"):
        TraceSource(path=path).requests()
    with pytest.raises(TraceError, match=r"nope.csv: no such request trace file"):
        TraceSource(path=tmp_path / "nope.csv").requests()
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty trace"):
        TraceSource(path=empty).requests()


def test_shard_splits_a_source_without_loss():
    base = dict(rate_per_s=20, lengths=FixedLength(tokens=8), count=101, seed=1)
    whole = PoissonSource(**base).requests()
    parts = [PoissonSource(**base, shard_index=i, shard_count=3).requests() for i in range(3)]
    assert sorted(r.id for p in parts for r in p) == sorted(r.id for r in whole)
    assert all(len(p) in (33, 34) for p in parts)
    with pytest.raises(ValidationError, match="shard_index 3 .* shard_count 3"):
        PoissonSource(**base, shard_index=3, shard_count=3)


def test_ledger_every_request_ends_once():
    seen = []
    ledger = RequestLedger(on_end=lambda rec: seen.append((rec.id, rec.status)))
    a, b, c = (Request(x, 1.0, 10) for x in "abc")
    for r in (a, b, c):
        ledger.arrive(r)
    ledger.serve("a", 1.25)
    ledger.reject("b", Reason.QUEUE_FULL, "queue of 4 is full")
    with pytest.raises(LedgerError, match="1 request.*never ended.*'c'"):
        ledger.check()
    with pytest.raises(LedgerError, match="'a' already ended as served"):
        ledger.reject("a", Reason.DEADLINE_PASSED)
    with pytest.raises(LedgerError, match="'zz' never arrived"):
        ledger.serve("zz", 2.0)
    with pytest.raises(LedgerError, match="arrived twice"):
        ledger.arrive(a)
    assert ledger.close() == 1
    ledger.check(expected=["a", "b", "c"])
    with pytest.raises(LedgerError, match="never arrived: \\['d'\\]"):
        ledger.check(expected=["a", "d"])
    counts = ledger.counts()
    assert counts["served"] == 1 and counts["rejected"] == 2
    assert counts["rejected_by_reason"] == {"queue_full": 1, "run_ended": 1}
    assert ledger.get("a").ttft == pytest.approx(0.25)
    assert seen == [("a", "served"), ("b", "rejected"), ("c", "rejected")]
