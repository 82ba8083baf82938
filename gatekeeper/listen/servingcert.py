"""The token listener's serving certificate from the CSR API (certificates.k8s.io/v1), as the
kubelet gets its own: the key is made in this process and never leaves it (no file holds it),
a CertificateSigningRequest of the project's signer names this node's addresses, and the signer
(``dra-gatekeeper signer``, off the worker nodes) signs only those (docs/security.md, "Key
custody").

At start :meth:`ServingCertificate.first` waits, bounded, for the certificate (ConfigError,
exit 2, naming the request and the signer's answer when none comes). Then
:meth:`ServingCertificate.renew` asks for the next one at a jittered point between 60 % and
75 % of the current one's life, and hands it to the listener (:class:`~gatekeeper.listen.tls.
IssuedTLS`: new connections get it, established ones keep theirs). A renewal that fails is
retried with backoff while the current certificate serves; one still pending is waited on
again rather than asked anew (no flood of requests while a signer is away).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.listen.tls import IssuedTLS
from gatekeeper.upstream.csr import CSRState, Verdict, create_csr, read_csr
from gatekeeper.upstream.session import Upstream

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["USAGES", "CertRequest", "Issued", "ServingCertificate"]

log = logging.getLogger("gatekeeper.servingcert")

USAGES = ("digital signature", "server auth")
"""What the certificate is for (an EC key: no key encipherment)."""
_RENEW_BETWEEN = (0.60, 0.75)
"""The part of a certificate's life after which its renewal is asked for."""
_FIRST_POLL, _MAX_POLL = 0.5, 5.0
_FIRST_BACKOFF, _MAX_BACKOFF = 10.0, 300.0


@dataclass(frozen=True, slots=True)
class CertRequest:
    """What ``serve`` asks for: the signer's name, the addresses (IPs or DNS names) drivers
    dial, and how long to wait for an answer (at start, and per renewal attempt)."""

    signer_name: str
    addresses: tuple[str, ...]
    wait: float = 180.0


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate issued for a key of this process: the chain (PEM), the key (PEM, in
    memory only), its validity and serial, the request it answered, and when it came."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    not_before: datetime
    not_after: datetime
    serial: int
    csr: str
    received: float
    """Seconds since the epoch."""

    def renew_at(self, share: float) -> float:
        """When ``share`` of the certificate's life has passed (seconds since the epoch),
        counted from when it came: signers backdate ``notBefore`` (clock skew), which must not
        make a short-lived certificate due at once, again and again."""
        start = max(self.not_before.timestamp(), self.received)
        end = self.not_after.timestamp()
        return start + (end - start) * share


class _Pending:
    """A request made and not yet answered, with the key it was made for."""

    __slots__ = ("key", "name")

    def __init__(self, name: str, key: ec.EllipticCurvePrivateKey) -> None:
        self.name = name
        self.key = key


class _Refused(Exception):
    """The request was denied, failed, or is gone: a new one is needed (after a while)."""


class ServingCertificate:
    """The token listener's certificate, requested of ``settings.signer_name`` for
    ``node_name``'s addresses through ``upstream`` (the gatekeeper's own credentials).

    ``on_issued`` is told of every certificate issued, ``on_request`` of each request's end
    (``issued``, ``denied``, ``failed``, ``gone``, ``waiting``, ``error``: the metric)."""

    def __init__(
        self,
        settings: CertRequest,
        upstream: Upstream,
        node_name: str,
        *,
        on_issued: Callable[[Issued], None] = lambda issued: None,
        on_request: Callable[[str], None] = lambda result: None,
        clock: Callable[[], float] = time.time,
        share: Callable[[], float] = lambda: random.uniform(*_RENEW_BETWEEN),
    ) -> None:
        self.settings = settings
        self._upstream = upstream
        self._node = node_name
        self._on_issued = on_issued
        self._on_request = on_request
        self._clock = clock
        self._share = share
        self._pending: _Pending | None = None

    async def first(self) -> Issued:
        """The certificate to start serving with, waited for at most ``settings.wait``;
        ConfigError saying why there is none (denied, failed, no answer, no rights)."""
        try:
            issued = await self._attempt()
        except UpstreamError as exc:
            raise ConfigError(f"--token-cert-signer: {exc.message}") from None
        except _Refused as refused:
            raise ConfigError(f"--token-cert-signer: {refused}") from None
        if issued is None:
            assert self._pending is not None
            raise ConfigError(
                f"--token-cert-signer: no answer to CertificateSigningRequest "
                f"{self._pending.name} within {self.settings.wait:g} s (--token-cert-wait): "
                f"is `dra-gatekeeper signer --signer-name {self.settings.signer_name}` running? "
                f"(kubectl get csr {self._pending.name})"
            )
        return issued

    async def renew(self, tls: IssuedTLS, current: Issued) -> None:
        """Until cancelled: renew ``current`` in time and hand each new pair to ``tls``."""
        while True:
            at = current.renew_at(self._share())
            log.info(
                "serving certificate renewal scheduled csr=%s not_after=%s renew_at=%s",
                current.csr,
                current.not_after.isoformat(),
                datetime.fromtimestamp(at, current.not_after.tzinfo).isoformat(),
            )
            await asyncio.sleep(max(0.0, at - self._clock()))
            current = await self._until_issued()
            tls.use(current.cert_pem, current.key_pem)
            log.info("serving certificate renewed csr=%s serial=%x", current.csr, current.serial)

    async def _until_issued(self) -> Issued:
        backoff = _FIRST_BACKOFF
        while True:
            try:
                issued = await self._attempt()
            except (UpstreamError, _Refused) as exc:
                why = exc.message if isinstance(exc, UpstreamError) else str(exc)
                log.error("serving certificate renewal failed retry_in=%gs: %s", backoff, why)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            if issued is not None:
                return issued
            assert self._pending is not None
            log.warning(
                "serving certificate renewal still waiting csr=%s signer=%s",
                self._pending.name,
                self.settings.signer_name,
            )

    async def _attempt(self) -> Issued | None:
        """One wait for a certificate, on the pending request or a new one: the certificate,
        None when no answer came in time (the request stays pending), _Refused when it never
        will."""
        if self._pending is None:
            self._pending = await self._create()
        pending = self._pending
        deadline = time.monotonic() + self.settings.wait
        poll = _FIRST_POLL
        while True:
            state = await read_csr(self._upstream, pending.name)
            if state is None or state.verdict in (Verdict.DENIED, Verdict.FAILED):
                self._pending = None
                self._on_request("gone" if state is None else state.verdict.value.lower())
                raise _Refused(self._refusal(pending.name, state))
            if state.issued:
                self._pending = None
                try:
                    issued = _issued(state, pending.key, self._clock())
                except ValueError as exc:
                    self._on_request("failed")
                    raise _Refused(f"CertificateSigningRequest {state.name}: {exc}") from None
                self._on_request("issued")
                log.info(
                    "serving certificate issued csr=%s serial=%x not_after=%s",
                    issued.csr,
                    issued.serial,
                    issued.not_after.isoformat(),
                )
                self._on_issued(issued)
                return issued
            left = deadline - time.monotonic()
            if left <= 0:
                self._on_request("waiting")
                return None
            await asyncio.sleep(min(poll, left))
            poll = min(poll * 2, _MAX_POLL)

    async def _create(self) -> _Pending:
        from gatekeeper.codec import pki  # only a gatekeeper that asks loads cryptography

        key = pki.new_key()
        request_pem = pki.certificate_request(
            key, self.settings.addresses, f"dra-gatekeeper:{self._node}"
        )
        try:
            state = await create_csr(
                self._upstream,
                request_pem,
                self.settings.signer_name,
                USAGES,
                generate_name=f"dra-gatekeeper-{self._node[:200]}-",
            )
        except UpstreamError:
            self._on_request("error")
            raise
        log.info(
            "serving certificate requested csr=%s signer=%s addresses=%s",
            state.name,
            self.settings.signer_name,
            ",".join(self.settings.addresses),
        )
        return _Pending(state.name, key)

    def _refusal(self, name: str, state: CSRState | None) -> str:
        if state is None:
            return f"CertificateSigningRequest {name} was deleted before it was answered"
        words = f"{state.reason}: {state.message}" if state.message else state.reason
        return (
            f"CertificateSigningRequest {name} was {state.verdict.value.lower()} by signer "
            f"{self.settings.signer_name}: {words or 'no reason given'}"
        )


def _issued(state: CSRState, key: ec.EllipticCurvePrivateKey, received: float) -> Issued:
    """The certificate of ``state`` for ``key``; ValueError if it is not for that key."""
    from cryptography import x509

    from gatekeeper.codec import pki

    try:
        chain = x509.load_pem_x509_certificates(state.certificate)
    except ValueError:
        raise ValueError("the signer's certificate is not PEM") from None
    leaf = chain[0]
    if leaf.public_key() != key.public_key():
        raise ValueError("the signer's certificate is for another key")
    return Issued(
        state.certificate,
        pki.private_pem(key),
        leaf.not_valid_before_utc,
        leaf.not_valid_after_utc,
        leaf.serial_number,
        state.name,
        received,
    )
