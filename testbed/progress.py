"""Progress with an estimate of time left, on stderr, for long runs and sweeps.

One reporter serves both `testbed run` (steps within a run: variants, iterations)
and `testbed sweep` (points). On a terminal it keeps one status line up to date;
elsewhere (logs, CI, pipes) it prints one plain line per event, so a log file reads
as a history. The estimate is the mean duration of the steps timed so far times the
steps left (divided among parallel jobs); steps skipped because they were already
done (a resumed sweep) count as done but not in the mean.

Usage::

    progress = Progress(total=3, label="run atlas-2dc")
    with progress.step("baseline"):
        ...
    progress.log("a note that should not break the status line")
    progress.close()

A runner handed a `Progress` by a sweep gets a *child* (`progress.child(...)`): the
child's steps show inside the sweep's status line, and the sweep's estimate uses the
child's estimate for the point in flight. A child may learn its total late
(`set_total`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


def format_duration(seconds: float | None) -> str:
    """'42s', '3m05s', '2h07m'; '--' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "--"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts steps done out of `total` and estimates the time left."""

    def __init__(
        self,
        total: int = 0,
        label: str = "",
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        jobs: int = 1,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = 0.1,
        enabled: bool = True,
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.tty = tty
        self.jobs = max(1, int(jobs))
        self.clock = clock
        self.min_interval = min_interval
        self.enabled = enabled
        self.done_count = 0
        self.failed_count = 0
        self.skipped_count = 0
        self.durations: list[float] = []
        self.running: dict[str, float] = {}
        self.started_at = clock()
        self._parent: Progress | None = None
        self._children: dict[str, Progress] = {}
        self._lock = threading.RLock()
        self._line_len = 0
        self._last_draw = -1e18
        self._closed = False

    # ------------------------------------------------------------ counting

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = max(0, int(total))
            self._refresh(force=True)

    def start(self, name: str) -> None:
        """Step `name` begins (several may run at once with jobs > 1)."""
        with self._lock:
            self.running[name] = self.clock()
            if not self.tty and self._parent is None:  # a child's history is its "done" lines
                self._emit(f"{self._prefix()} start {name}")
            self._refresh(force=True)

    def done(self, name: str, *, ok: bool = True, duration: float | None = None, note: str = "") -> None:
        """Step `name` ended; its duration (measured since `start` unless given) feeds the estimate."""
        with self._lock:
            began = self.running.pop(name, None)
            self._children.pop(name, None)
            if duration is None and began is not None:
                duration = self.clock() - began
            if duration is not None:
                self.durations.append(max(0.0, duration))
            self.done_count += 1
            if not ok:
                self.failed_count += 1
            verdict = "ok" if ok else "FAILED"
            extra = f" ({note})" if note else ""
            self._emit_event(f"{name} {verdict} in {format_duration(duration)}{extra}")

    def skip(self, name: str, reason: str = "already done") -> None:
        """Step `name` needs no work (a finished point of a resumed sweep)."""
        with self._lock:
            self.done_count += 1
            self.skipped_count += 1
            self._emit_event(f"{name} skipped ({reason})")

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Times one step; an exception marks it failed and propagates."""
        self.start(name)
        try:
            yield
        except BaseException:
            self.done(name, ok=False)
            raise
        self.done(name)

    def tick(self) -> None:
        """Redraw the status line (elapsed time, estimate) if it is due; call it while waiting."""
        with self._lock:
            self._refresh()

    def child(self, name: str, label: str = "") -> Progress:
        """A reporter for the inside of running step `name` (e.g. a run inside a sweep point)."""
        with self._lock:
            kid = Progress(
                0, label or name, stream=self.stream, tty=self.tty, clock=self.clock,
                min_interval=self.min_interval, enabled=self.enabled,
            )
            kid._parent = self
            self._children[name] = kid
            return kid

    # ------------------------------------------------------------ estimates

    def mean_step_s(self) -> float | None:
        with self._lock:
            return sum(self.durations) / len(self.durations) if self.durations else None

    def eta_s(self) -> float | None:
        """Seconds left: mean step time x steps not started, plus what the running
        steps still need, shared among the parallel jobs."""
        with self._lock:
            mean = self.mean_step_s()
            now = self.clock()
            pending = max(0, self.total - self.done_count - len(self.running))
            in_flight = 0.0
            for name, began in self.running.items():
                kid = self._children.get(name)
                kid_eta = kid.eta_s() if kid is not None else None
                if kid_eta is not None:
                    in_flight += kid_eta
                elif mean is not None:
                    in_flight += max(0.0, mean - (now - began))
                else:
                    return None
            if pending and mean is None:
                return None
            return (pending * (mean or 0.0) + in_flight) / self.jobs

    def elapsed_s(self) -> float:
        return self.clock() - self.started_at

    # ------------------------------------------------------------ output

    def log(self, message: str) -> None:
        """A line of its own, above the status line."""
        with self._lock:
            root = self._root()
            root._clear()
            root._write(message + "\n")
            root._refresh(force=True)

    def status_text(self) -> str:
        """The one-line status: counts, running steps (with a child's own), elapsed, ETA."""
        with self._lock:
            pct = f" {100 * self.done_count // self.total:3d}%" if self.total else ""
            # Most useful first: a narrow terminal cuts the end of the line.
            parts = [f"{self._prefix()}{pct}", f"ETA {format_duration(self.eta_s())}",
                     f"{format_duration(self.elapsed_s())} elapsed"]
            if self.running:
                shown = []
                for name in list(self.running)[:3]:
                    kid = self._children.get(name)
                    shown.append(f"{name} ({kid.brief()})" if kid is not None else name)
                more = f" +{len(self.running) - 3}" if len(self.running) > 3 else ""
                parts.append("running " + ", ".join(shown) + more)
            return " | ".join(parts)

    def brief(self) -> str:
        """A child's state as shown inside its parent's line: 'step 2/4 atlas'."""
        with self._lock:
            count = f"{self.done_count}/{self.total}" if self.total else f"{self.done_count}"
            names = ", ".join(self.running)
            return f"step {count}" + (f" {names}" if names else "")

    def close(self, message: str | None = None) -> None:
        """Ends the status line; prints a closing summary line for top-level reporters."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._parent is not None:
                return
            self._clear()
            if message is None:
                failed = f", {self.failed_count} failed" if self.failed_count else ""
                skipped = f", {self.skipped_count} skipped" if self.skipped_count else ""
                message = (
                    f"{self.label}: {self.done_count}/{self.total} done{failed}{skipped} "
                    f"in {format_duration(self.elapsed_s())}"
                )
            self._write(message + "\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _prefix(self) -> str:
        count = f"[{self.done_count}/{self.total}]" if self.total else f"[{self.done_count}]"
        return f"{self.label} {count}" if self.label else count

    def _root(self) -> Progress:
        node = self
        while node._parent is not None:
            node = node._parent
        return node

    def _emit_event(self, text: str) -> None:
        if self.tty:
            self._refresh(force=True)
            return
        self._emit(f"{self._prefix()} {text} | ETA {format_duration(self.eta_s())}")

    def _emit(self, line: str) -> None:
        """A plain history line (non-TTY mode); a child's lines are indented."""
        if self._parent is not None:
            line = "    " + line
        self._root()._write(line + "\n")

    def _refresh(self, force: bool = False) -> None:
        if not self.tty:
            return
        if self._parent is not None:
            self._parent._refresh(force)
            return
        now = self.clock()
        if not force and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        text = self.status_text()
        width = _terminal_width()
        if len(text) > width - 1:
            text = text[: width - 2] + "…"
        self._write("\r" + text + "\x1b[K")
        self._line_len = len(text)

    def _clear(self) -> None:
        if self.tty and self._line_len:
            self._write("\r\x1b[K")
            self._line_len = 0

    def _write(self, text: str) -> None:
        if not self.enabled or self._closed and self._parent is None and not text.endswith("\n"):
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # closed pipe: progress is never worth a crash
            pass


def _terminal_width() -> int:
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 120
    return columns if columns >= 20 else 120  # a pty without a size reports 0
