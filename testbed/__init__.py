"""Emulation side of the testbed: topologies on Mininet, WAN shaping, delay lines,
the emulated device, process control, measurement and the `testbed` CLI."""

__version__ = "0.1.0"
