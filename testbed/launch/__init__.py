"""`testbed launch`: run an unchanged program once per rank in the emulated hosts,
with the environment torchrun gives (``env://``), and report what it did.

`plan` (pure: ranks, environment, input checks), `models` (``launch.json``, the spec,
a detached topology's state file), `run` (start, stream, watch, end), `detach` (the
daemon of `testbed topo up --detach` and attaching to it).
"""

from testbed.launch.models import DetachedState, LaunchReport, LaunchSpec, LinkBytes, RankReport
from testbed.launch.plan import LaunchError
from testbed.launch.run import run_launch

__all__ = ["DetachedState", "LaunchError", "LaunchReport", "LaunchSpec", "LinkBytes", "RankReport", "run_launch"]
