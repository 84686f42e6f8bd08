"""Control protocol, command line and the relay loop (over socketpairs, no root)."""

from __future__ import annotations

import io
import json
import os
import random
import socket
import threading
import time

import pytest

from testbed.emulation.delayline import LinkParams, relay_argv, set_command
from testbed.emulation.delayline import __main__ as cli
from testbed.emulation.delayline import frames as fr
from testbed.emulation.delayline.control import (
    ControlError,
    QuitCommand,
    SetCommand,
    StatsCommand,
    parse_control,
)
from testbed.emulation.delayline.relay import EXIT_VANISHED, Port, Relay
from testbed.emulation.delayline.schedule import DelayQueue

# -- control lines ------------------------------------------------------------------


def test_set_defaults_to_both_directions() -> None:
    cmd = parse_control("set delay=50ms jitter=1ms loss=1%")
    assert cmd == SetCommand("both", delay_s=pytest.approx(0.05), jitter_s=pytest.approx(0.001), loss=pytest.approx(0.01))


def test_set_one_direction_and_partial_change() -> None:
    cmd = parse_control("  set b2a loss=0.001   # comment")
    assert isinstance(cmd, SetCommand) and cmd.direction == "b2a" and cmd.delay_s is None
    new = cmd.apply(LinkParams(delay_s=0.02, jitter_s=0.001))
    assert new == LinkParams(delay_s=0.02, jitter_s=0.001, loss=0.001)
    assert parse_control("set dir=a2b delay=1s").direction == "a2b"  # type: ignore[union-attr]


def test_other_commands_and_blank_lines() -> None:
    assert parse_control("stats") == StatsCommand()
    assert parse_control("QUIT") == QuitCommand()
    assert parse_control("") is None
    assert parse_control("   # just a comment") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("jump", "unknown command 'jump' (allowed: set, stats, quit)"),
        ("set", "'set' needs at least one of delay=, jitter=, loss="),
        ("set a2b", "'set' needs at least one of"),
        ("set delay", "expected key=value, got 'delay'"),
        ("set delay=", "expected key=value"),
        ("set delay=5parsec", "delay: '5parsec': unknown time unit 'parsec'"),
        ("set rate=1Gbit", "does not shape rate: HTB on the WAN node's egress"),
        ("set colour=red", "unknown parameter 'colour' (allowed: delay, jitter, loss)"),
        ("set loss=2", "loss is a probability between 0 and 1"),
        ("set delay=-5ms", "delay must not be negative"),
        ("set delay=1ms delay=2ms", "delay given twice"),
        ("set dir=up delay=1ms", "allowed directions are a2b, b2a, both"),
        ("stats now", "'stats' takes no arguments"),
    ],
)
def test_bad_control_lines_are_explained(line: str, message: str) -> None:
    with pytest.raises(ControlError) as info:
        parse_control(line)
    assert message in str(info.value)


def test_set_command_round_trips() -> None:
    line = set_command("a2b", delay_s=0.0125, loss=0.002)
    assert line.endswith("\n")
    assert parse_control(line) == SetCommand("a2b", delay_s=pytest.approx(0.0125), loss=pytest.approx(0.002))
    with pytest.raises(ValueError, match="at least one"):
        set_command("both")


# -- command line -------------------------------------------------------------------


def test_relay_argv_parses_back() -> None:
    argv = relay_argv("w-eth0", "w-eth1", LinkParams(0.025, 0.001, 0.01), LinkParams(0.030), seed=5, parent_pid=42)
    assert argv[1:3] == ["-m", "testbed.emulation.delayline"]
    ns = cli._parser().parse_args(argv[3:])
    assert (ns.a, ns.b, ns.seed, ns.parent_pid) == ("w-eth0", "w-eth1", 5, 42)
    a2b, b2a = cli._params(ns, False), cli._params(ns, True)
    assert (a2b.delay_s, a2b.jitter_s, a2b.loss) == pytest.approx((0.025, 0.001, 0.01))
    assert (b2a.delay_s, b2a.jitter_s, b2a.loss) == pytest.approx((0.030, 0.0, 0.0))
    symmetric = relay_argv("x", "y", LinkParams(0.01))
    assert "--delay-b-to-a" not in symmetric


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a", "x0", "--b", "x0", "--delay", "1ms"], "--a and --b must be two different interfaces"),
        (["--a", "x0", "--b", "x1", "--delay", "1 lightyear"], "--delay: '1 lightyear'"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--loss-b-to-a", "3"], "b->a: loss is a probability"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--jitter=-1ms"], "--jitter: must not be negative"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--max-queue", "lots"], "--max-queue/--sockbuf"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--control-fd", "987"], "--control-fd 987"),
        (["--a", "tbnoiface0", "--b", "tbnoiface1", "--delay", "1ms", "--control", "none"],
         "no interface 'tbnoiface0' in this network namespace"),
    ],
)
def test_command_line_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


# -- the relay loop over socketpairs --------------------------------------------------


def frame(i: int) -> bytes:
    return fr.VNET.pack(0, 0, 0, 0, 0, 0) + b"\xff" * 12 + b"\x08\x00" + i.to_bytes(4, "big") + b"p" * 60


class Harness:
    """A Relay whose two ports are socketpairs; the test holds the far ends."""

    def __init__(self, delay_s: float) -> None:
        self.a_far, a_near = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.b_far, b_near = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for s in (a_near, b_near, self.b_far, self.a_far):
            s.setblocking(False)
        lo = socket.if_nametoindex("lo")  # a name that exists, so liveness checks pass
        self.port_a = Port("lo", lo, a_near, bytearray(4096))
        self.port_b = Port("lo", lo, b_near, bytearray(4096))
        self.ctl_r, self.ctl_w = os.pipe()
        os.set_blocking(self.ctl_r, False)
        self.wake_r, self.wake_w = os.pipe()
        self.out = io.StringIO()
        params = LinkParams(delay_s=delay_s)
        self.relay = Relay(
            self.port_a, self.port_b,
            DelayQueue(params, random.Random(1)), DelayQueue(params, random.Random(2)),
            out=self.out, control_fd=self.ctl_r,
        )
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.relay.run(wakeup_fd=self.wake_r)

    def control(self, line: str) -> str:
        before = len(self.out.getvalue().splitlines())
        os.write(self.ctl_w, line.encode() + b"\n")
        for _ in range(200):
            lines = self.out.getvalue().splitlines()
            if len(lines) > before:
                return lines[before]
            time.sleep(0.005)
        raise AssertionError(f"no reply to {line!r}")

    def recv(self, sock: socket.socket, timeout: float = 2.0) -> tuple[bytes, float]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                return sock.recv(4096), time.monotonic()
            except BlockingIOError:
                time.sleep(0.0005)
        raise AssertionError("nothing relayed")

    def close(self) -> None:
        os.write(self.wake_w, b"x")
        self.thread.join(5)
        for s in (self.a_far, self.b_far, self.port_a.sock, self.port_b.sock):
            s.close()
        for fd in (self.ctl_r, self.ctl_w, self.wake_r, self.wake_w):
            os.close(fd)


@pytest.fixture
def harness() -> Harness:
    h = Harness(delay_s=0.020)
    yield h
    h.close()


def test_relay_delays_both_directions(harness: Harness) -> None:
    t0 = time.monotonic()
    harness.a_far.send(frame(1))
    got, t1 = harness.recv(harness.b_far)
    assert got == frame(1) and t1 - t0 >= 0.020
    t0 = time.monotonic()
    harness.b_far.send(frame(2))
    got, t1 = harness.recv(harness.a_far)
    assert got == frame(2) and t1 - t0 >= 0.020


def test_relay_control_changes_delay_and_reports(harness: Harness) -> None:
    reply = harness.control("set a2b delay=60ms")
    assert reply.startswith("OK a2b delay=60ms") and "b2a delay=20ms" in reply
    assert harness.control("set rate=1Gbit").startswith("ERROR the delay line does not shape rate")
    t0 = time.monotonic()
    harness.a_far.send(frame(3))
    _, t1 = harness.recv(harness.b_far)
    assert t1 - t0 >= 0.060
    stats = json.loads(harness.control("stats")[len("STATS "):])
    assert stats["a2b"]["tx_frames"] == 1 and stats["a2b"]["params"].startswith("delay=60ms")
    assert harness.control("quit") == "OK quit"
    harness.thread.join(2)
    assert harness.code == 0


def test_relay_exits_when_its_interface_vanishes(harness: Harness) -> None:
    harness.port_a.name = "tbnoiface9"  # as if the kernel had deleted it
    harness.relay._suspect = True
    harness.thread.join(3)
    assert harness.code == EXIT_VANISHED
