"""Emulation spread over several servers (Mininet's cluster edition) and the
server namespaces that test it on one machine (`rig`)."""
