"""Exceptions of the Atlas transport.

One hierarchy so callers can catch `TransportError` for anything that went wrong on
the wire, and narrower classes when they want to react differently (retry a connect,
fix a secret, give up on a peer).
"""

from __future__ import annotations


class TransportError(RuntimeError):
    """Something went wrong moving tensors between two endpoints."""


class ConfigError(ValueError):
    """A `TransportConfig` value is invalid; the message names the field and the fix."""


class ProtocolError(TransportError):
    """Bytes on the wire do not follow the Atlas protocol (bad version, absurd size,
    unknown dtype, corrupted frame). The connection that carried them is closed."""


class AuthenticationError(TransportError):
    """The HMAC challenge-response failed: the peers do not share the same secret."""


class ConnectError(TransportError):
    """A channel could not be established (refused, unreachable, timed out)."""


class ShapeMismatch(TransportError):
    """A transfer's dtype or element count does not fit the tensor posted to receive
    it. The peer is alive and the channel stays open: the caller's two programs
    disagree about what they exchange."""


class ChannelClosed(TransportError):
    """The channel was closed (locally or by the peer) before the operation finished."""


class PeerLost(TransportError):
    """Every stream of the channel failed (peer died, network cut, idle timeout)."""
