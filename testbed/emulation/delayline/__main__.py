"""``python -m testbed.emulation.delayline --a IFACE --b IFACE --delay 25ms ...``: run the delay
line inside a WAN link node. Prints ``READY`` once both sockets are bound, reads control
commands (see `testbed.emulation.delayline.control`), prints ``STATS {json}`` on exit.

Exit codes: 0 stopped (signal, quit, parent died), 1 unexpected error, 2 bad
arguments or setup, 3 an interface vanished.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import sys
from collections.abc import Sequence

from testbed.emulation.delayline.relay import (
    EXIT_ERROR,
    EXIT_USAGE,
    Relay,
    RelayError,
    die_with_parent,
    open_port,
    set_scheduling,
)
from testbed.emulation.delayline.schedule import DelayQueue, LinkParams, ParamError
from testbed_core.units import UnitError, parse_duration, parse_fraction, parse_size

FRAME_MAX = 256 * 1024 + 64  # a GSO super-packet (64 KiB by default, 256 KiB allowed) + headers


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m testbed.emulation.delayline",
        description="Userspace delay line between two interfaces (AF_PACKET, PACKET_VNET_HDR).",
    )
    p.add_argument("--a", required=True, metavar="IFACE", help="first interface")
    p.add_argument("--b", required=True, metavar="IFACE", help="second interface")
    p.add_argument("--delay", required=True, help="one-way delay a->b (and b->a unless --delay-b-to-a), e.g. 25ms")
    p.add_argument("--delay-b-to-a", help="one-way delay b->a (default: --delay)")
    p.add_argument("--jitter", default="0ms", help="uniform +-jitter, order preserving (default 0ms)")
    p.add_argument("--jitter-b-to-a", help="jitter b->a (default: --jitter)")
    p.add_argument("--loss", default="0", help="loss probability per segment, e.g. 0.001 or 0.1%% (default 0)")
    p.add_argument("--loss-b-to-a", help="loss b->a (default: --loss)")
    p.add_argument("--offset", default="0ms",
                   help="the path's own one-way latency outside the relay's queue, subtracted from --delay "
                        "so that the path's total is --delay (default 0ms)")
    p.add_argument("--offset-b-to-a", help="offset b->a (default: --offset)")
    p.add_argument("--seed", type=int, help="random seed for jitter and loss (default: random, printed on stderr)")
    p.add_argument("--control", choices=("stdin", "none"), default="stdin", help="where control commands come from")
    p.add_argument("--control-fd", type=int, metavar="FD", help="read control commands from this inherited fd")
    p.add_argument("--max-queue", default="256MiB",
                   help="per-direction cap of the relay's own queue (default 256MiB: 10 Gbit/s x 200 ms)")
    p.add_argument("--sockbuf", default="32MiB", help="kernel socket buffer per direction (default 32MiB)")
    p.add_argument("--parent-pid", type=int, metavar="PID",
                   help="exit at once unless our parent is PID (closes the race with an early parent death)")
    p.add_argument("--sched", choices=("fifo", "nice", "normal"), default="fifo",
                   help="CPU scheduling: fifo (SCHED_FIFO 2, default; falls back to nice), nice (-10), normal")
    p.add_argument("--no-promisc", action="store_true", help="do not put the interfaces in promiscuous mode")
    return p


def _params(ns: argparse.Namespace, b_to_a: bool) -> LinkParams:
    """One direction's parameters; b->a falls back to the a->b flags."""
    fields = {}
    for name, parse, field in (
        ("delay", parse_duration, "delay_s"),
        ("jitter", parse_duration, "jitter_s"),
        ("loss", parse_fraction, "loss"),
        ("offset", parse_duration, "offset_s"),
    ):
        own = getattr(ns, f"{name}_b_to_a") if b_to_a else None
        flag, raw = (f"--{name}-b-to-a", own) if own is not None else (f"--{name}", getattr(ns, name))
        try:
            fields[field] = parse(raw)
        except UnitError as exc:
            raise RelayError(f"{flag}: {exc}") from None
        if fields[field] < 0:
            raise RelayError(f"{flag}: must not be negative, got {raw!r}")
    try:
        return LinkParams(**fields)
    except ParamError as exc:
        raise RelayError(f"{'b->a' if b_to_a else 'a->b'}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.a == ns.b:
            raise RelayError(f"--a and --b must be two different interfaces, both are {ns.a!r}")
        a2b_params = _params(ns, False)
        b2a_params = _params(ns, True)
        try:
            max_queue = parse_size(ns.max_queue)
            sockbuf = parse_size(ns.sockbuf)
        except UnitError as exc:
            raise RelayError(f"--max-queue/--sockbuf: {exc}") from None
        control_fd = ns.control_fd
        if control_fd is None and ns.control == "stdin":
            control_fd = sys.stdin.fileno()
        if control_fd is not None:
            try:
                os.fstat(control_fd)
            except OSError as exc:
                raise RelayError(f"--control-fd {control_fd}: {exc.strerror}") from None
        seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(2**63)
        a2b = DelayQueue(a2b_params, random.Random(f"{seed}/a2b"), max_queue_bytes=max_queue)
        b2a = DelayQueue(b2a_params, random.Random(f"{seed}/b2a"), max_queue_bytes=max_queue)
        port_a = open_port(ns.a, FRAME_MAX, sockbuf, sockbuf, promisc=not ns.no_promisc)
        try:
            port_b = open_port(ns.b, FRAME_MAX, sockbuf, sockbuf, promisc=not ns.no_promisc)
        except RelayError:
            port_a.sock.close()
            raise
    except RelayError as exc:
        print(f"delayline: {exc}", file=sys.stderr)
        return EXIT_USAGE

    # Process-wide settings only once the setup is known to be good.
    die_with_parent(ns.parent_pid)
    sched = set_scheduling(ns.sched)
    if control_fd is not None:
        fcntl.fcntl(control_fd, fcntl.F_SETFL, fcntl.fcntl(control_fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # the wakeup fd ends the loop
    print(f"delayline: {ns.a}<->{ns.b} a2b {a2b_params.describe()} b2a {b2a_params.describe()} seed {seed} sched {sched}",
          file=sys.stderr)
    relay = Relay(port_a, port_b, a2b, b2a, out=sys.stdout, control_fd=control_fd)
    relay.say("READY")
    try:
        code = relay.run(wakeup_fd=rfd)
    except Exception as exc:  # report, never forward undelayed
        print(f"delayline: unexpected error: {exc!r}", file=sys.stderr)
        code = EXIT_ERROR
    relay.say("STATS " + json.dumps(relay.stats(), sort_keys=True))
    for port in (port_a, port_b):
        port.sock.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
