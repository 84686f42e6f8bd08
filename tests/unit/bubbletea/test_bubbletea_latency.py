"""Prefill latency model: the least-squares fit, chunk costs, profiling, searches."""

from __future__ import annotations

import numpy as np
import pytest

from bubbletea_agent.latency import (
    FunctionLatency,
    LatencyFitError,
    QuadraticLatency,
    fit,
    profile,
)


def test_fit_recovers_known_curve_with_noise():
    a, b, c = 0.004, 20e-6, 3e-9
    rng = np.random.default_rng(0)
    lengths = [16, 64, 128, 256, 512, 1024, 2048, 4096]
    samples = [(n, (a + b * n + c * n * n) * (1 + rng.normal(0, 0.01))) for n in lengths for _ in range(3)]
    m = fit(samples, source="test")
    assert m.a == pytest.approx(a, rel=0.05)
    assert m.b == pytest.approx(b, rel=0.1)
    assert m.c == pytest.approx(c, rel=0.1)
    assert m.rel_rmse < 0.02
    for n in (100, 1500, 3000):
        assert m.predict(n) == pytest.approx(a + b * n + c * n * n, rel=0.03)
    assert "test" in m.describe() and m.to_json()["samples"]


def test_fit_is_exact_on_exact_data_and_keeps_coefficients_non_negative():
    exact = fit([(n, 0.001 + 1e-5 * n) for n in (10, 100, 1000)])
    assert (exact.a, exact.b, exact.c) == pytest.approx((0.001, 1e-5, 0.0), abs=1e-12)
    # concave data: an unconstrained fit would take c < 0; the fit must not
    concave = fit([(n, 0.01 * np.sqrt(n)) for n in (16, 64, 256, 1024, 4096)])
    assert concave.a >= 0 and concave.b >= 0 and concave.c >= 0
    preds = [concave.predict(n) for n in range(1, 8000, 97)]
    assert all(x <= y for x, y in zip(preds, preds[1:], strict=False))  # never faster when longer


@pytest.mark.parametrize("samples, message", [
    ([(10, 0.1)], "at least 2"),
    ([(10, 0.1), (10, 0.2)], "single prompt length"),
    ([(10, 0.1), (0, 0.2)], "bad latency sample"),
    ([(10, 0.1), (20, float("nan"))], "bad latency sample"),
    ([(10, 0.1), (20, -1.0)], "bad latency sample"),
])
def test_fit_rejects_unusable_samples(samples, message):
    with pytest.raises(LatencyFitError, match=message):
        fit(samples)


def test_chunks_add_up_to_the_whole_prompt_plus_overheads():
    m = QuadraticLatency(0.002, 1e-5, 1e-9)
    whole = m.predict(1000)
    chunks = m.predict(300) + m.predict(300, context=300) + m.predict(400, context=600)
    assert chunks == pytest.approx(whole + 2 * m.a)
    assert m.predict(100, context=900) > m.predict(100)  # later chunks attend to more
    assert m.predict(0) == 0.0


def test_max_tokens_within():
    m = QuadraticLatency(0.002, 1e-5, 1e-9)
    n = m.max_tokens_within(0.01)
    assert m.predict(n) <= 0.01 < m.predict(n + 1)
    assert m.max_tokens_within(0.001) == 0  # below the fixed cost
    assert m.max_tokens_within(10.0, limit=50) == 50
    k = m.max_tokens_within(0.01, context=2000)
    assert m.predict(k, 2000) <= 0.01 < m.predict(k + 1, 2000) and k < n
    f = FunctionLatency(lambda t, p: 0.001 * t + 0.0001 * p)
    assert f.max_tokens_within(0.05) == 50
    assert f.max_tokens_within(0.05, context=100) == 40


def test_profile_takes_the_median_and_warms_up():
    calls = []

    def run_once(n):
        calls.append(n)
        return {1: 0.5, 2: 0.01, 3: 0.011}.get(len([c for c in calls if c == n]), 0.012) * n

    samples = profile(run_once, lengths=[10, 20], repeats=3, warmup=1)
    assert calls[0] == 10 and len(calls) == 7  # one warm-up run, then 3 per length
    assert samples[0] == (10, pytest.approx(0.11))  # runs 2-4 of n=10: 0.01, 0.011, 0.012 -> median
    m = fit(samples)
    assert m.predict(20) == pytest.approx(samples[1][1], rel=1e-6)
