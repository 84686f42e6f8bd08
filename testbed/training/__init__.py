"""Pipeline-parallel training on the testbed: schedules, a discrete-event simulator
of them, and an executor that drives emulated devices through a schedule."""
