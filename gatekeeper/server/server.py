"""The running gatekeeper, built from a :class:`~gatekeeper.server.config.ServeConfig` alone.

``start()`` binds every socket first and only then listens, so a port in use or an unwritable
socket directory is a ConfigError (exit 2) with nothing listening; ``stop()`` drains: stop
accepting, end watches, let in-flight requests finish within the grace period, flush the audit,
remove the sockets. :func:`run_until_signal` runs it until SIGTERM/SIGINT and reloads on SIGHUP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gatekeeper import __version__
from gatekeeper.audit import AuditSink, JsonLinesWriter, NullSink
from gatekeeper.errors import ConfigError
from gatekeeper.listen.capacity import ConnectionGuard
from gatekeeper.listen.connections import GuardedRunner
from gatekeeper.listen.identity import Identifier, token_reviewer
from gatekeeper.listen.listeners import SOCKET_NAME, DriverSocket, SocketListeners
from gatekeeper.listen.servingcert import Issued, ServingCertificate
from gatekeeper.listen.tls import IssuedTLS, ListenerTLS
from gatekeeper.listen.tlsgate import TLSGateSite
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine
from gatekeeper.policy.model import Policy
from gatekeeper.proxy.budgets import DriverBudgets
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.server.config import AuditSettings, ServeConfig
from gatekeeper.server.expiry import CertificateExpiry
from gatekeeper.server.health import (
    HEALTH_PATHS,
    HealthServer,
    Readiness,
    health_server,
    upstream_probe,
)
from gatekeeper.server.isolation import IsolationCollector
from gatekeeper.server.metrics import MeteredSink, Metrics, UpstreamWatches
from gatekeeper.server.reload import Reloader
from gatekeeper.server.schemas import check_fields
from gatekeeper.types import Identity
from gatekeeper.upstream.session import Upstream, UpstreamSession

__all__ = [
    "SOCKET_NAME",
    "GatekeeperServer",
    "Listener",
    "bind_listeners",
    "close_listeners",
    "open_audit",
    "run_until_signal",
    "socket_path",
]

log = logging.getLogger("gatekeeper.server")


def socket_path(socket_dir: Path, driver: str) -> Path:
    """``DIR/<driver>/api.sock``: a driver pod mounts only its own directory (DESIGN §4.2)."""
    return socket_dir / driver / SOCKET_NAME


@dataclass(frozen=True, slots=True)
class Listener:
    """A bound (not yet listening) socket of one ``kind``."""

    kind: ListenerKind
    sock: socket.socket
    driver: str = ""
    path: str = ""
    """The Unix socket's file (kept: a closed socket no longer knows its name)."""

    @property
    def address(self) -> str:
        """The socket path, or HOST:PORT (the bound port, also for port 0)."""
        return _address(self.sock.getsockname())


def _address(name: object) -> str:
    if isinstance(name, str):
        return name
    assert isinstance(name, tuple)
    host = f"[{name[0]}]" if ":" in str(name[0]) else name[0]
    return f"{host}:{name[1]}"


def bind_listeners(
    config: ServeConfig, drivers: list[str], sockets: SocketListeners | None = None
) -> list[Listener]:
    """Bind every socket ``config`` asks for, or none: ConfigError naming the flag.

    Binding is the last check before listening (a port in use, a socket directory that cannot
    hold sockets or is in use by another instance); nothing accepts a connection until every
    socket is bound. A driver whose socket path cannot be used is skipped, logged
    (:mod:`gatekeeper.listen.listeners`): it costs only that driver its listener.
    """
    bound: list[Listener] = []
    try:
        if config.socket_dir is not None:
            assert sockets is not None, "a socket directory needs its SocketListeners"
            sockets.acquire()
            for driver_socket in sockets.bind(drivers):
                bound.append(_unix_listener(driver_socket.driver, driver_socket))
        if config.listen is not None:
            sock = _bind_tcp(*config.listen, config.listen_flag)
            bound.append(Listener(ListenerKind.MTLS, sock))
        if config.listen_token is not None:
            sock = _bind_tcp(*config.listen_token, "--listen-token")
            bound.append(Listener(ListenerKind.TOKEN, sock))
        if config.health_listen is not None:
            sock = _bind_tcp(*config.health_listen, "--health-listen")
            bound.append(Listener(ListenerKind.HEALTH, sock))
    except BaseException:
        close_listeners(bound, sockets)
        raise
    return bound


def close_listeners(listeners: list[Listener], sockets: SocketListeners | None = None) -> None:
    """Close bound sockets; the Unix socket files go with ``sockets`` (only those still ours)."""
    for listener in listeners:
        listener.sock.close()
    if sockets is not None:
        sockets.close()


def _unix_listener(driver: str, bound: DriverSocket) -> Listener:
    return Listener(ListenerKind.UNIX, bound.sock, driver, bound.path)


def _bind_tcp(host: str, port: int, flag: str) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{flag} {host}:{port}: cannot resolve: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{flag} {host}:{port}: cannot listen: {_why(exc)}") from None
    return sock


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def open_audit(settings: AuditSettings) -> AuditSink:
    """The audit sink ``settings`` ask for; ConfigError if the file cannot be opened."""
    if not settings.path:
        return NullSink()
    try:
        return JsonLinesWriter(
            settings.path, max_size_mb=settings.max_size_mb, max_backups=settings.max_backups
        )
    except OSError as exc:
        raise ConfigError(f"--audit-log {settings.path}: {_why(exc)}") from None


class GatekeeperServer:
    """The running gatekeeper: start() binds then listens, stop() drains and closes.

    ``upstream`` and ``audit`` replace the ones the config describes (tests, benchmarks).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        upstream: Upstream | None = None,
        audit: AuditSink | None = None,
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        self.metrics.policy = lambda: self.engine.policy
        self.upstream_watches = UpstreamWatches()
        sink = audit if audit is not None else open_audit(config.audit)
        if isinstance(sink, JsonLinesWriter):
            self.metrics.watch_audit(sink)
        self.audit: AuditSink = MeteredSink(sink, self.metrics)
        self.upstream = upstream or UpstreamSession(
            config.upstream,
            tokens=config.tokens,
            ssl_context=config.upstream_ssl,
            on_answer=self.metrics.upstream_answer(self.upstream_watches),
            limits=config.limits,
        )
        self.gatekeeper = Gatekeeper(
            engine=Engine(config.policy, config.node_name, node_labels=dict(config.node_labels)),
            upstream=self.upstream,
            audit=self.audit,
            audit_level=config.audit.level,
            budgets=DriverBudgets(config.limits),
        )
        reviewer = None
        if config.listen_token is not None:
            reviewer = token_reviewer(
                self.upstream,
                self.gatekeeper,
                config.limits,
                audiences=config.token_audiences,
                ttl=config.token_cache_ttl,
                on_review=lambda result: self.metrics.token_reviews.labels(result).inc(),
            )
        self.identifier = Identifier(
            self.gatekeeper, reviewer, on_token_failure=self.metrics.token_failed
        )
        """Who is calling, for every listener (socket paths and token ports as they start)."""
        self.identifier.on_identified = self._identified
        self.readiness = Readiness(
            upstream_probe(self.upstream), lambda: self.listening, ttl=config.readiness_cache
        )
        self.expiry = CertificateExpiry(self.metrics, config.cert_expiry_warning)
        self.metrics.watch_in_flight(self.gatekeeper.in_flight.by_driver)
        self.reloader = Reloader(config, self.metrics, self.expiry, use=self.use_policy)
        for tls in (config.listen_tls, config.token_tls):
            if tls is not None:
                tls.on_handshake_failure = self._handshake_failed
        self._runners: list[web.BaseRunner] = []
        self._listeners: list[Listener] = []
        self._sockets = (
            SocketListeners(config.socket_dir, group=config.socket_group)
            if config.socket_dir is not None
            else None
        )
        self.tls_port: int | None = None
        self.token_port: int | None = None
        self.health_port: int | None = None
        self.listening = False
        self._fields: asyncio.Future[list[str]] | None = None
        """The check of the policy's CEL against the apiserver's schemas (at load, reload)."""
        self.guard: ConnectionGuard | None = None
        """Counts the drivers' listeners' connections (set by :meth:`start`)."""
        self.health: HealthServer | None = None
        """The health listener's server, holding its connections (set by :meth:`start`)."""
        self.serving: ServingCertificate | None = None
        """The token listener's certificate from the CSR API (``--token-cert-signer``)."""
        self.token_tls: ListenerTLS | None = config.token_tls
        """The token listener's context: its files', or the requested certificate's."""
        self._renewal: asyncio.Task[None] | None = None

    @property
    def engine(self) -> Engine:
        return self.gatekeeper.engine

    async def start(self) -> None:
        """Bind every socket (ConfigError if one fails, nothing listening), then listen: the
        health listener first (alive, not ready), then, once the token listener's requested
        certificate is issued (ConfigError if it is not), the drivers' listeners."""
        drivers = sorted(self.engine.policy.drivers)
        self._listeners = bind_listeners(self.config, drivers, self._sockets)
        if isinstance(self.upstream, UpstreamSession):
            await self.upstream.start()
        # In-flight requests are drained before the runner shuts down (InFlight.drain).
        runner = GuardedRunner(self.identifier, self.config.limits, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        self.guard = runner.guard
        health_runner = await self._health_runner()
        self.metrics.registry.register(IsolationCollector(runner.guard, self.health))
        for listener in self._listeners:
            if listener.kind is ListenerKind.HEALTH and health_runner is not None:
                await self._listen(health_runner, listener)
        first = await self._first_certificate()
        for listener in self._listeners:
            if listener.kind is not ListenerKind.HEALTH:
                await self._listen(runner, listener)
        self.listening = True
        self.reloader.start()
        if self.serving is not None and isinstance(self.token_tls, IssuedTLS):
            assert first is not None
            self._renewal = asyncio.ensure_future(self.serving.renew(self.token_tls, first))
            self._renewal.add_done_callback(_renewal_ended)
        self._log_started()
        self._check_fields(self.engine.policy)

    def _check_fields(self, policy: Policy) -> None:
        """The policy's CEL against the apiserver's schemas, in the background: a warning per
        field they do not have (docs/policy.md#what-is-checked-at-load), never a delay."""
        if self._fields is not None:
            self._fields.cancel()
        self._fields = asyncio.ensure_future(check_fields(self.upstream, policy))

    async def fields_checked(self) -> list[str]:
        """The warnings of the last check against the schemas, once it is done."""
        assert self._fields is not None, "started"
        return await asyncio.shield(self._fields)

    async def _first_certificate(self) -> Issued | None:
        """The token listener's certificate from the CSR API, when it is requested."""
        request = self.config.token_cert
        if request is None:
            return None
        self.serving = ServingCertificate(
            request,
            self.upstream,
            self.config.node_name,
            on_issued=lambda issued: self.expiry.hold("token-listener", issued.not_after),
            on_request=lambda result: self.metrics.cert_requests.labels(result).inc(),
        )
        first = await self.serving.first()
        self.token_tls = IssuedTLS(first.cert_pem, first.key_pem)
        self.token_tls.on_handshake_failure = self._handshake_failed
        return first

    async def _health_runner(self) -> web.BaseRunner | None:
        """The health listener's runner, when one is configured (its own connection cap and
        timeouts: :func:`~gatekeeper.server.health.health_server`)."""
        if self.config.health_listen is None:
            return None
        self.health = health_server(self.readiness, self.metrics, self.config.limits)
        runner = web.ServerRunner(self.health, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _listen(self, runner: web.BaseRunner, listener: Listener) -> None:
        site: web.BaseSite
        kind = listener.kind
        # Every driver's connection comes back at once after a restart
        # (docs/operating.md#connection-storms): the kernel holds as many as the cap while they
        # are accepted (Linux caps it at net.core.somaxconn, 4,096 by default).
        backlog = self.config.limits.connections_total
        tls: dict[ListenerKind, ListenerTLS | None] = {
            ListenerKind.MTLS: self.config.listen_tls,
            ListenerKind.TOKEN: self.token_tls,
        }
        if (context := tls.get(kind)) is not None:
            assert isinstance(runner, GuardedRunner)
            site = TLSGateSite(runner, listener.sock, context, listener=kind, backlog=backlog)
        elif kind is ListenerKind.HEALTH:
            # No more waiting to be accepted than the cap: what is accepted at once, before the
            # cap can close any, is a descriptor each (counted by limits.descriptor_budget).
            backlog = self.config.limits.health_connections
            site = web.SockSite(runner, listener.sock, backlog=backlog)
        else:
            site = web.SockSite(runner, listener.sock, backlog=backlog)
        await site.start()
        port = listener.sock.getsockname()[1] if kind is not ListenerKind.UNIX else 0
        if kind is ListenerKind.UNIX:
            # The accepted socket reports the listening path as its sockname: the identity.
            self.identifier.socket_drivers[listener.path] = listener.driver
        elif kind is ListenerKind.MTLS:
            self.tls_port = int(port)
        elif kind is ListenerKind.TOKEN:
            # The accepted socket reports the listening port: its drivers show a token.
            self.token_port = int(port)
            self.identifier.token_ports.add(self.token_port)
        else:
            self.health_port = int(port)

    def _log_started(self) -> None:
        config, policy = self.config, self.engine.policy
        log.info(
            "started version=%s node=%s drivers=%s policy=%s kinds=%s upstream=%s",
            __version__,
            config.node_name,
            ",".join(sorted(policy.drivers)),
            policy.source,
            ",".join(sorted(spec.qualified for spec in policy.kinds.values())),
            config.upstream.server,
        )
        for listener in self._listeners:
            if listener.kind is ListenerKind.UNIX:
                log.info("listening driver=%s socket=%s", listener.driver, listener.path)
            elif listener.kind.serves_drivers:
                log.info("listening %s=%s", listener.kind, listener.address)
            else:
                log.info(
                    "listening health=%s paths=%s max_connections=%d",
                    listener.address,
                    ",".join(HEALTH_PATHS),
                    self.config.limits.health_connections,
                )

    async def stop(self) -> None:
        """Stop accepting, end watches, drain in-flight requests, flush the audit, clean up."""
        self.listening = False
        await self.reloader.stop()
        if self._fields is not None:
            self._fields.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._fields
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()
        # Watches opened meanwhile on kept-alive connections are ended too.
        in_flight = self.gatekeeper.in_flight
        await in_flight.drain(self.config.shutdown_grace, self.upstream_watches.end_all)
        await self._cleanup_runners()
        if isinstance(self.upstream, UpstreamSession):
            await self.upstream.close()
        close_listeners(self._listeners, self._sockets)
        self._listeners = []
        await self.audit.aclose()

    async def _cleanup_runners(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()

    def _identified(self, identity: Identity) -> None:
        """A connection was identified (once, when it was made): note a client certificate
        close to expiry."""
        not_after = identity.peer.get("certNotAfter")
        if not_after and self.engine.policy.allows_driver(identity.driver):
            self.expiry.observe_client(identity.driver, not_after)

    async def use_policy(self, policy: Policy) -> None:
        """Serve ``policy`` from the next request on (a reload): a new engine, and the socket
        listeners of the drivers it adds or removes."""
        old = self.engine.policy
        config = self.config
        self.gatekeeper.engine = Engine(
            policy, config.node_name, node_labels=dict(config.node_labels)
        )
        await self.remove_driver_sockets(sorted(old.drivers - policy.drivers))
        await self.add_driver_sockets(sorted(policy.drivers - old.drivers))
        self._check_fields(policy)

    def _handshake_failed(self, peer: str, reason: str) -> None:
        self.metrics.tls_failures.labels(reason[:60]).inc()

    async def add_driver_sockets(self, drivers: list[str]) -> None:
        """Listen for drivers a reloaded policy added (socket listener only)."""
        if self._sockets is None or not self._runners:
            return
        for bound in self._sockets.bind(drivers):  # a path it cannot use is logged, skipped
            listener = _unix_listener(bound.driver, bound)
            self._listeners.append(listener)
            await self._listen(self._runners[0], listener)

    async def remove_driver_sockets(self, drivers: list[str]) -> None:
        """Stop listening for drivers a reloaded policy removed."""
        gone = set(drivers)
        for path, driver in list(self.identifier.socket_drivers.items()):
            if driver in gone:
                del self.identifier.socket_drivers[path]
                log.info("closed driver=%s socket=%s", driver, path)
        runner = self._runners[0] if self._runners else None
        if runner is not None:
            for site in list(runner.sites):
                if isinstance(site, web.SockSite) and site.name.endswith(
                    tuple(f"/{d}/{SOCKET_NAME}:" for d in gone)
                ):
                    await site.stop()
        self._listeners = [
            listener
            for listener in self._listeners
            if not (listener.kind is ListenerKind.UNIX and listener.driver in gone)
        ]
        if self._sockets is not None:
            for driver in gone:
                self._sockets.release(driver)  # only the file that is still ours


def _renewal_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        # Never silent: the certificate now expires unrenewed (the expiry metric shows it).
        log.error("serving certificate renewal stopped", exc_info=exc)


async def run_until_signal(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    reload: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run ``start()``, wait for SIGINT/SIGTERM, then ``stop()`` (always); SIGHUP: ``reload``."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    reloads: set[asyncio.Task[None]] = set()
    if reload is not None:

        def on_hup() -> None:
            task = asyncio.ensure_future(reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        try:
            await start()
        except BaseException:
            await stop()  # whatever start() got to; its error is the one line to report
            raise
        try:
            await stopping.wait()
            log.info("stopping: draining in-flight requests")
        finally:
            await stop()
        log.info("stopped")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)
