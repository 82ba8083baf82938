"""A TLS reverse proxy between a gatekeeper and the real apiserver that runs an action right
after the apiserver answered a matching request: a write by someone else, landing between the
gatekeeper's check (its dry run) and its write. Real HTTP both ways; nothing is simulated."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future

import aiohttp
from aiohttp import web

from tests.realcluster.cluster import RealCluster, free_port

__all__ = ["Interposer"]

_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


class Interposer:
    """Forwards everything to ``cluster``; after the first answered request for which
    ``trigger(method, path_qs)`` is true, calls ``action()`` (blocking, in a worker thread)
    before passing the answer back."""

    def __init__(
        self, cluster: RealCluster, trigger: Callable[[str, str], bool], action: Callable[[], None]
    ) -> None:
        self.cluster = cluster
        self.trigger, self.action = trigger, action
        self.fired = threading.Event()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> Interposer:
        self._thread.start()
        future: Future[None] = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        pair = self.cluster.pki.issue("interposer", "interposer", hosts=("127.0.0.1",))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(pair.cert), str(pair.key))
        upstream = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream))
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=serving).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.cluster.url + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        if not self.fired.is_set() and self.trigger(request.method, request.path_qs):
            await asyncio.to_thread(self.action)
            self.fired.set()
        return web.Response(status=answer.status, body=payload, headers=out)
