"""The bearer token for the upstream, following a rotated token file."""

from __future__ import annotations

import logging

from gatekeeper.errors import ConfigError
from gatekeeper.upstream.kubeconfig._config import UpstreamConfig, check_token

__all__ = ["TokenSource"]

_log = logging.getLogger("gatekeeper.kubeconfig")
_MAX_TOKEN_BYTES = 64 * 1024


class TokenSource:
    """The current bearer token: the static token, or the token file as last read.

    The file is read when the source is made and again by :meth:`reload` (the server's reloader
    calls it when the file changes), never on a request's path. A failed re-read keeps the last
    good token (kubelet rotates projected tokens well before they expire) and records
    ``last_error``; a failed first read is a ConfigError.
    """

    def __init__(self, cfg: UpstreamConfig) -> None:
        self._file = cfg.token_file
        self._token = cfg.token
        self.last_error: str | None = None
        if self._file is not None:
            try:
                self._token = _read_token_file(self._file)
            except ConfigError as exc:
                raise ConfigError(f"upstream token: {exc}") from None

    @property
    def token_file(self) -> str | None:
        """The file the token is read from, or None for a static token."""
        return self._file

    def reload(self) -> None:
        """Read the token file now (it changed); ConfigError keeps the last good token."""
        if self._file is None:
            return
        try:
            self._token = _read_token_file(self._file)
        except ConfigError as exc:
            if self.last_error != str(exc):
                _log.warning("keeping the last good upstream token: %s", exc)
            self.last_error = str(exc)
            raise
        self.last_error = None

    def token(self) -> str | None:
        """The token to send now, or None when the config has none (no I/O)."""
        return self._token


def _read_token_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"token file {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > _MAX_TOKEN_BYTES:
        raise ConfigError(f"token file {path}: larger than {_MAX_TOKEN_BYTES} bytes")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path}: not ASCII") from None
    check_token(token, lambda problem: ConfigError(f"token file {path}: {problem}"))
    return token
