"""The upstream seam: the :class:`Upstream` protocol — one streaming method, as httpx's
transport — the :func:`fetch` and :func:`request` built on it, and its one implementation, a
keep-alive session with the node's credentials (a double for tests:
:class:`gatekeeper.testing.harness.MockUpstream`).

Credentials are added here and nowhere else. Library errors are mapped to
:class:`~gatekeeper.errors.UpstreamError` only around the session call and the reading of the
response body: an error of the caller's own (a driver that went away while its answer was
being written) stays what it is.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, Protocol

import aiohttp

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, parse_bounded, shallow, within_depth
from gatekeeper.errors import UpstreamError
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.types import KubeObject
from gatekeeper.upstream.kubeconfig import TokenSource, UpstreamConfig, build_ssl_context

__all__ = [
    "MAX_OBJECT_BYTES",
    "AnswerHook",
    "Pool",
    "Upstream",
    "UpstreamResponse",
    "UpstreamSession",
    "fetch",
    "read_json_object",
    "request",
]

MAX_OBJECT_BYTES = 16 * 1024 * 1024
"""The most the gatekeeper reads of one object it fetches (etcd stores at most 1.5 MiB)."""

_JSON = "application/json"

Pool = Literal["own", "requests", "watches", "reviews"]
"""Whose request it is: the gatekeeper's own reads (fetch, dry run), drivers' requests, drivers'
watches, the token listener's TokenReviews. Each has its own connections
(docs/operating.md#limits)."""
AnswerHook = Callable[[str, float, aiohttp.ClientResponse, bool], None]
"""Called once the upstream's response headers arrived: method, seconds taken, the response,
and whether it is a watch (metrics and shutdown keep track of them; no aiohttp trace, whose
signals cost every request a dozen awaits)."""


class UpstreamResponse(Protocol):
    """An upstream answer as it arrives: status, headers, and the body, errors mapped to
    :class:`~gatekeeper.errors.UpstreamError`."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self, limit: int) -> bytes:
        """At most ``limit`` bytes of the body."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The (rest of the) body, chunk by chunk as it arrives."""
        ...


class Upstream(Protocol):
    """What the pipeline needs of the kube-apiserver: one request whose answer is streamed.
    Implementations add the node's credentials themselves; callers never see or send them,
    except ``credential``: a driver's own bearer token, sent instead of the node's for a kind
    forwarded under the driver's credentials (DESIGN §4.3a)."""

    def stream(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        pool: Pool,
        credential: str | None = None,
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """Open a request; its answer is read inside the context."""
        ...


async def request(
    upstream: Upstream,
    method: str,
    target: str,
    body: Any = None,
    media_type: str = _JSON,
    *,
    pool: Pool = "own",
) -> tuple[int, KubeObject]:
    """One request of the gatekeeper's own (a dry run; a token review, in ``pool`` "reviews"),
    answered in JSON: status and object. ``body`` is JSON-encoded unless it is bytes already
    (an encoded body)."""
    headers = {"Accept": _JSON}
    payload = None
    if body is not None:
        headers["Content-Type"] = media_type
        payload = body if isinstance(body, bytes) else jsoncodec.dumps(body)
    async with upstream.stream(method, target, headers, payload, pool=pool) as response:
        obj = await read_json_object(response.chunks(), target, limit=MAX_OBJECT_BYTES)
    return response.status, obj


async def fetch(upstream: Upstream, path: str) -> KubeObject | None:
    """GET one object as JSON; None when it does not exist (404), 502 on any other failure."""
    status, obj = await request(upstream, "GET", path)
    if status == 404:
        return None
    if status != 200:
        raise UpstreamError(
            502,
            f"reading the stored object {path} failed upstream with HTTP {status}: "
            f"{_status_message(obj)}",
        )
    return obj


class _SessionResponse:
    """An aiohttp answer as an :class:`UpstreamResponse`, its errors mapped."""

    __slots__ = ("_on_eof", "_response")

    def __init__(
        self, response: aiohttp.ClientResponse, on_eof: Callable[[], None] = lambda: None
    ) -> None:
        self._response = response
        self._on_eof = on_eof

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self, limit: int) -> bytes:
        """At most ``limit`` bytes of the body."""
        try:
            return await self._response.content.read(limit)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The (rest of the) body, chunk by chunk as it arrives. At its end the upstream
        connection is back in its pool for the next request (a filtered list's next page)."""
        iterator = self._response.content.iter_any().__aiter__()
        while True:
            try:
                chunk = await iterator.__anext__()
            except StopAsyncIteration:
                self._on_eof()
                return
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _mapped(exc) from exc
            yield chunk


class UpstreamSession:
    """The :class:`Upstream` of a real kube-apiserver, with the node's credentials.

    The server URL and CA come only from configuration, never from a request (DESIGN §4.5).
    Redirects are never followed: a 3xx is a 502.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        tokens: TokenSource | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_answer: AnswerHook | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.config = config
        self._tokens = tokens if tokens is not None else TokenSource(config)
        self._ssl = ssl_context if ssl_context is not None else build_ssl_context(config)
        self._on_answer = on_answer
        self.limits = limits
        # SECURITY: docs/operating.md#limits — four pools, so that drivers' watches (which hold a
        # connection for as long as they last) never make the gatekeeper's own reads, or other
        # drivers' requests, wait: "own" (fetches, previews), "requests", "watches"; and
        # TokenReviews, which anyone who reaches the token listener can cause (DESIGN §4.2,
        # docs/security.md), wait only for each other: "reviews".
        self.pools = {
            "own": _Pool("the gatekeeper's own reads", limits.upstream_own),
            "requests": _Pool("drivers' requests", limits.upstream_requests),
            "watches": _Pool("drivers' watches", limits.upstream_watches),
            "reviews": _Pool("token reviews", limits.upstream_reviews),
        }
        connect = limits.upstream_connect_timeout
        self._timeouts = {
            False: aiohttp.ClientTimeout(sock_connect=connect, sock_read=limits.upstream_timeout),
            True: aiohttp.ClientTimeout(sock_connect=connect, sock_read=None),
        }

    async def start(self) -> None:
        # Requests under a driver's own token get connections of their own, without the
        # gatekeeper's client certificate: the apiserver authenticates a certificate before a
        # bearer token, so on a shared connection the request would be the gatekeeper's.
        delegated_ssl = build_ssl_context(self.config, client_certificate=False)
        for name, pool in self.pools.items():
            pool.session = self._session(self._ssl, pool.size)
            if name != "own":
                pool.delegated = self._session(delegated_ssl, pool.size)

    def _session(self, context: ssl.SSLContext | None, size: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=context if context is not None else False, limit=size, enable_cleanup_closed=True
        )
        return aiohttp.ClientSession(
            base_url=self.config.server,
            connector=connector,
            auto_decompress=True,
            skip_auto_headers=("Accept-Encoding",),
        )

    async def close(self) -> None:
        for pool in self.pools.values():
            for session in (pool.session, pool.delegated):
                if session is not None:
                    await session.close()
            pool.session = pool.delegated = None

    def stream(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        pool: Pool,
        credential: str | None = None,
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        return self._open(
            self.pools[pool], method, target, headers, body, pool == "watches", credential
        )

    @asynccontextmanager
    async def _open(
        self,
        pool: _Pool,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        long_running: bool,
        credential: str | None,
    ) -> AsyncIterator[UpstreamResponse]:
        session = pool.session if credential is None else pool.delegated
        if session is None:
            raise UpstreamError(503, "upstream session is not started")
        sent = dict(headers)
        token = self._tokens.token() if credential is None else credential
        if token:
            sent["Authorization"] = f"Bearer {token}"
        async with (
            pool.slot(self.limits.upstream_wait) as release,
            self._sent(session, method, target, sent, body, long_running, release) as ok,
        ):
            yield ok

    @asynccontextmanager
    async def _sent(
        self,
        session: aiohttp.ClientSession,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        long_running: bool,
        on_eof: Callable[[], None],
    ) -> AsyncIterator[UpstreamResponse]:
        started = time.monotonic()
        try:
            response = await session.request(
                method,
                target,
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=self._timeouts[long_running],
                server_hostname=self.config.tls_server_name,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc) from exc
        if self._on_answer is not None:
            self._on_answer(method, time.monotonic() - started, response, long_running)
        try:
            if 300 <= response.status < 400:
                raise UpstreamError(502, f"upstream answered with a redirect ({response.status})")
            yield _SessionResponse(response, on_eof)
        except BaseException:
            response.close()  # the body was not read to its end: the connection is not reused
            raise
        else:
            response.release()  # back to the pool if the body was read to its end
            await response.wait_for_close()


class _Pool:
    """One upstream connection pool; waiting for a free connection is bounded (then 503)."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.free = asyncio.Semaphore(size)
        self.in_use = 0
        """Connections held now (read by tests and by nothing on the request path)."""
        self.session: aiohttp.ClientSession | None = None
        self.delegated: aiohttp.ClientSession | None = None
        """Connections for requests under a driver's own token (no client certificate)."""

    @asynccontextmanager
    async def slot(self, wait: float) -> AsyncIterator[Callable[[], None]]:
        """Hold one connection of the pool; the callable yielded gives it back early (once an
        answer's body is read to its end), else it is given back on exit."""
        try:
            if self.free.locked():
                async with asyncio.timeout(wait):
                    await self.free.acquire()
            else:
                await self.free.acquire()  # a connection is free: taken at once, no timer
        except TimeoutError:
            raise UpstreamError(
                503,
                f"no upstream connection for {self.name} came free within {wait:g} seconds "
                f"(all {self.size} in use); retry later",
            ) from None
        held = True
        self.in_use += 1

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.in_use -= 1
                self.free.release()

        try:
            yield release
        finally:
            release()


async def read_json_object(
    chunks: AsyncIterable[bytes],
    what: str,
    *,
    limit: int,
    too_large: str = "",
    max_depth: int | None = MAX_OBJECT_DEPTH,
) -> KubeObject:
    """An upstream JSON object read incrementally, never past ``limit`` bytes; else 502.

    ``too_large`` is appended to the message when the limit is hit (what the client can do).
    Any depth is parsed without a crash; past ``max_depth`` the object is a 502 (the
    gatekeeper does not evaluate what it cannot copy and compare). With ``max_depth`` None,
    subtrees past :data:`MAX_OBJECT_DEPTH` come back as ``jsonbounds.TOO_DEEP`` and the caller
    judges each object.
    """
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise UpstreamError(502, f"the upstream {what} exceeds {limit} bytes{too_large}")
    try:
        obj = parse_bounded(data, limit=MAX_OBJECT_DEPTH)
    except ValueError as exc:
        raise UpstreamError(502, f"upstream sent invalid JSON for {what}") from exc
    if not isinstance(obj, dict):
        raise UpstreamError(502, f"upstream sent a non-object for {what}")
    if (
        max_depth is not None
        and not shallow(data, min(max_depth, MAX_OBJECT_DEPTH))
        and not within_depth(obj, max_depth)
    ):
        raise UpstreamError(
            502,
            f"the upstream object for {what} is nested more than {max_depth} levels deep: "
            "the gatekeeper does not evaluate it",
        )
    return obj


def _mapped(exc: BaseException) -> UpstreamError:
    """The :class:`UpstreamError` for a library error of the upstream connection."""
    if isinstance(exc, TimeoutError):
        return UpstreamError(504, "the upstream API server did not answer in time")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError(503, f"the upstream API server is unreachable: {exc.strerror or exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamError(503, "the upstream API server closed the connection")
    return UpstreamError(502, f"upstream request failed: {type(exc).__name__}")


def _status_message(obj: KubeObject) -> str:
    return str(obj.get("message", ""))[:300]
