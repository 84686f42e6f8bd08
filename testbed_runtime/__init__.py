"""The run-time I/O shared by the training workers and the BubbleTea agents.

Both kinds of process run side by side on an emulated host and meet through files and
inherited descriptors: the emulated device with its lock, timeline and leases
(`device`), the readiness line a started process writes to its parent (`readiness`), the
watch that ends a process once its run is gone (`lifetime`), the slot feed
(`slots`), the live status files with their wake-ups (`live`), the worker's side that keeps
its record true (`live_reporter`), the runner's gate (`gate`), the byte counts of a
channel's TCP streams (`tcp_progress`) and the agent's environment (`agent_env`).

Why a layer of its own: the training worker must not depend on the BubbleTea add-on,
and the core (testbed_core) holds only pure models and math. This package sits below
``testbed.training``, ``bubbletea_agent`` and ``testbed.emulation`` and above
``testbed_core``; it imports nothing from ``testbed`` or ``bubbletea_agent``, so every
process can use it alone.
"""
