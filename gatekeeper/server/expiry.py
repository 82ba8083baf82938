"""Certificates close to expiry: the serving certificate, the client CA, drivers' client certs.

Each is exported as seconds left (``dra_gatekeeper_certificate_expiry_seconds``) and a 0/1
flag; one within the warning period is logged (a file when checked, a driver's certificate at
most once a day per certificate).
"""

from __future__ import annotations

import datetime
import logging
import ssl
import time
from collections.abc import Callable, Mapping

from gatekeeper.errors import ConfigError
from gatekeeper.listen.tls import certificate_expiry
from gatekeeper.server.metrics import Metrics

__all__ = ["CertificateExpiry"]

log = logging.getLogger("gatekeeper.expiry")

_CLIENT_LOG_EVERY = 86400.0
_MAX_CLIENTS = 1000


class CertificateExpiry:
    """Exports and warns about certificate lifetimes, ``warning`` seconds ahead."""

    def __init__(
        self,
        metrics: Metrics,
        warning: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._metrics = metrics
        self._warning = warning
        self._clock = clock
        self._clients: dict[tuple[str, str], float] = {}
        self._held: dict[str, datetime.datetime] = {}

    def check_files(self, files: Mapping[str, str]) -> None:
        """Check each PEM file (name → path): the first certificate in it."""
        for name, path in files.items():
            try:
                expiry = certificate_expiry(path)
            except ConfigError as exc:
                log.warning("certificate expiry unknown certificate=%s: %s", name, exc)
                continue
            left = expiry.timestamp() - self._clock()
            if self._export(name, left):
                log.warning(
                    "certificate expires soon certificate=%s file=%s not_after=%s",
                    name,
                    path,
                    expiry.isoformat(),
                )

    def hold(self, name: str, not_after: datetime.datetime) -> None:
        """A certificate held in memory (the token listener's, issued through the CSR API):
        exported now and at every :meth:`refresh`."""
        self._held[name] = not_after
        self.refresh()

    def refresh(self) -> None:
        """Export the held certificates' remaining time again; warn for one close to expiry."""
        for name, not_after in self._held.items():
            if self._export(name, not_after.timestamp() - self._clock()):
                log.warning(
                    "certificate expires soon certificate=%s not_after=%s",
                    name,
                    not_after.isoformat(),
                )

    def observe_client(self, driver: str, not_after: str) -> None:
        """A driver's verified client certificate, ``notAfter`` as ``getpeercert()`` gives it."""
        key = (driver, not_after)
        now = self._clock()
        last = self._clients.get(key)
        if last is not None and now - last < _CLIENT_LOG_EVERY:
            return
        try:
            expires = ssl.cert_time_to_seconds(not_after)
        except ValueError:
            return
        if len(self._clients) >= _MAX_CLIENTS:
            self._clients.clear()
        self._clients[key] = now
        if self._export(f"client:{driver}", expires - now):
            when = datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat()
            log.warning("client certificate expires soon driver=%s not_after=%s", driver, when)

    def _export(self, name: str, left: float) -> bool:
        expiring = left <= self._warning
        self._metrics.cert_expiry.labels(name).set(left)
        self._metrics.cert_expiring.labels(name).set(1 if expiring else 0)
        return expiring
