"""Upstream doubles: :class:`MockUpstream`, whose answers a handler gives (httpx's
``MockTransport``), for faults a real server cannot produce; and :class:`InterleavedUpstream`, a
real session that lets another client's write land right after the gatekeeper's own read."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import Pool, UpstreamResponse, UpstreamSession

__all__ = ["Handler", "InterleavedUpstream", "MockResponse", "MockUpstream", "UpstreamCall"]


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One request the gatekeeper sent upstream."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes | None
    pool: Pool


@dataclass(slots=True)
class MockResponse:
    """A canned upstream answer."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})

    async def read(self, limit: int) -> bytes:
        data, self.body = self.body[:limit], self.body[limit:]
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.body:
            data, self.body = self.body, b""
            yield data


Handler = Callable[[UpstreamCall], "MockResponse | Awaitable[MockResponse]"]
"""Gives the answer to one upstream call (or raises: a broken upstream)."""


class MockUpstream:
    """An :class:`~gatekeeper.upstream.session.Upstream` that asks ``handler`` for each answer;
    the handler may raise (a broken upstream) or wait. ``calls`` keeps every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.calls: list[UpstreamCall] = []

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
        sent = dict(headers)
        if credential is not None:
            sent["Authorization"] = f"Bearer {credential}"
        return self._open(UpstreamCall(method, target, sent, body, pool))

    @asynccontextmanager
    async def _open(self, call: UpstreamCall) -> AsyncIterator[UpstreamResponse]:
        self.calls.append(call)
        answer = self.handler(call)
        if inspect.isawaitable(answer):
            answer = await answer
        assert isinstance(answer, MockResponse)
        yield answer


class InterleavedUpstream(UpstreamSession):
    """A real session that calls ``after_read(path)`` once the gatekeeper's own read of an API
    object (its fetch before deciding) has been answered: what another client writes there lands
    between the gatekeeper's check and its forward."""

    def __init__(self, config: UpstreamConfig, after_read: Callable[[str], object]) -> None:
        super().__init__(config)
        self.after_read = after_read

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
        opened = super().stream(method, target, headers, body, pool=pool, credential=credential)
        if pool != "own" or method != "GET" or not target.startswith("/api"):
            return opened
        return self._then(opened, target)

    @asynccontextmanager
    async def _then(
        self, opened: AbstractAsyncContextManager[UpstreamResponse], target: str
    ) -> AsyncIterator[UpstreamResponse]:
        async with opened as response:
            yield response
        self.after_read(target)
