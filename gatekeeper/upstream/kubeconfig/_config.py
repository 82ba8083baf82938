"""The upstream configuration value and the checks its loaders share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from gatekeeper.errors import ConfigError

__all__ = ["UpstreamConfig", "check_readable", "check_server", "check_token"]

_SECRET_FIELDS = frozenset({"token", "client_key_data"})


@dataclass(frozen=True, slots=True, repr=False)
class UpstreamConfig:
    """Where the kube-apiserver is and the node's credentials for it; checked when loaded.

    ``server`` has no trailing slash. The loaders never set both a ``*_data`` field and its
    ``*_file`` twin. ``token_file``, when set, wins over ``token`` (as in client-go).
    """

    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    tls_server_name: str | None = None

    def __repr__(self) -> str:
        # SECURITY: the token and key never reach logs or tracebacks (DESIGN.md §4.2).
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            if f.name in _SECRET_FIELDS or isinstance(value, bytes):
                value = "<redacted>" if f.name in _SECRET_FIELDS else f"<{len(value)} bytes>"
                parts.append(f"{f.name}={value}")
            else:
                parts.append(f"{f.name}={value!r}")
        return f"UpstreamConfig({', '.join(parts)})"


def check_server(url: str, what: str) -> str:
    """A normalized http(s) base URL (no trailing slash); ConfigError naming ``what``."""
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in url):
        raise ConfigError(f"{what}: not a valid URL (whitespace, control or non-ASCII characters)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigError(f"{what}: not a valid URL") from None
    if parts.username is not None or parts.password is not None:
        # Not echoed: it would print the password.
        raise ConfigError(f"{what}: must not contain user info (user:password@)")
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what}: {url!r} is not an http(s) URL with a host")
    if parts.path not in ("", "/"):
        raise ConfigError(f"{what}: {url!r} must not have a path")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ConfigError(f"{what}: {url!r} must not have a query or fragment")
    if port == 0:
        raise ConfigError(f"{what}: {url!r} has port 0")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")


def check_readable(path: str, what: str) -> None:
    """ConfigError naming ``what`` unless ``path`` can be opened for reading."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read: {exc.strerror or exc}") from None


def check_token(token: str, error: Callable[[str], ConfigError]) -> None:
    """Raise ``error(problem)`` unless ``token`` is a non-empty run of visible ASCII."""
    # SECURITY: the token goes into a header; no whitespace or control bytes (header injection).
    if not token:
        raise error("empty")
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in token):
        raise error("contains whitespace, control or non-ASCII characters")
