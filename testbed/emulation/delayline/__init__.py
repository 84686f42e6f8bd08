"""The toolkit's userspace delay line, for kernels without sch_netem.

Run one per WAN link inside the link node: ``python -m testbed.emulation.delayline --a IF --b IF
--delay 25ms``. `relay_argv` builds that command line; `set_command` formats a control
line for time-varying links. Shaping stays in HTB on the node's egress
(`testbed.emulation.shaping.egress_shaper` on both node interfaces).
"""

from __future__ import annotations

import sys

from testbed.emulation.delayline.schedule import LinkParams

READY_LINE = "READY"
STATS_PREFIX = "STATS "


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.6g}ms"


def relay_argv(
    a: str,
    b: str,
    a2b: LinkParams,
    b2a: LinkParams | None = None,
    *,
    seed: int | None = None,
    python: str = sys.executable,
    control: str = "stdin",
    parent_pid: int | None = None,
) -> list[str]:
    """The command line that starts a delay line between interfaces ``a`` and ``b``.

    Pass ``parent_pid=os.getpid()`` when this process starts it directly (no shell in
    between): the relay then also exits if we died before it could arm PDEATHSIG.
    """
    argv = [python, "-m", "testbed.emulation.delayline", "--a", a, "--b", b,
            "--delay", _ms(a2b.delay_s), "--jitter", _ms(a2b.jitter_s), "--loss", repr(a2b.loss),
            "--control", control]
    if a2b.offset_s:
        argv += ["--offset", _ms(a2b.offset_s)]
    if b2a is not None and b2a != a2b:
        argv += ["--delay-b-to-a", _ms(b2a.delay_s), "--jitter-b-to-a", _ms(b2a.jitter_s),
                 "--loss-b-to-a", repr(b2a.loss), "--offset-b-to-a", _ms(b2a.offset_s)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    return argv


def set_command(direction: str = "both", *, delay_s: float | None = None, jitter_s: float | None = None,
                loss: float | None = None, offset_s: float | None = None, down: bool | None = None) -> str:
    """A control line (newline included) changing the given parameters."""
    parts = ["set", direction]
    if delay_s is not None:
        parts.append(f"delay={_ms(delay_s)}")
    if jitter_s is not None:
        parts.append(f"jitter={_ms(jitter_s)}")
    if loss is not None:
        parts.append(f"loss={loss!r}")
    if offset_s is not None:
        parts.append(f"offset={_ms(offset_s)}")
    if down is not None:
        parts.append(f"down={'on' if down else 'off'}")
    if len(parts) == 2:
        raise ValueError("set_command needs at least one of delay_s, jitter_s, loss, offset_s, down")
    return " ".join(parts) + "\n"


__all__ = ["LinkParams", "READY_LINE", "STATS_PREFIX", "relay_argv", "set_command"]
