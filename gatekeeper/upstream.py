"""The one upstream session: the node's credentials, a keep-alive pool, errors mapped once."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from gatekeeper.errors import UpstreamError
from gatekeeper.kubeconfig import TokenSource, UpstreamConfig, build_ssl_context
from gatekeeper.types import KubeObject

__all__ = ["MAX_OBJECT_BYTES", "Upstream", "read_json_object"]

MAX_OBJECT_BYTES = 16 * 1024 * 1024
"""The most the gatekeeper reads of one object it fetches (etcd stores at most 1.5 MiB)."""

_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
_WATCH_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)


class Upstream:
    """Sends requests to the kube-apiserver with the node's credentials.

    The server URL and CA come only from configuration, never from a request (DESIGN §4.5).
    Redirects are never followed: a 3xx is a 502.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        max_connections: int = 100,
        tokens: TokenSource | None = None,
        ssl_context: ssl.SSLContext | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.config = config
        self._tokens = tokens if tokens is not None else TokenSource(config)
        self._ssl = ssl_context if ssl_context is not None else build_ssl_context(config)
        self._trace_configs = list(trace_configs)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            ssl=self._ssl if self._ssl is not None else False,
            limit=self._max_connections,
            enable_cleanup_closed=True,
        )
        self._session = aiohttp.ClientSession(
            base_url=self.config.server,
            connector=connector,
            auto_decompress=True,
            skip_auto_headers=("Accept-Encoding",),
            trace_configs=self._trace_configs or None,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def token(self) -> str | None:
        return self._tokens.token()

    async def fetch(self, path: str) -> KubeObject | None:
        """GET one object as JSON with the node's credentials; None when it does not exist."""
        status, obj = await self.call("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise UpstreamError(
                502,
                f"reading the stored object {path} failed upstream with HTTP {status}: "
                f"{_status_message(obj)}",
            )
        return obj

    async def call(
        self, method: str, target: str, body: Any = None, media_type: str = "application/json"
    ) -> tuple[int, KubeObject]:
        """One JSON request of the gatekeeper's own (a fetch, a dry run): status and object."""
        headers = {"Accept": "application/json"}
        if token := self.token():
            headers["Authorization"] = f"Bearer {token}"
        payload = None
        if body is not None:
            headers["Content-Type"] = media_type
            payload = json.dumps(body).encode()
        async with self.request(method, target, headers, payload, long_running=False) as response:
            obj = await read_json_object(response.content, target, limit=MAX_OBJECT_BYTES)
        return response.status, obj

    @asynccontextmanager
    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        long_running: bool,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open a request upstream; library errors become :class:`UpstreamError`."""
        if self._session is None:
            raise UpstreamError(503, "upstream session is not started")
        timeout = _WATCH_TIMEOUT if long_running else _REQUEST_TIMEOUT
        try:
            async with self._session.request(
                method,
                target,
                headers=dict(headers),
                data=body,
                allow_redirects=False,
                timeout=timeout,
            ) as response:
                if 300 <= response.status < 400:
                    raise UpstreamError(
                        502, f"upstream answered with a redirect ({response.status})"
                    )
                yield response
        except TimeoutError as exc:
            raise UpstreamError(504, "the upstream API server did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(
                503, f"the upstream API server is unreachable: {exc.strerror or exc}"
            ) from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise UpstreamError(503, "the upstream API server closed the connection") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"upstream request failed: {type(exc).__name__}") from exc


async def read_json_object(
    content: aiohttp.StreamReader, what: str, *, limit: int, too_large: str = ""
) -> KubeObject:
    """An upstream JSON object read incrementally, never past ``limit`` bytes; else 502.

    ``too_large`` is appended to the message when the limit is hit (what the client can do).
    """
    data = bytearray()
    async for chunk in content.iter_any():
        data += chunk
        if len(data) > limit:
            raise UpstreamError(502, f"the upstream {what} exceeds {limit} bytes{too_large}")
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise UpstreamError(502, f"upstream sent invalid JSON for {what}") from exc
    if not isinstance(obj, dict):
        raise UpstreamError(502, f"upstream sent a non-object for {what}")
    return obj


def _status_message(obj: KubeObject) -> str:
    return str(obj.get("message", ""))[:300]
