"""What the runner tells a BubbleTea agent through its environment.

The runner (testbed/run/workers.py) starts the agents; the agent (bubbletea_agent/agent.py)
reads the variable. It lives here, below both, so the testbed does not import the agent
to name it."""

from __future__ import annotations

ADMIT_ENV = "BUBBLETEA_ADMIT"
"""``BUBBLETEA_ADMIT=none`` in an agent's environment: it runs its whole loop (requests
arrive, queue and expire, windows are read) but never takes the device. The runner's
idle twin (testbed/run/runner.py) measures the agents' own overhead with it."""
