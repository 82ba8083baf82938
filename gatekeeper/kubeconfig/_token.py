"""The bearer token for the upstream, following a rotated token file."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gatekeeper.errors import ConfigError
from gatekeeper.kubeconfig._config import UpstreamConfig, check_token

__all__ = ["TokenSource"]

_log = logging.getLogger("gatekeeper.kubeconfig")
_MAX_TOKEN_BYTES = 64 * 1024


class TokenSource:
    """The current bearer token: the static token, or the token file re-read periodically.

    A failed re-read keeps the last good token (kubelet rotates projected tokens well before
    they expire) and records ``last_error``; a failed first read is a ConfigError.
    """

    def __init__(
        self,
        cfg: UpstreamConfig,
        *,
        reload_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file = cfg.token_file
        self._token = cfg.token
        self._reload = reload_seconds
        self._clock = clock
        self._read_at = clock()
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
        self._read_at = self._clock()
        try:
            self._token = _read_token_file(self._file)
        except ConfigError as exc:
            self.last_error = str(exc)
            raise
        self.last_error = None

    def token(self) -> str | None:
        """The token to send now, or None when the config has none."""
        if self._file is not None and self._clock() - self._read_at >= self._reload:
            self._read_at = self._clock()
            try:
                self._token = _read_token_file(self._file)
                self.last_error = None
            except ConfigError as exc:
                if self.last_error != str(exc):
                    _log.warning("keeping the last good upstream token: %s", exc)
                self.last_error = str(exc)
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
