"""Listeners and lifecycle: per-driver Unix sockets, the mTLS port, and the health port."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from gatekeeper.audit import AuditLevel, AuditSink, NullSink
from gatekeeper.connections import GuardedRunner
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.listeners import SOCKET_NAME, SocketListeners
from gatekeeper.policy import Engine, Policy
from gatekeeper.proxy import Gatekeeper, build_app
from gatekeeper.upstream import Upstream

__all__ = ["SOCKET_NAME", "GatekeeperServer", "socket_path"]

log = logging.getLogger("gatekeeper.server")

# Many drivers reconnecting at once (a node reboot) overflow the default backlog of 128.
_BACKLOG = 1024


def socket_path(socket_dir: Path, driver: str) -> Path:
    """``DIR/<driver>/api.sock``: a driver pod mounts only its own directory (DESIGN §4.2)."""
    return socket_dir / driver / SOCKET_NAME


class GatekeeperServer:
    """The running gatekeeper: start() binds every listener, stop() drains and closes."""

    def __init__(
        self,
        *,
        policy: Policy,
        node_name: str,
        upstream: Upstream,
        node_labels: Mapping[str, str] | None = None,
        audit: AuditSink | None = None,
        audit_level: AuditLevel = AuditLevel.METADATA,
        socket_dir: Path | None = None,
        listen: tuple[str, int] | None = None,
        listen_ssl: ssl.SSLContext | None = None,
        health_listen: tuple[str, int] | None = None,
        socket_group: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.limits = limits
        self.upstream = upstream
        self.audit = audit or NullSink()
        self.gatekeeper = Gatekeeper(
            engine=Engine(policy, node_name, node_labels=dict(node_labels or {})),
            upstream=upstream,
            audit=self.audit,
            audit_level=audit_level,
        )
        self._socket_dir = socket_dir
        self._sockets = (
            SocketListeners(socket_dir, group=socket_group) if socket_dir is not None else None
        )
        self._listen = listen
        self._listen_ssl = listen_ssl
        self._health_listen = health_listen
        self._runners: list[web.AppRunner] = []
        self.tls_port: int | None = None
        self.health_port: int | None = None
        self.ready = False

    async def start(self) -> None:
        if self._sockets is not None:
            self._sockets.acquire()  # a second instance on the directory stops here (exit 2)
        await self.upstream.start()
        runner = GuardedRunner(
            build_app(self.gatekeeper), self.limits, handler_cancellation=True, access_log=None
        )
        await runner.setup()
        self._runners.append(runner)
        if self._socket_dir is not None:
            await self._start_sockets(runner, self._socket_dir)
        if self._listen is not None:
            host, port = self._listen
            site = web.TCPSite(runner, host, port, ssl_context=self._listen_ssl, backlog=_BACKLOG)
            await site.start()
            self.tls_port = _bound_port(site)
            log.info("listening mtls=%s:%s", host, self.tls_port)
        if self._health_listen is not None:
            await self._start_health(*self._health_listen)
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        await self.upstream.close()
        if self._sockets is not None:
            self._sockets.close()  # only our own socket files, then the directory lock
        await self.audit.aclose()

    async def _start_sockets(self, runner: web.AppRunner, socket_dir: Path) -> None:
        assert self._sockets is not None
        for bound in self._sockets.bind(sorted(self.gatekeeper.engine.policy.drivers)):
            await web.SockSite(runner, bound.sock, backlog=_BACKLOG).start()
            # The accepted socket reports the listening path as its sockname: that is the identity.
            self.gatekeeper.socket_drivers[bound.path] = bound.driver

    async def _start_health(self, host: str, port: int) -> None:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(
                text="ok" if self.ready else "not ready", status=200 if self.ready else 503
            )

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port)
        await site.start()
        self.health_port = _bound_port(site)


def _bound_port(site: web.TCPSite) -> int:
    server = site._server  # aiohttp exposes the bound port only through the server's sockets
    assert server is not None
    return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
