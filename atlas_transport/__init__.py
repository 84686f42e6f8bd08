"""Atlas: multi-connection tensor transport, DC placement planner and temporal
bandwidth-sharing scheduler."""

# --- transport exports (lazy: importing the planner must not pull in torch) ---
_TRANSPORT_EXPORTS = {
    "TransportConfig": "config", "listen": "endpoints", "connect": "endpoints",
    "Listener": "endpoints", "Channel": "channel", "Handle": "channel",
    "probe_streams": "auto", "streams_for": "auto", "cached_streams": "auto",
    "forget_streams": "auto", "ProbeResult": "auto",
    "TransportError": "errors", "ProtocolError": "errors", "AuthenticationError": "errors",
    "ConnectError": "errors", "ChannelClosed": "errors", "PeerLost": "errors",
    "ConfigError": "errors",
}


def __getattr__(name: str):
    module = _TRANSPORT_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'atlas_transport' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
