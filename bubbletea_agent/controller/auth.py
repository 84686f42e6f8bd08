"""Who may talk to the prefill controller: bearer tokens derived from the run's secret.

A run has one random secret (``ATLAS_SECRET`` in the environment of every process it
starts; testbed/run/runner.py makes it, the atlas channels and the decode servers
authenticate with it). The controller never sees a bare secret on the wire: every
request carries ``Authorization: Bearer <token>``, where the token is an HMAC-SHA256
of a purpose string keyed with the run's secret:

* ``client_token``: HMAC(secret, "bubbletea-controller/v1 client"): submits prefill
  requests, reads them and the status. The runner writes it to the run's output folder
  (`TOKEN_FILE`, mode 0600) for a user's own load generator;
* ``agent_token(name)``: HMAC(secret, "bubbletea-controller/v1 agent:" + name): syncs as
  agent `name` and as nothing else. The client token cannot be turned into an agent's
  (that needs the secret), so a holder of the token file cannot forge a bubble report.

Another run has another secret, so its tokens are refused here. Tokens are compared
in constant time (`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

SECRET_ENV = "ATLAS_SECRET"  # the same variable atlas_transport reads (atlas_transport/config.py)
PURPOSE = "bubbletea-controller/v1"
TOKEN_FILE = "prefill-client.token"  # in the run's output folder (testbed run OUT)
SCHEME = "Bearer"


class AuthError(RuntimeError):
    """No secret to derive the tokens from, or a token file that cannot be used."""


def _key(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise AuthError("the run's secret is empty: the controller's tokens are derived from it")
    return key


def derive(secret: str | bytes, purpose: str) -> str:
    """The token for `purpose` (hex HMAC-SHA256 keyed with the run's secret)."""
    return hmac.new(_key(secret), f"{PURPOSE} {purpose}".encode(), hashlib.sha256).hexdigest()


def client_token(secret: str | bytes) -> str:
    """The token of the run's clients (submit, read requests and status)."""
    return derive(secret, "client")


def agent_token(secret: str | bytes, name: str) -> str:
    """The token with which agent `name`, and only it, syncs."""
    return derive(secret, f"agent:{name}")


def run_secret(environ: dict[str, str] | None = None, who: str = "the prefill controller") -> str:
    """The run's secret from the environment (``ATLAS_SECRET``); a clear error without it."""
    secret = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    if not secret:
        raise AuthError(f"{who} needs the run's secret in the environment variable {SECRET_ENV} "
                        "(testbed run sets it for every process it starts; by hand, export the same value "
                        "for the controller and its agents)")
    return secret


def bearer(token: str) -> dict[str, str]:
    """The request header that carries `token`."""
    return {"Authorization": f"{SCHEME} {token}"}


def presented(header: str | None) -> bytes | None:
    """The token of an ``Authorization`` header value (None: no header, or not a bearer token)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower() or not token.strip():
        return None
    return token.strip().encode("utf-8", "replace")


def matches(token: bytes | None, expected: str) -> bool:
    """Whether `token` is `expected`, in time independent of where they differ."""
    return token is not None and hmac.compare_digest(token, expected.encode())


def write_token_file(path: str | os.PathLike[str], token: str) -> Path:
    """Write `token` to `path`, readable and writable by this user only (0600), set
    before any byte is written: never a moment with wider permissions."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: narrow it
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return path


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a run's token file (`TOKEN_FILE`): for a client outside the run."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise AuthError(f"{path}: cannot read the controller's client token ({exc.strerror or exc}); it is "
                        f"written to the run's output folder as {TOKEN_FILE}, readable by the run's user only"
                        ) from None
    if len(token) != 64 or any(c not in "0123456789abcdef" for c in token):
        raise AuthError(f"{path}: not a controller token (64 hex digits expected)")
    return token
