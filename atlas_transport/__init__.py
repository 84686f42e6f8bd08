"""Atlas's multi-connection tensor transport: one transfer striped over N TCP streams.

A leaf library: it imports nothing from the testbed, so it runs alone between real
machines. Placement and the temporal plan live in `testbed_core.planning`."""

# Exports are resolved lazily: `import atlas_transport` does not pull in torch.
_TRANSPORT_EXPORTS = {
    "TransportConfig": "config", "listen": "endpoints", "connect": "endpoints",
    "Listener": "endpoints", "Channel": "channel", "Handle": "channel",
    "probe_streams": "auto", "streams_for": "auto", "cached_streams": "auto",
    "forget_streams": "auto", "ProbeResult": "auto",
    "TransportError": "errors", "ProtocolError": "errors", "AuthenticationError": "errors",
    "ConnectError": "errors", "ChannelClosed": "errors", "PeerLost": "errors",
    "ConfigError": "errors", "ShapeMismatch": "errors",
}


def __getattr__(name: str):
    module = _TRANSPORT_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'atlas_transport' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
