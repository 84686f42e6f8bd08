"""The error of the emulation builder, shared by its address plan, nodes and lifecycle.

It lives in a module of its own so that the pure address plan can raise it without
importing Mininet or the lifecycle; callers import it from `testbed.emulation.network`.
"""

from __future__ import annotations


class EmulationError(RuntimeError):
    """The emulation could not be built; the message says what was wrong and what to do."""
