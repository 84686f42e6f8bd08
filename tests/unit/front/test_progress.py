"""The progress reporter: estimates of time left, plain lines off a terminal, one
updating line on it, and children (a run's steps inside a sweep point)."""

from __future__ import annotations

import io

import pytest

from testbed.progress import Progress, format_duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(total: int = 4, **kw) -> tuple[Progress, Clock, io.StringIO]:
    clock, stream = Clock(), io.StringIO()
    kw.setdefault("tty", False)
    return Progress(total, "sweep x", stream=stream, clock=clock, **kw), clock, stream


def timed(p: Progress, clock: Clock, name: str, seconds: float, ok: bool = True) -> None:
    p.start(name)
    clock.now += seconds
    p.done(name, ok=ok)


def test_eta_is_mean_duration_times_steps_left() -> None:
    p, clock, _ = make(4)
    assert p.eta_s() is None
    timed(p, clock, "a", 10)
    timed(p, clock, "b", 20)
    assert p.eta_s() == pytest.approx(2 * 15)


def test_running_step_counts_what_it_still_needs() -> None:
    p, clock, _ = make(3)
    timed(p, clock, "a", 10)
    p.start("b")
    clock.now += 4
    assert p.eta_s() == pytest.approx(6 + 10)
    clock.now += 20  # overran the mean: never a negative estimate
    assert p.eta_s() == pytest.approx(10)


def test_skipped_steps_are_done_but_not_timed() -> None:
    p, clock, stream = make(4)
    p.skip("a")
    p.skip("b")
    timed(p, clock, "c", 8)
    assert p.done_count == 3 and p.skipped_count == 2
    assert p.mean_step_s() == pytest.approx(8)
    assert p.eta_s() == pytest.approx(8)
    assert "sweep x [1/4] a skipped (already done) | ETA --" in stream.getvalue()


def test_parallel_jobs_share_the_remaining_work() -> None:
    p, clock, _ = make(6, jobs=2)
    timed(p, clock, "a", 10)
    timed(p, clock, "b", 10)
    assert p.eta_s() == pytest.approx(4 * 10 / 2)


def test_child_estimate_is_used_for_the_step_in_flight() -> None:
    p, clock, _ = make(2)
    timed(p, clock, "p1", 100)
    p.start("p2")
    kid = p.child("p2")
    kid.set_total(4)
    timed(kid, clock, "baseline", 5)
    # the child knows better than the parent's mean: 3 steps x 5 s left
    assert p.eta_s() == pytest.approx(15)
    assert p.status_text().endswith("| ETA 15s | 1m45s elapsed | running p2 (step 1/4)")


def test_plain_lines_off_a_terminal() -> None:
    p, clock, stream = make(3)
    timed(p, clock, "a", 65)
    timed(p, clock, "b", 55, ok=False)
    p.log("note: relay backend in use")
    p.close()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "sweep x [0/3] start a",
        "sweep x [1/3] a ok in 1m05s | ETA 2m10s",
        "sweep x [1/3] start b",
        "sweep x [2/3] b FAILED in 55s | ETA 1m00s",
        "note: relay backend in use",
        "sweep x: 2/3 done, 1 failed in 2m00s",
    ]
    assert "\r" not in stream.getvalue()


def test_one_updating_line_on_a_terminal() -> None:
    p, clock, stream = make(2, tty=True)
    timed(p, clock, "a", 30)
    p.log("hello")
    text = stream.getvalue()
    assert "\r" in text and "\x1b[K" in text
    assert "\r\x1b[Khello\n" in text  # the status line is cleared before a log line
    last = text.rsplit("\r", 1)[-1]
    assert last.startswith("sweep x [1/2]  50% | ETA 30s | 30s elapsed")
    p.close()
    assert stream.getvalue().endswith("sweep x: 1/2 done in 30s\n")


def test_step_context_marks_failures_and_reraises() -> None:
    p, clock, _ = make(2)
    with pytest.raises(ValueError):
        with p.step("x"):
            clock.now += 3
            raise ValueError("boom")
    assert p.failed_count == 1 and p.done_count == 1 and p.durations == [3]
    with p.step("y"):
        clock.now += 1
    assert p.done_count == 2 and p.failed_count == 1


class BrokenPipe(io.StringIO):
    """A stderr whose reader went away: every write fails, as on a closed pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def write(self, text: str) -> int:
        self.attempts += 1
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("tty", [False, True])
def test_a_closed_pipe_never_crashes_the_work(tty: bool) -> None:
    stream = BrokenPipe()
    p = Progress(2, "x", stream=stream, tty=tty)
    ran = []
    with p.step("a"):
        ran.append("a")
    p.log("a note")
    p.skip("b")
    p.close()
    assert ran == ["a"]
    assert (p.done_count, p.failed_count, p.skipped_count) == (2, 0, 1)  # counted as if printed
    assert stream.attempts > 0  # the reporter did try to write, and swallowed the errors
    closed = io.StringIO()
    q = Progress(1, "x", stream=closed, tty=False)
    closed.close()  # writing to a closed file raises ValueError: swallowed too
    with q.step("a"):
        pass
    q.close()
    assert q.done_count == 1 and q.failed_count == 0


@pytest.mark.parametrize(("seconds", "text"), [(None, "--"), (0.4, "0s"), (42, "42s"), (185, "3m05s"),
                                                (7620, "2h07m"), (-1, "--")])
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
