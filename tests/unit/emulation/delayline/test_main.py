"""The delay line's command line (`python -m testbed.emulation.delayline`, its
`__main__`): `relay_argv` parses back, and bad arguments are explained."""

from __future__ import annotations

import pytest

from testbed.emulation.delayline import LinkParams, relay_argv
from testbed.emulation.delayline import __main__ as cli


def test_relay_argv_parses_back() -> None:
    argv = relay_argv("w-eth0", "w-eth1", LinkParams(0.025, 0.001, 0.01), LinkParams(0.030), seed=5, parent_pid=42)
    assert argv[1:3] == ["-m", "testbed.emulation.delayline"]
    ns = cli._parser().parse_args(argv[3:])
    assert (ns.a, ns.b, ns.seed, ns.parent_pid) == ("w-eth0", "w-eth1", 5, 42)
    a2b, b2a = cli._params(ns, False), cli._params(ns, True)
    assert (a2b.delay_s, a2b.jitter_s, a2b.loss) == pytest.approx((0.025, 0.001, 0.01))
    assert (b2a.delay_s, b2a.jitter_s, b2a.loss) == pytest.approx((0.030, 0.0, 0.0))
    symmetric = relay_argv("x", "y", LinkParams(0.01))
    assert "--delay-b-to-a" not in symmetric and "--offset" not in symmetric
    offset = cli._parser().parse_args(relay_argv("x", "y", LinkParams(0.01, offset_s=0.0002))[3:])
    assert cli._params(offset, False).offset_s == pytest.approx(0.0002)
    assert cli._params(offset, True).offset_s == pytest.approx(0.0002)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a", "x0", "--b", "x0", "--delay", "1ms"], "--a and --b must be two different interfaces"),
        (["--a", "x0", "--b", "x1", "--delay", "1 lightyear"], "--delay: '1 lightyear'"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--loss-b-to-a", "3"], "b->a: loss is a probability"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--jitter=-1ms"], "--jitter: must not be negative"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--offset", "soon"], "--offset: 'soon'"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--max-queue", "lots"], "--max-queue/--sockbuf"),
        (["--a", "x0", "--b", "x1", "--delay", "1ms", "--control-fd", "987"], "--control-fd 987"),
        (["--a", "tbnoiface0", "--b", "tbnoiface1", "--delay", "1ms", "--control", "none"],
         "no interface 'tbnoiface0' in this network namespace"),
    ],
)
def test_command_line_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err
