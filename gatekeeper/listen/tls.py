"""The TLS listeners' contexts, and failed handshakes made visible.

The listening socket keeps one context for its whole life; each new connection's handshake
switches to the listener's current one, so a renewed serving certificate or client CA applies
to the next connection without a restart, and established ones are untouched (DESIGN §4.2).
The current context comes from files (:class:`ServerTLS`, as they were at the last
:meth:`ServerTLS.reload`) or from a pair held in memory (:class:`IssuedTLS`, the token
listener's certificate from the CSR API: its key is never written to a file).

The client certificate is required at the handshake (DESIGN §4.2): a connection without one,
or with one from another CA, never reaches HTTP. The listener runs its handshakes itself
(:mod:`gatekeeper.listen.tlsgate`) and reports each one that fails here: it is counted, and logged
once per peer address and minute (for at most a bounded number of addresses a minute).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gatekeeper.codec.certdates import first_pem_certificate, not_after
from gatekeeper.errors import ConfigError

__all__ = [
    "IssuedTLS",
    "ListenerTLS",
    "ServerTLS",
    "TLSFiles",
    "certificate_expiry",
    "file_identity",
]

log = logging.getLogger("gatekeeper.tls")

_LOG_EVERY_SECONDS = 60.0
_LOGGED_PEERS = 1000
"""Peer addresses remembered for the once-a-minute log: a client picks its source address
(any of 127.0.0.0/8 on loopback), so the memory of them is bounded."""


def certificate_expiry(path: str | Path) -> datetime:
    """When the (first) certificate in the PEM file ``path`` expires; ConfigError if unreadable."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return not_after(first_pem_certificate(data))
    except ValueError:
        raise ConfigError(f"{path}: not a PEM certificate") from None


def file_identity(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime ns) of ``path`` following symlinks (a ConfigMap's ``..data`` swap)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The files of a TLS listener: serving certificate and key, and the client CA (mTLS);
    without one, no client certificate is asked for (the token listener)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def identity(self) -> tuple[object, ...]:
        files = (self.cert_file, self.key_file, self.client_ca_file)
        return tuple(file_identity(p) for p in files if p is not None)


def _server_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The token listener: the driver is its bearer token's (TokenReview), not a certificate's;
    # rest.InClusterConfig() presents none. The mTLS listener asks for one below.
    context.verify_mode = ssl.CERT_NONE
    return context


def _build_context(files: TLSFiles) -> ssl.SSLContext:
    context = _server_context()
    if files.client_ca_file is None:
        _load_pair(context, files.cert_file, files.key_file)
        return context
    # SECURITY: docs/operating.md#limits — the certificate is required and verified at the
    # handshake:
    # a process without a credential gets no HTTP connection at all, so it can hold nothing
    # but a handshake in the listener's small unauthenticated bucket (the driver without a
    # certificate sees a TLS error, not a 401; docs/operating.md#troubleshooting).
    context.verify_mode = ssl.CERT_REQUIRED
    _load_pair(context, files.cert_file, files.key_file)
    _readable("--client-ca-file", files.client_ca_file)
    try:
        context.load_verify_locations(cafile=files.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--client-ca-file {files.client_ca_file}: cannot load: {_reason(exc)}"
        ) from None
    return context


def _readable(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None


def _load_pair(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    """Load the serving pair; a failure names the file at fault, or says they do not match."""
    cert = _readable("--tls-cert-file", cert_file)
    key = _readable("--tls-key-file", key_file)
    try:
        context.load_cert_chain(cert_file, key_file)
        return
    except (OSError, ssl.SSLError) as exc:
        failure = _reason(exc)
    both = f"--tls-cert-file {cert_file} / --tls-key-file {key_file}"
    is_cert, is_key = b"-----BEGIN CERTIFICATE-----" in cert, b"PRIVATE KEY-----" in key
    if not is_cert and not is_key and b"PRIVATE KEY-----" in cert and b"CERTIFICATE-----" in key:
        message = f"{both}: certificate and key do not match (the two files are swapped)"
    elif not is_cert:
        message = f"--tls-cert-file {cert_file}: not a PEM certificate"
    elif not is_key:
        message = f"--tls-key-file {key_file}: not a PEM private key"
    elif "KEY_VALUES_MISMATCH" in failure or "key values mismatch" in failure.lower():
        message = f"{both}: certificate and key do not match"
    else:
        message = f"{both}: cannot load: {failure}"
    raise ConfigError(message)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@contextlib.contextmanager
def _memory_files(*contents: bytes) -> Iterator[list[str]]:
    """Paths that read as ``contents`` for as long as the block runs, for ssl's loaders (which
    read only files): anonymous memory files (Linux ``memfd``), on no file system; elsewhere
    files in a private temporary directory, removed at once."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create("dra-gatekeeper-tls", os.MFD_CLOEXEC) for _ in contents]
        try:
            for fd, data in zip(fds, contents, strict=True):
                os.write(fd, data)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="dra-gatekeeper-tls-") as directory:
        paths = []
        for n, data in enumerate(contents):
            path = os.path.join(directory, str(n))
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
            paths.append(path)
        yield paths


def _pem_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A token listener's context for a serving pair held in memory; ValueError if it does not
    load (the two do not match, or either is not PEM)."""
    context = _server_context()
    with _memory_files(cert_pem, key_pem) as (cert_path, key_path):
        try:
            context.load_cert_chain(cert_path, key_path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"the serving pair does not load: {_reason(exc)}") from None
    return context


class ListenerTLS:
    """A TLS listener's context (see the module docstring): give :attr:`context` to the
    listening socket; each handshake switches to :attr:`current`.
    ``on_handshake_failure(peer, reason)`` is called for every failed handshake."""

    def __init__(self, context: ssl.SSLContext, listening: ssl.SSLContext) -> None:
        self.on_handshake_failure: Callable[[str, str], None] = lambda peer, reason: None
        self._current = context
        self._logged: dict[str, float] = {}
        self._flood_logged = -_LOG_EVERY_SECONDS
        # The listening context is the first one built; every handshake switches to the
        # current one (ssl's documented use of sni_callback, called with no name too: clients
        # connecting to an address send none), before the certificates are sent or the
        # client's verified. The callback holds this object, not the other way round.
        self.context = listening
        self.context.sni_callback = self._choose

    @property
    def current(self) -> ssl.SSLContext:
        """The context new connections get."""
        return self._current

    def _choose(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _old: ssl.SSLContext
    ) -> None:
        connection.context = self._current

    def handshake_failed(self, peer: str, reason: str) -> None:
        """Count a failed handshake from ``peer`` (an address), and log it once a minute."""
        self.on_handshake_failure(peer, reason)
        now = time.monotonic()
        if now - self._logged.get(peer, -_LOG_EVERY_SECONDS) < _LOG_EVERY_SECONDS:
            return
        if len(self._logged) >= _LOGGED_PEERS:
            self._logged = {p: t for p, t in self._logged.items() if now - t < _LOG_EVERY_SECONDS}
        if len(self._logged) >= _LOGGED_PEERS:
            # More failing peers this minute than remembered: one line for all of them.
            if now - self._flood_logged >= _LOG_EVERY_SECONDS:
                self._flood_logged = now
                log.warning(
                    "tls handshakes failing from more than %d peers a minute; more are "
                    "counted (dra_gatekeeper_tls_handshake_failures_total), not logged",
                    _LOGGED_PEERS,
                )
            return
        self._logged[peer] = now
        log.warning("tls handshake failed peer=%s reason=%s", peer, reason)


class ServerTLS(ListenerTLS):
    """A TLS listener's context following its files. Build it with :meth:`load` (ConfigError
    on unreadable files, before anything listens)."""

    def __init__(self, files: TLSFiles, context: ssl.SSLContext) -> None:
        super().__init__(context, _build_context(files))
        self.files = files
        self._loaded = files.identity()

    @classmethod
    def load(cls, files: TLSFiles) -> ServerTLS:
        """The context for ``files``; ConfigError naming the flag and file on any problem."""
        return cls(files, _build_context(files))

    def changed(self) -> bool:
        """Whether a file changed (inode, size or mtime) since the last load."""
        return self.files.identity() != self._loaded

    def reload(self) -> None:
        """Load the files again; new connections use them. ConfigError keeps the old ones."""
        identity = self.files.identity()
        context = _build_context(self.files)
        self._current, self._loaded = context, identity

    def not_after(self) -> datetime:
        """When the serving certificate expires."""
        return certificate_expiry(self.files.cert_file)


class IssuedTLS(ListenerTLS):
    """The token listener's context for a serving pair held in memory (the CSR API's), swapped
    by :meth:`use` when a new one is issued; ValueError when a pair does not load."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        super().__init__(_pem_context(cert_pem, key_pem), _pem_context(cert_pem, key_pem))

    def use(self, cert_pem: bytes, key_pem: bytes) -> None:
        """New connections get this pair (established ones keep theirs)."""
        self._current = _pem_context(cert_pem, key_pem)
