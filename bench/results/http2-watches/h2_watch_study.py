#!/usr/bin/env python3
"""Would an HTTP/2 upstream for watches bring a node's
gatekeeper to <= 2 apiserver connections with no worse event delay and CPU?

Everything runs on loopback against the real tier's kube-apiserver 1.36 + etcd (built by
/work/main/tests/realcluster/build.py, cached in ~/.cache/dra-gatekeeper/realcluster).

    h2_watch_study.py all [--reps N] [--quick]   # every experiment; writes results.json
    h2_watch_study.py report                      # results.json -> the tables of results.md
    h2_watch_study.py watcher ...                 # one measured watch client (a child process)
    h2_watch_study.py gk-h2 serve ...             # `dra-gatekeeper serve` with the HTTP/2 watch pool

Experiments
  settings   the apiserver's HTTP/2 SETTINGS as read off the wire (MAX_CONCURRENT_STREAMS, windows)
  bench      W concurrent watches (10, 100, 1000) of one labelled ConfigMap, K merge-patches by the
             admin, each stamped with CLOCK_MONOTONIC; per-event delay (write start -> line seen),
             per-write spread (last - first watcher), client CPU per 1000 events, RSS, connections,
             apiserver CPU; variants h1 (aiohttp, one connection per watch: the gatekeeper today),
             h2 (H2Pool below: a multiplexer on the `h2` library, one reader per connection) and
             h2x (httpx http2=True, one AsyncClient per 100 watches); interleaved, repeated
  h2-one     one httpx AsyncClient with 300 watches: what happens past the stream limit
  stall      one watch on a shared connection that is never read, one that is: 1 MB events
             (h2x, h2, h1)
  break      100 watches through a TCP relay that cuts one TCP connection: what ends (h2, h1)
  conns      N drivers x M informers (the Go dradriver, client-go): connections to the apiserver
             directly, through `gatekeeper serve` (HTTP/1.1 upstream) and through `gk-h2 serve`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MAIN = Path(os.environ.get("H2STUDY_MAIN", "/work/main"))
if str(MAIN) not in sys.path:
    sys.path.insert(0, str(MAIN))

NS = "h2study"
CM = "stamp"
STREAMS_PER_CLIENT = 100
"""httpcore caps a connection at min(server MAX_CONCURRENT_STREAMS, its own local 100)."""


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A fresh context per client: httpcore sets ALPN (h2) on the context it is given."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx


# --- an HTTP/2 watch multiplexer on the `h2` protocol library --------------------------------
#
# httpx/httpcore (and its fork httpx2/httpcore2) read a shared HTTP/2 connection from whichever
# stream task holds a read lock; a task that has nothing to read blocks on the socket while
# holding it, so frames already read for other streams wait for the next unrelated frame (see
# the h2x rows of results.md). This prototype has one reader per connection (an asyncio
# Protocol), per-stream queues, and per-stream flow control: the connection window is handed
# back on receipt, a stream's window only when its consumer takes the data, so a watch nobody
# reads stops at STREAM_WINDOW bytes and never stalls its neighbours.

STREAM_WINDOW = 1 << 20
"""Per-stream receive window: what one unread watch may buffer before the apiserver waits."""
CONNECTION_WINDOW = 16 << 20


class H2StreamError(ConnectionError):
    """The stream or its connection ended abnormally (reset, GOAWAY, connection lost)."""


class _H2Stream:
    __slots__ = ("conn", "ended", "error", "headers", "id", "queue", "status", "unacked", "wake")

    def __init__(self, conn: _H2Connection, stream_id: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.status = 0
        self.headers: dict[str, str] = {}
        self.queue: list[bytes] = []
        self.unacked = 0
        self.ended = False
        self.error: BaseException | None = None
        self.wake = asyncio.Event()

    async def response(self) -> None:
        while not self.status:
            if self.error is not None:
                raise self.error
            self.wake.clear()
            await self.wake.wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self.queue:
                chunk = self.queue.pop(0)
                self.conn.consumed(self, len(chunk))
                yield chunk
                continue
            if self.error is not None:
                raise self.error
            if self.ended:
                return
            self.wake.clear()
            await self.wake.wait()


class _H2Connection(asyncio.Protocol):
    def __init__(self) -> None:
        import h2.config
        import h2.connection

        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _H2Stream] = {}
        self.max_streams = 1  # until the server's SETTINGS arrive
        self.settings = asyncio.Event()
        self.usable = True
        self.conn_unacked = 0
        self.lost: BaseException | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from h2.settings import SettingCodes, Settings

        self.transport = transport  # type: ignore[assignment]
        self.h2.local_settings = Settings(
            client=True,
            initial_values={
                SettingCodes.ENABLE_PUSH: 0,
                SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.flush()

    def data_received(self, data: bytes) -> None:
        import h2.events
        import h2.exceptions

        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.fail(H2StreamError(f"HTTP/2 protocol error: {exc}"))
            assert self.transport is not None
            self.transport.close()
            return
        for event in events:
            stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
            if isinstance(event, h2.events.DataReceived):
                self.conn_unacked += event.flow_controlled_length
                if stream is not None:
                    stream.queue.append(event.data)
                    stream.unacked += event.flow_controlled_length - len(event.data)  # padding
                    stream.wake.set()
            elif isinstance(event, h2.events.ResponseReceived):
                if stream is not None:
                    headers = dict(event.headers)  # type: ignore[arg-type]
                    stream.status = int(headers.pop(":status"))
                    stream.headers = headers
                    stream.wake.set()
            elif isinstance(event, h2.events.StreamEnded):
                if stream is not None:
                    stream.ended = True
                    stream.wake.set()
            elif isinstance(event, h2.events.StreamReset):
                if stream is not None:
                    stream.error = H2StreamError(f"stream reset by the server: {event.error_code!r}")
                    stream.wake.set()
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                from h2.settings import SettingCodes

                changed = event.changed_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)
                if changed is not None:
                    self.max_streams = changed.new_value
                self.settings.set()
            elif isinstance(event, h2.events.ConnectionTerminated):
                # GOAWAY: no new streams; the server ends the ones it will not finish.
                self.usable = False
                last = event.last_stream_id or 0
                for sid, s in self.streams.items():
                    if sid > last:
                        s.error = H2StreamError("GOAWAY: stream not processed")
                        s.wake.set()
        if self.conn_unacked >= CONNECTION_WINDOW // 4:
            self.h2.increment_flow_control_window(self.conn_unacked)
            self.conn_unacked = 0
        self.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.fail(H2StreamError(f"connection lost: {exc!r}"))

    def fail(self, error: BaseException) -> None:
        self.usable = False
        self.lost = error
        self.settings.set()
        for stream in self.streams.values():
            if not stream.ended:
                stream.error = error
                stream.wake.set()

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            data = self.h2.data_to_send()
            if data:
                self.transport.write(data)

    # streams
    def has_room(self) -> bool:
        return self.usable and len(self.streams) < self.max_streams

    def open(self, method: str, authority: str, target: str, headers: Mapping[str, str]) -> _H2Stream:
        if self.lost is not None:
            raise self.lost
        sid = self.h2.get_next_available_stream_id()
        sent = [(":method", method), (":scheme", "https"), (":authority", authority), (":path", target)]
        sent += [(k.lower(), v) for k, v in headers.items() if k.lower() not in _H2_HOP]
        stream = _H2Stream(self, sid)
        self.streams[sid] = stream
        self.h2.send_headers(sid, sent, end_stream=True)
        self.flush()
        return stream

    def consumed(self, stream: _H2Stream, size: int) -> None:
        stream.unacked += size
        if stream.unacked >= STREAM_WINDOW // 2 and not stream.ended and stream.id in self.streams:
            import h2.exceptions

            with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
                self.h2.increment_flow_control_window(stream.unacked, stream.id)
            stream.unacked = 0
            self.flush()

    def close_stream(self, stream: _H2Stream) -> None:
        import h2.errors
        import h2.exceptions

        self.streams.pop(stream.id, None)
        if not stream.ended and stream.error is None and self.lost is None:
            with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
                self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
            self.flush()


_H2_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te"})


class H2Pool:
    """Streams over as few HTTP/2 connections as the server's MAX_CONCURRENT_STREAMS allows:
    a new connection only when every open one is full (or going away)."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext, per_connection: int = 0) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 443
        self.authority = parts.netloc
        self.ssl = ssl_context
        self.ssl.set_alpn_protocols(["h2"])
        self.per_connection = per_connection
        self.connections: list[_H2Connection] = []
        self._lock = asyncio.Lock()

    async def _connection(self) -> _H2Connection:
        async with self._lock:
            self.connections = [c for c in self.connections if c.lost is None]
            for conn in self.connections:
                cap = min(conn.max_streams, self.per_connection or conn.max_streams)
                if conn.usable and len(conn.streams) < cap:
                    return conn
            loop = asyncio.get_running_loop()
            transport, conn = await loop.create_connection(
                _H2Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host
            )
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
                transport.close()
                raise H2StreamError("the server did not negotiate h2 (fall back to HTTP/1.1)")
            await asyncio.wait_for(conn.settings.wait(), 10)
            if conn.lost is not None:
                raise conn.lost
            self.connections.append(conn)
            return conn

    @asynccontextmanager
    async def stream(self, method: str, target: str, headers: Mapping[str, str]) -> AsyncIterator[_H2Stream]:
        conn = await self._connection()
        stream = conn.open(method, self.authority, target, headers)
        try:
            await stream.response()
            yield stream
        finally:
            conn.close_stream(stream)

    async def close(self) -> None:
        for conn in self.connections:
            if conn.transport is not None:
                with contextlib.suppress(Exception):
                    conn.h2.close_connection()
                    conn.flush()
                conn.transport.close()
        self.connections.clear()


# --- the measured watch client (child process) ----------------------------------------------


class Recorder:
    """Splits a watch body into lines and records each event's delay from its write stamp."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.delays: list[float] = []
        self.arrivals: dict[int, list[float]] = {}
        self.errors: list[str] = []
        self.done = asyncio.Event()
        self.cpu_mark = 0.0
        self.cpu_end = 0.0
        self.events = 0

    def line(self, line: bytes) -> None:
        t = now()
        event = json.loads(line)
        data = event["object"]["data"]
        self.delays.append(t - float(data["t"]))
        self.arrivals.setdefault(int(data["seq"]), []).append(t)
        self.events += 1
        if self.events >= self.expected and not self.done.is_set():
            self.cpu_end = time.process_time()
            self.done.set()

    async def consume(self, chunks: AsyncIterator[bytes]) -> None:
        buffer = b""
        async for chunk in chunks:
            buffer += chunk
            while (i := buffer.find(b"\n")) >= 0:
                line, buffer = buffer[:i], buffer[i + 1 :]
                if line.strip():
                    self.line(line)


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def stdin_lines() -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield line.decode().strip()


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def watcher_main(ns: argparse.Namespace) -> None:
    url = ns.url.rstrip("/")
    target = (
        f"/api/v1/namespaces/{NS}/configmaps?watch=1&labelSelector=h2study%3Dstamp"
        f"&resourceVersion={ns.rv}&allowWatchBookmarks=false&timeoutSeconds=3600"
    )
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    rec = Recorder(ns.watches * ns.writes)
    opened = 0
    all_open = asyncio.Event()
    closers: list[Callable[[], Any]] = []
    ended: list[tuple[float, str]] = []

    def mark_open() -> None:
        nonlocal opened
        opened += 1
        if opened == ns.watches:
            all_open.set()

    if ns.variant == "h1":
        import aiohttp

        connector = aiohttp.TCPConnector(
            ssl=client_context(ns.ca, ns.cert, ns.key), limit=ns.watches + 8
        )
        session = aiohttp.ClientSession(
            base_url=url, connector=connector, skip_auto_headers=("Accept-Encoding",)
        )
        closers.append(session.close)
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=None)

        async def one(i: int) -> None:
            try:
                async with session.get(target, headers=headers, timeout=timeout) as response:
                    assert response.status == 200, response.status
                    mark_open()
                    await rec.consume(response.content.iter_any())
                ended.append((now(), "eof"))
            except Exception as exc:  # noqa: BLE001 - recorded
                ended.append((now(), type(exc).__name__))
                rec.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    elif ns.variant == "h2":
        pool = H2Pool(url, client_context(ns.ca, ns.cert, ns.key))
        closers.append(pool.close)

        async def one(i: int) -> None:
            try:
                async with pool.stream("GET", target, headers) as stream:
                    assert stream.status == 200, stream.status
                    mark_open()
                    await rec.consume(stream.chunks())
                ended.append((now(), "eof"))
            except Exception as exc:  # noqa: BLE001 - recorded
                ended.append((now(), type(exc).__name__))
                rec.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    else:
        import httpx

        per = ns.watches if ns.variant == "h2-one" else ns.per_client
        clients: list[httpx.AsyncClient] = []
        for _ in range(math.ceil(ns.watches / per)):
            client = httpx.AsyncClient(
                http2=True,
                base_url=url,
                verify=client_context(ns.ca, ns.cert, ns.key),
                timeout=httpx.Timeout(10.0, read=None, pool=None),
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                proxy=ns.proxy or None,
            )
            clients.append(client)
            closers.append(client.aclose)

        async def one(i: int) -> None:
            client = clients[i // per]
            try:
                async with client.stream("GET", target, headers=headers) as response:
                    assert response.status_code == 200, response.status_code
                    assert response.http_version == "HTTP/2", response.http_version
                    mark_open()
                    await rec.consume(response.aiter_raw())
                ended.append((now(), "eof"))
            except Exception as exc:  # noqa: BLE001 - recorded
                ended.append((now(), type(exc).__name__))
                rec.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    tasks = [asyncio.create_task(one(i)) for i in range(ns.watches)]
    started = now()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_open.wait(), ns.open_timeout)
    emit({"ready": opened, "open_seconds": now() - started, "errors": rec.errors[:5]})

    async for command in stdin_lines():
        if command == "mark":
            rec.events = 0
            rec.delays.clear()
            rec.arrivals.clear()
            rec.expected = opened * ns.writes
            rec.cpu_mark = time.process_time()
            emit({"marked": True, "rss": rss(), "cpu": rec.cpu_mark})
        elif command.startswith("wait"):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), float(command.split()[1]))
            cpu_end = rec.cpu_end if rec.done.is_set() else time.process_time()
            spreads = [max(a) - min(a) for a in rec.arrivals.values() if a]
            emit(
                {
                    "events": rec.events,
                    "expected": rec.expected,
                    "complete": rec.done.is_set(),
                    "cpu_seconds": cpu_end - rec.cpu_mark,
                    "rss": rss(),
                    "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                    "delay_p50": pct(rec.delays, 50),
                    "delay_p99": pct(rec.delays, 99),
                    "delay_max": max(rec.delays) if rec.delays else None,
                    "spread_p50": pct(spreads, 50),
                    "spread_max": max(spreads) if spreads else None,
                    "errors": rec.errors[:5],
                }
            )
        elif command == "ended":
            emit({"ended": ended, "open": opened, "errors": rec.errors[:10]})
        elif command == "exit":
            break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for close in closers:
        with contextlib.suppress(Exception):
            await close()


# --- the HTTP/2 watch pool for `gatekeeper serve` (a prototype, monkeypatched in) -------------


class _H2Response:
    """What the pipeline reads of an upstream answer (gatekeeper.upstream.UpstreamResponse)."""

    def __init__(self, stream: _H2Stream, mapped: Callable[[BaseException], Exception]) -> None:
        from multidict import CIMultiDict, CIMultiDictProxy

        self._stream = stream
        self._iter = stream.chunks().__aiter__()
        self._pending = b""
        self._mapped = mapped
        self._headers = CIMultiDictProxy(CIMultiDict(stream.headers))

    @property
    def status(self) -> int:
        return self._stream.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    async def _next(self) -> bytes | None:
        try:
            return await self._iter.__anext__()
        except StopAsyncIteration:
            return None
        except H2StreamError as exc:
            raise self._mapped(exc) from exc

    async def read(self, limit: int) -> bytes:
        if not self._pending:
            self._pending = await self._next() or b""
        head, self._pending = self._pending[:limit], self._pending[limit:]
        return head

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._pending:
            pending, self._pending = self._pending, b""
            yield pending
        while (chunk := await self._next()) is not None:
            yield chunk


class H2WatchPool:
    """The gatekeeper's watch pool over HTTP/2 (:class:`H2Pool`), with its own SSL context
    (ALPN h2 must not leak into the aiohttp pools' context), the pool's slot semaphore kept."""

    def __init__(self, upstream: Any) -> None:
        from gatekeeper.kubeconfig import build_ssl_context

        self.upstream = upstream
        context = build_ssl_context(upstream.config)
        assert context is not None, "the prototype needs an https:// upstream"
        self.pool = H2Pool(upstream.config.server, context)

    @staticmethod
    def mapped(exc: BaseException) -> Exception:
        from gatekeeper.errors import UpstreamError

        if isinstance(exc, TimeoutError):
            return UpstreamError(504, "the upstream API server did not answer in time")
        if isinstance(exc, H2StreamError):
            return UpstreamError(503, f"the upstream API server closed the stream: {exc}")
        if isinstance(exc, OSError):
            return UpstreamError(503, f"the upstream API server is unreachable: {exc}")
        return UpstreamError(502, f"upstream request failed: {type(exc).__name__}")

    @asynccontextmanager
    async def open(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> AsyncIterator[_H2Response]:
        from gatekeeper.errors import UpstreamError

        if body:
            raise UpstreamError(502, "the HTTP/2 watch pool sends no request bodies")
        sent = dict(headers)
        if token := self.upstream._tokens.token():
            sent["Authorization"] = f"Bearer {token}"
        pool = self.upstream.pools["watches"]
        async with pool.slot(self.upstream.limits.upstream_wait):
            try:
                opened = self.pool.stream(method, target, sent)
                stream = await opened.__aenter__()
            except (H2StreamError, OSError, TimeoutError) as exc:
                raise self.mapped(exc) from exc
            try:
                if 300 <= stream.status < 400:
                    raise UpstreamError(502, "upstream answered with a redirect")
                yield _H2Response(stream, self.mapped)
            finally:
                await opened.__aexit__(None, None, None)

    async def close(self) -> None:
        await self.pool.close()


def install_h2_watch_pool() -> None:
    from gatekeeper import upstream as module

    session = module.UpstreamSession
    start, close, stream = session.start, session.close, session.stream

    async def h2_start(self: Any) -> None:
        await start(self)
        self._h2 = H2WatchPool(self)

    async def h2_close(self: Any) -> None:
        await self._h2.close()
        await close(self)

    def h2_stream(self: Any, method: str, target: str, headers: Any, body: Any, *, long_running: bool) -> Any:
        if long_running:
            return self._h2.open(method, target, headers, body)
        return stream(self, method, target, headers, body, long_running=long_running)

    session.start, session.close, session.stream = h2_start, h2_close, h2_stream  # type: ignore[method-assign]


# --- the orchestrator --------------------------------------------------------------------------


class Study:
    def __init__(self, reps: int, quick: bool) -> None:
        from tests.realcluster.build import build
        from tests.realcluster.cluster import RealCluster

        self.reps = reps
        self.quick = quick
        self.watches: list[int] = []
        self.with_httpx = True
        self.binaries = build()
        self.cluster = RealCluster.start(self.binaries)
        self.port = int(self.cluster.url.rsplit(":", 1)[1])
        self.ca = str(self.cluster.ca_file)
        self.cert = str(self.cluster.workdir / "admin.crt")
        self.key = str(self.cluster.workdir / "admin.key")
        import psutil

        self.apiserver = next(
            psutil.Process(p.pid)
            for p in self.cluster._processes
            if Path(str(p.args[0])).name == "kube-apiserver"
        )
        self.results: dict[str, Any] = {"machine": machine()}
        self.writer: http.client.HTTPSConnection | None = None
        self.seq = 0

    def stop(self) -> None:
        self.cluster.stop()

    # the admin's writes, on one kept-alive connection
    def write(self, pad: str = "x" * 1024) -> None:
        if self.writer is None:
            ctx = client_context(self.ca, self.cert, self.key)
            self.writer = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx)
        self.seq += 1
        body = json.dumps({"data": {"t": repr(now()), "seq": str(self.seq), "pad": pad}})
        self.writer.request(
            "PATCH",
            f"/api/v1/namespaces/{NS}/configmaps/{CM}",
            body=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        answer = self.writer.getresponse()
        payload = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"PATCH {answer.status}: {payload[:300]!r}")

    def prepare(self) -> str:
        from tests.realcluster.objects import ensure

        admin = self.cluster.admin
        ensure(admin, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        cm = ensure(
            admin,
            f"/api/v1/namespaces/{NS}/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CM, "labels": {"h2study": "stamp"}},
                "data": {"t": "0", "seq": "0"},
            },
        )
        return str(cm["metadata"]["resourceVersion"])

    def current_rv(self) -> str:
        return str(self.cluster.admin.get(f"/api/v1/namespaces/{NS}/configmaps/{CM}")["metadata"]["resourceVersion"])

    # --- settings -----------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        import h2.config
        import h2.connection
        import h2.events

        ctx = client_context(self.ca, self.cert, self.key)
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", self.port)) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            alpn = tls.selected_alpn_protocol()
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            tls.sendall(conn.data_to_send())
            found: dict[str, Any] = {"alpn": alpn}
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and "settings" not in found:
                for event in conn.receive_data(tls.recv(65536)):
                    if isinstance(event, h2.events.RemoteSettingsChanged):
                        found["settings"] = {
                            str(code.name if hasattr(code, "name") else code): value.new_value
                            for code, value in event.changed_settings.items()
                        }
                    if isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0:
                        found["connection_window_increment"] = event.delta
                tls.sendall(conn.data_to_send())
        return found

    # --- the watch bench ------------------------------------------------------------------------

    def spawn_watcher(self, variant: str, watches: int, writes: int, rv: str, proxy: str = "", url: str = "") -> subprocess.Popen[str]:
        args = [
            sys.executable, str(Path(__file__).resolve()), "watcher",
            "--variant", variant, "--watches", str(watches), "--writes", str(writes),
            "--url", url or self.cluster.url, "--rv", rv,
            "--ca", self.ca, "--cert", self.cert, "--key", self.key,
        ]  # fmt: skip
        if proxy:
            args += ["--proxy", proxy]
        return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    @staticmethod
    def ask(child: subprocess.Popen[str], command: str | None, timeout: float = 120) -> dict[str, Any]:
        assert child.stdin is not None and child.stdout is not None
        if command is not None:
            child.stdin.write(command + "\n")
            child.stdin.flush()
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"watcher did not answer {command!r} in {timeout} s")
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"watcher exited {child.poll()}")
        return dict(json.loads(line))

    def connections(self, pid: int) -> int:
        import psutil

        return sum(
            1
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED
        )

    def one_run(self, variant: str, watches: int, writes: int, interval: float) -> dict[str, Any]:
        import psutil

        rv = self.current_rv()
        child = self.spawn_watcher(variant, watches, writes, rv)
        try:
            ready = self.ask(child, None, timeout=180)
            if ready["ready"] != watches:
                raise RuntimeError(f"{variant} opened {ready['ready']}/{watches}: {ready}")
            time.sleep(1.5)  # let handshakes' CPU settle
            conns = self.connections(child.pid)
            marked = self.ask(child, "mark")
            api_cpu0 = sum(self.apiserver.cpu_times()[:2])
            load0 = os.getloadavg()[0]
            t0 = now()
            for _ in range(writes):
                self.write()
                time.sleep(interval)
            result = self.ask(child, f"wait {30 + watches * writes / 500}", timeout=300)
            wall = now() - t0
            api_cpu = sum(self.apiserver.cpu_times()[:2]) - api_cpu0
            self.ask(child, "exit") if False else None
            return {
                "variant": variant,
                "watches": watches,
                "writes": writes,
                "connections": conns,
                "open_seconds": ready["open_seconds"],
                "rss_idle_mb": marked["rss"] / 2**20,
                "rss_end_mb": result["rss"] / 2**20,
                "cpu_ms_per_1000_events": 1e6 * result["cpu_seconds"] / max(1, result["events"]),
                "apiserver_cpu_ms_per_1000_events": 1e6 * api_cpu / max(1, result["events"]),
                "delay_p50_ms": 1e3 * result["delay_p50"],
                "delay_p99_ms": 1e3 * result["delay_p99"],
                "spread_p50_ms": 1e3 * result["spread_p50"],
                "events": result["events"],
                "expected": result["expected"],
                "complete": result["complete"],
                "errors": result["errors"],
                "load1": load0,
                "wall_s": wall,
            }
        finally:
            with contextlib.suppress(Exception):
                child.stdin.write("exit\n")  # type: ignore[union-attr]
                child.stdin.flush()  # type: ignore[union-attr]
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            _ = psutil

    def bench(self) -> dict[str, Any]:
        plan = [(10, 100, 0.05), (100, 40, 0.1), (1000, 15, 0.5)]
        if self.quick:
            plan = [(10, 20, 0.05), (100, 10, 0.1), (1000, 5, 0.5)]
        if self.watches:
            plan = [p for p in plan if p[0] in self.watches]
        runs: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for rep in range(self.reps):
            for watches, writes, interval in plan:
                variants = ["h1", "h2"]
                if not self.with_httpx:
                    pass
                elif watches == 10:
                    variants.append("h2x")
                elif watches == 100 and rep == 0:
                    variants.append("h2x")  # to record that it does not open (once)
                if rep % 2:
                    variants.reverse()
                for variant in variants:
                    try:
                        run = self.one_run(variant, watches, writes, interval)
                    except RuntimeError as exc:
                        failures.append({"variant": variant, "watches": watches, "rep": rep, "error": str(exc)})
                        log(f"bench {variant} W={watches} rep={rep}: FAILED {exc}")
                        continue
                    run["rep"] = rep
                    runs.append(run)
                    log(f"bench {variant} W={watches} rep={rep}: conns={run['connections']} "
                        f"p50={run['delay_p50_ms']:.2f} p99={run['delay_p99_ms']:.2f} ms "
                        f"spread={run['spread_p50_ms']:.2f} cpu/1k={run['cpu_ms_per_1000_events']:.1f} ms "
                        f"rss={run['rss_end_mb']:.1f} MB api/1k={run['apiserver_cpu_ms_per_1000_events']:.1f} "
                        f"events={run['events']}/{run['expected']} load={run['load1']:.2f}")
        return {"runs": runs, "failures": failures, "summary": summarize(runs)}

    # --- past the stream limit ---------------------------------------------------------------

    def h2_one(self, watches: int = 300) -> dict[str, Any]:
        """One httpx client, `watches` watches: how many open; do the rest wait or error?"""
        rv = self.current_rv()
        child = self.spawn_watcher("h2-one", watches, 1, rv)
        try:
            child_args = ["--open-timeout"]
            _ = child_args
            ready = self.ask(child, None, timeout=120)
            conns = self.connections(child.pid)
            self.ask(child, "mark")
            self.write()
            result = self.ask(child, "wait 10", timeout=60)
            later = self.ask(child, "ended", timeout=30)
            return {
                "opened_after_one_write": later["open"],
                "connections_after": self.connections(child.pid),
                "watches_requested": watches,
                "opened_within_timeout": ready["ready"],
                "open_seconds": ready["open_seconds"],
                "connections": conns,
                "events_after_one_write": result["events"],
                "errors": ready["errors"] + result["errors"],
            }
        finally:
            with contextlib.suppress(Exception):
                child.kill()
            child.wait()

    # --- a stalled stream on a shared connection ---------------------------------------------------

    def stall(self, writes: int = 24, size: int = 1_000_000) -> dict[str, Any]:
        """Two watches on one httpx HTTP/2 connection (and, for comparison, two aiohttp
        connections): one is never read; does the other still see every event?"""
        out: dict[str, Any] = {"event_bytes": size, "writes": writes}
        for variant in ("h2x", "h2", "h1"):
            rv = self.current_rv()
            code = STALL_CHILD.format(variant=variant)
            child = subprocess.Popen(
                [sys.executable, "-c", code, self.cluster.url, rv, self.ca, self.cert, self.key, str(writes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=HERE,
            )  # fmt: skip
            try:
                self.ask(child, None, timeout=60)
                seen_at: list[int] = []
                for i in range(writes):
                    self.write(pad="y" * size)
                    time.sleep(0.3)
                    seen_at.append(int(self.ask(child, "count", timeout=30)["count"]))
                    log(f"stall {variant} write {i + 1}: reading watch saw {seen_at[-1]}")
                time.sleep(3)
                final = self.ask(child, "count", timeout=30)
                out[variant] = {
                    "reading_watch_saw_after_each_write": seen_at,
                    "reading_watch_saw": final["count"],
                    "client_rss_mb": final["rss"] / 2**20,
                }
            finally:
                with contextlib.suppress(Exception):
                    child.kill()
                child.wait()
            log(f"stall {variant}: {out[variant]}")
        return out

    # --- a broken connection -------------------------------------------------------------------------

    def broken(self, watches: int = 100) -> dict[str, Any]:
        """`watches` httpx watches over one HTTP/2 connection through a TCP relay; the relay
        cuts that one TCP connection. The same for aiohttp (one connection per watch): the
        relay cuts one of its connections."""
        out: dict[str, Any] = {}
        for variant in ("h2", "h1"):
            relay = subprocess.Popen(
                [sys.executable, "-c", RELAY_CHILD, str(self.port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            )  # fmt: skip
            try:
                relay_port = int(self.ask(relay, None, timeout=20)["port"])
                rv = self.current_rv()
                child = self.spawn_watcher(variant, watches, 1, rv, url=f"https://127.0.0.1:{relay_port}")
                try:
                    ready = self.ask(child, None, timeout=120)
                    cut = self.ask(relay, "cut-one", timeout=20)
                    time.sleep(2)
                    ended = self.ask(child, "ended", timeout=30)
                    times = [t for t, _ in ended["ended"]]
                    kinds = sorted({k for _, k in ended["ended"]})
                    out[variant] = {
                        "watches": ready["ready"],
                        "tcp_connections_through_relay": cut["connections"],
                        "watches_ended_by_one_cut": len(ended["ended"]),
                        "ended_within_ms": 1e3 * (max(times) - min(times)) if times else None,
                        "how": kinds,
                    }
                    log(f"break {variant}: {out[variant]}")
                finally:
                    with contextlib.suppress(Exception):
                        child.kill()
                    child.wait()
            finally:
                with contextlib.suppress(Exception):
                    relay.kill()
                relay.wait()
        return out

    # --- connections of N drivers x M informers ---------------------------------------------------------

    def conns(self, plan: list[tuple[int, int]]) -> dict[str, Any]:
        from tests.realcluster.objects import bootstrap, bound_token

        drivers = tuple(f"d{i}.example.com" for i in range(max(n for n, _ in plan)))
        policy = Path(tempfile.mkdtemp(prefix="h2study-policy-")) / "policy.yaml"
        policy.write_text((MAIN / "gatekeeper" / "policies" / "default.yaml").read_text())
        bootstrap(self.cluster, policy, drivers)
        token, _ = bound_token(self.cluster, "dra-gatekeeper", "dra-gatekeeper", "node-a")
        token_file = self.cluster.workdir / "gatekeeper.token"
        token_file.write_text(token)
        from tests.realcluster.cluster import _Pair

        admin_kubeconfig = self.cluster.kubeconfig(
            self.cluster.workdir / "admin.kubeconfig",
            cert=_Pair(Path(self.cert), Path(self.key)),
        )
        rows: list[dict[str, Any]] = []
        for n, m in plan:
            for mode in ("direct", "gatekeeper-h1", "gatekeeper-h2"):
                row = self.conns_one(mode, drivers[:n], m, policy, token_file, admin_kubeconfig)
                rows.append(row)
                log(f"conns {mode} {n}x{m}: {row}")
        return {"rows": rows}

    def slice_delays(self, started: list[Any], drivers: tuple[str, ...], informers: int, rounds: int = 5) -> dict[str, Any]:
        """The admin creates one ResourceSlice per driver; the time until every one of that
        driver's slice informers saw it (client-go, through whatever path the driver uses)."""
        slices = "/apis/resource.k8s.io/v1/resourceslices"

        def adds(proc: Any) -> int:
            return sum(1 for e in proc.events_of("informer") if e["kind"] == "slices" and e["type"] == "add")

        seen: list[float] = []
        missing = 0
        try:
            for r in range(rounds):
                for i, (proc, driver) in enumerate(zip(started, drivers, strict=True)):
                    base = adds(proc)
                    t0 = time.monotonic()
                    self.cluster.admin.create(slices, _slice(f"h2s-{r}-{i}", driver))
                    deadline = t0 + 10
                    while adds(proc) < base + informers and time.monotonic() < deadline:
                        time.sleep(0.0005)
                    if adds(proc) < base + informers:
                        missing += 1
                    else:
                        seen.append(1e3 * (time.monotonic() - t0))
        finally:
            self.cluster.admin.delete(slices)
            time.sleep(1)
        return {"p50": pct(seen, 50), "max": max(seen) if seen else None, "samples": len(seen), "missing": missing}

    def conns_one(self, mode: str, drivers: tuple[str, ...], m: int, policy: Path, token_file: Path, admin_kubeconfig: Path) -> dict[str, Any]:
        import psutil

        from tests.realcluster.processes import DriverProcess

        gk = None
        started = []
        kinds = [("slices" if i % 2 == 0 else "claims") for i in range(m)]
        work = Path(tempfile.mkdtemp(prefix="h2study-conns-"))
        try:
            if mode != "direct":
                gk = start_gatekeeper(self.cluster, policy, drivers, token_file, h2=(mode == "gatekeeper-h2"), watches=m)
            for driver in drivers:
                connect = f"kubeconfig={admin_kubeconfig}" if gk is None else f"kubeconfig={gk.driver_kubeconfig(driver, work)}"
                proc = DriverProcess(self.binaries["dradriver"], connect, driver=driver)
                started.append(proc)
            t0 = time.monotonic()
            for proc in started:
                assert proc("watch", kinds=kinds)["ok"]
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not all(len(p.events_of("synced")) >= m for p in started):
                time.sleep(0.25)
            synced = sum(len(p.events_of("synced")) for p in started)
            sync_s = time.monotonic() - t0
            time.sleep(3)
            gk_proc = psutil.Process(gk.process.pid) if gk is not None and gk.process is not None else None
            cpu0 = sum(gk_proc.cpu_times()[:2]) if gk_proc is not None else 0.0
            delays = self.slice_delays(started, drivers, kinds.count("slices"))
            if gk_proc is not None:
                forwarded = 2 * delays["samples"] * kinds.count("slices")  # adds, then the deletes
                delays["gatekeeper_cpu_ms_per_1000_events"] = 1e6 * (sum(gk_proc.cpu_times()[:2]) - cpu0) / max(1, forwarded)
            if gk is not None:
                assert gk.process is not None
                upstream = self.connections(gk.process.pid)
                gk_rss = psutil.Process(gk.process.pid).memory_info().rss / 2**20
                driver_side = sum(
                    1
                    for p in started
                    for c in psutil.Process(p.process.pid).net_connections(kind="tcp")
                    if c.raddr and c.raddr.port == gk.tls_port and c.status == psutil.CONN_ESTABLISHED
                )
            else:
                upstream = sum(self.connections(p.process.pid) for p in started)
                gk_rss = None
                driver_side = None
            per_driver = [self.connections(p.process.pid) for p in started] if gk is None else None
            return {
                "mode": mode,
                "drivers": len(drivers),
                "watches_per_driver": m,
                "informers_synced": synced,
                "sync_seconds": round(sync_s, 1),
                "apiserver_connections": upstream,
                "per_driver_process": per_driver,
                "driver_to_gatekeeper_connections": driver_side,
                "gatekeeper_rss_mb": gk_rss,
                "slice_event_delay_ms": delays,
            }
        finally:
            for proc in started:
                with contextlib.suppress(Exception):
                    proc.close()
            if gk is not None:
                gk.stop()


def _slice(name: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


def start_gatekeeper(cluster: Any, policy: Path, drivers: tuple[str, ...], token_file: Path, *, h2: bool, watches: int) -> Any:
    from tests.realcluster.cluster import poll
    from tests.realcluster.processes import GatekeeperProcess

    extra = (
        "--max-watches-per-driver", str(max(64, watches + 16)),
        "--max-connections-per-driver", str(max(128, watches + 32)),
        "--max-filtered-reads-per-driver", str(max(4, watches)),
    )  # fmt: skip
    gk = GatekeeperProcess(cluster, policy, drivers, token_file, extra_args=extra)
    if not h2:
        return gk.start()
    args = [
        sys.executable, str(Path(__file__).resolve()), "gk-h2", "serve",
        "--node-name", gk.node, "--policy", str(gk.policy), "--kubeconfig", str(gk.kubeconfig),
        "--socket-dir", str(gk.socket_dir), "--listen", f"127.0.0.1:{gk.tls_port}",
        "--tls-cert-file", gk.pki.path("server.crt"), "--tls-key-file", gk.pki.path("server.key"),
        "--client-ca-file", gk.pki.path("ca.crt"), "--audit-log", str(gk.audit_log),
        "--audit-level", "RequestResponse", "--health-listen", f"127.0.0.1:{gk.health_port}",
        *[arg for driver in drivers for arg in ("--driver", driver)], *extra,
    ]  # fmt: skip
    log_file = open(gk.workdir / "serve.log", "wb")  # noqa: SIM115
    gk.process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT)
    poll("gk-h2 serve /readyz", gk._ready, timeout=60)
    return gk


STALL_CHILD = r"""
import asyncio, json, os, sys, ssl
sys.path.insert(0, ".")
from h2_watch_study import client_context, stdin_lines, emit, NS
url, rv, ca, cert, key, writes = sys.argv[1:7]
variant = "{variant}"
target = (f"/api/v1/namespaces/{{NS}}/configmaps?watch=1&labelSelector=h2study%3Dstamp"
          f"&resourceVersion={{rv}}&allowWatchBookmarks=false")
headers = {{"Accept": "application/json", "Accept-Encoding": "identity"}}
count = 0
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
async def main():
    global count
    opened = asyncio.Event()
    n_open = 0
    async def reading(chunks):
        global count
        buf = b""
        async for chunk in chunks:
            buf += chunk
            while (i := buf.find(b"\n")) >= 0:
                buf = buf[i + 1:]
                count += 1
    if variant == "h2":
        from h2_watch_study import H2Pool
        pool = H2Pool(url, client_context(ca, cert, key))
        async def one(read):
            nonlocal n_open
            async with pool.stream("GET", target, headers) as st:
                n_open += 1
                if n_open == 2: opened.set()
                if read:
                    await reading(st.chunks())
                else:
                    await asyncio.Event().wait()   # never reads the body
    elif variant == "h2x":
        import httpx
        client = httpx.AsyncClient(http2=True, base_url=url, verify=client_context(ca, cert, key),
                                   timeout=httpx.Timeout(10, read=None), limits=httpx.Limits(max_connections=1))
        async def one(read):
            nonlocal n_open
            async with client.stream("GET", target, headers=headers) as r:
                assert r.http_version == "HTTP/2"
                n_open += 1
                if n_open == 2: opened.set()
                if read:
                    await reading(r.aiter_raw())
                else:
                    await asyncio.Event().wait()   # never reads the body
    else:
        import aiohttp
        session = aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(ssl=client_context(ca, cert, key)),
                                        skip_auto_headers=("Accept-Encoding",))
        async def one(read):
            nonlocal n_open
            async with session.get(target, headers=headers, timeout=aiohttp.ClientTimeout(sock_read=None)) as r:
                n_open += 1
                if n_open == 2: opened.set()
                if read:
                    await reading(r.content.iter_any())
                else:
                    await asyncio.Event().wait()
    tasks = [asyncio.create_task(one(False)), asyncio.create_task(one(True))]
    await asyncio.wait_for(opened.wait(), 30)
    emit({{"ready": 2}})
    async for command in stdin_lines():
        if command == "count":
            emit({{"count": count, "rss": rss()}})
asyncio.run(main())
"""

RELAY_CHILD = r"""
import asyncio, json, sys
upstream_port = int(sys.argv[1])
pairs = []
def emit(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except Exception:
        pass
    finally:
        writer.close()
async def handle(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    pairs.append((writer, up_writer))
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    emit({"port": server.sockets[0].getsockname()[1]})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"cut-one":
            n = len(pairs)
            client, up = pairs[0]
            for w in (client, up):
                w.transport.abort()
            emit({"connections": n})
asyncio.run(main())
"""


def machine() -> dict[str, Any]:
    import platform

    import httpx
    import h2
    import aiohttp

    return {
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "httpx": httpx.__version__,
        "h2": h2.__version__,
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ["connections", "delay_p50_ms", "delay_p99_ms", "spread_p50_ms", "cpu_ms_per_1000_events",
            "rss_idle_mb", "rss_end_mb", "apiserver_cpu_ms_per_1000_events", "open_seconds", "load1"]
    rows = []
    for watches in sorted({r["watches"] for r in runs}):
        row: dict[str, Any] = {"watches": watches}
        for variant in ("h1", "h2", "h2x"):
            mine = [r for r in runs if r["watches"] == watches and r["variant"] == variant]
            if not mine:
                continue
            row[variant] = {k: statistics.median(r[k] for r in mine) for k in keys}
            row[variant]["runs"] = len(mine)
            row[variant]["complete"] = all(r["complete"] for r in mine)
            if variant == "h1":
                continue
            # the ratio within each repetition (adjacent runs, same load), then the median
            ratios: dict[str, float] = {}
            for k in keys[:-2]:
                per_rep = []
                for rep in sorted({r["rep"] for r in mine}):
                    a = [r for r in runs if r["watches"] == watches and r["rep"] == rep and r["variant"] == "h1"]
                    b = [r for r in mine if r["rep"] == rep]
                    if a and b and a[0][k]:
                        per_rep.append(b[0][k] / a[0][k])
                ratios[k] = statistics.median(per_rep) if per_rep else float("nan")
            row[f"{variant}_over_h1"] = ratios
        rows.append(row)
    return rows


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(ns: argparse.Namespace) -> None:
    out_json = HERE / "results.json"
    results: dict[str, Any] = {}
    if out_json.exists() and ns.keep:
        results = json.loads(out_json.read_text())
    study = Study(ns.reps, ns.quick)
    try:
        results["machine"] = study.results["machine"]
        study.prepare()
        wanted = ns.only.split(",") if ns.only else ["settings", "h2-one", "stall", "break", "bench", "conns"]
        if "settings" in wanted:
            results["settings"] = study.settings()
            log(f"settings: {results['settings']}")
        if "h2-one" in wanted:
            results["h2_one"] = study.h2_one()
            log(f"h2-one: {results['h2_one']}")
        if "stall" in wanted:
            results["stall"] = study.stall()
        if "break" in wanted:
            results["break"] = study.broken()
        if "bench" in wanted:
            if ns.watches:
                study.watches = [int(w) for w in ns.watches.split(",")]
            study.with_httpx = not ns.no_httpx
            results[ns.bench_key] = study.bench()
        if "conns" in wanted:
            plan = [(3, 3), (3, 30), (10, 100)] if not ns.quick else [(3, 3)]
            results["conns"] = study.conns(plan)
        results["machine"]["load_at_end"] = os.getloadavg()
        out_json.write_text(json.dumps(results, indent=1, default=str))
        log(f"wrote {out_json}")
    finally:
        study.stop()


def render_tables(results: dict[str, Any]) -> str:
    """The markdown tables of results.json."""
    out: list[str] = []
    m = results.get("machine", {})
    out.append(f"Machine: {m.get('cpus')} CPUs shared; load average at start {fmt_load(m.get('load_at_start'))}, "
               f"at end {fmt_load(m.get('load_at_end'))}; Python {m.get('python')}, aiohttp {m.get('aiohttp')}, "
               f"httpx {m.get('httpx')}, h2 {m.get('h2')}.\n")
    if "settings" in results:
        st = results["settings"]
        out.append(f"**kube-apiserver 1.36 HTTP/2 SETTINGS on the wire** (ALPN `{st.get('alpn')}`): "
                   + ", ".join(f"{k}={v}" for k, v in st.get("settings", {}).items()) + "\n")
    if "conns" in results:
        out.append("### 1. Apiserver connections for N drivers x M informers (Go dradriver, client-go)\n")
        out.append("| N x M | direct (client-go) | per driver process | via gatekeeper today (HTTP/1.1) | via gatekeeper, HTTP/2 watch pool | driver->gatekeeper conns | gatekeeper RSS h1 / h2 (MB) | slice event p50 direct / h1 / h2 (ms) | gatekeeper CPU per 1000 events h1 / h2 (ms) |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        rows = results["conns"]["rows"]
        for n, mm in sorted({(r["drivers"], r["watches_per_driver"]) for r in rows}):
            by = {r["mode"]: r for r in rows if r["drivers"] == n and r["watches_per_driver"] == mm}
            d, a, b = by.get("direct", {}), by.get("gatekeeper-h1", {}), by.get("gatekeeper-h2", {})
            def delay(r: dict[str, Any]) -> str:
                x = r.get("slice_event_delay_ms") or {}
                return f"{x.get('p50', float('nan')):.1f}" + ("" if not x.get("missing") else f" ({x['missing']} missed)")
            def gcpu(r: dict[str, Any]) -> str:
                x = (r.get("slice_event_delay_ms") or {}).get("gatekeeper_cpu_ms_per_1000_events")
                return "-" if x is None else f"{x:.0f}"
            out.append(
                f"| {n}x{mm} | {d.get('apiserver_connections')} | {d.get('per_driver_process')} | "
                f"{a.get('apiserver_connections')} | {b.get('apiserver_connections')} | "
                f"{a.get('driver_to_gatekeeper_connections')} / {b.get('driver_to_gatekeeper_connections')} | "
                f"{a.get('gatekeeper_rss_mb', 0):.0f} / {b.get('gatekeeper_rss_mb', 0):.0f} | "
                f"{delay(d)} / {delay(a)} / {delay(b)} | {gcpu(a)} / {gcpu(b)} |"
            )
        out.append("")
    for key, title in (("bench", "2a. all watch counts, 5 repetitions"), ("bench_small", "2b. a second run: 10 and 100 watches, 8 repetitions")):
        if key not in results:
            continue
        bench = results[key]
        if "machine" in bench:
            out.append(f"Run {key}: load average at start {fmt_load(bench['machine'].get('load_at_start'))}, at end {fmt_load(bench['machine'].get('load_at_end'))}.\n")
        out.append(f"### {title}: standalone watch clients against the real apiserver (medians of repetitions; ratios are per repetition, then the median)\n")
        out.append("| watches | variant | runs | apiserver conns | delay p50 (ms) | delay p99 (ms) | spread p50 (ms) | client CPU per 1000 events (ms) | RSS idle / after (MB) | apiserver CPU per 1000 events (ms) | load1 |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in bench["summary"]:
            for variant in ("h1", "h2", "h2x"):
                if variant not in row:
                    continue
                v = row[variant]
                out.append(
                    f"| {row['watches']} | {LABELS[variant]} | {v['runs']} | {v['connections']:.0f} | {v['delay_p50_ms']:.2f} | "
                    f"{v['delay_p99_ms']:.2f} | {v['spread_p50_ms']:.2f} | {v['cpu_ms_per_1000_events']:.1f} | "
                    f"{v['rss_idle_mb']:.1f} / {v['rss_end_mb']:.1f} | {v['apiserver_cpu_ms_per_1000_events']:.1f} | {v['load1']:.2f} |"
                )
        out.append("")
        out.append("**Ratios HTTP/2 / HTTP/1.1, same repetition (median over repetitions)**\n")
        out.append("| watches | variant | connections | delay p50 | delay p99 | spread p50 | client CPU / 1000 events | RSS after | apiserver CPU / 1000 events |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for row in bench["summary"]:
            for variant in ("h2", "h2x"):
                r = row.get(f"{variant}_over_h1")
                if not r:
                    continue
                out.append(
                    f"| {row['watches']} | {LABELS[variant]} | {r['connections']:.3f} | {r['delay_p50_ms']:.2f} | {r['delay_p99_ms']:.2f} | "
                    f"{r['spread_p50_ms']:.2f} | {r['cpu_ms_per_1000_events']:.2f} | {r['rss_end_mb']:.2f} | {r['apiserver_cpu_ms_per_1000_events']:.2f} |"
                )
        out.append("")
        for f in bench.get("failures", []):
            out.append(f"- Failed run: {LABELS.get(f['variant'], f['variant'])}, {f['watches']} watches, rep {f['rep']}: {f['error']}")
        out.append("")
    if "h2_one" in results:
        h = results["h2_one"]
        out.append(f"**httpx, one AsyncClient, {h['watches_requested']} watches** (past the 100-stream limit): "
                   f"{h['opened_within_timeout']} answered within {h['open_seconds']:.0f} s, {h.get('opened_after_one_write')} after one write; "
                   f"apiserver connections: {h['connections']} (then {h.get('connections_after')}).\n")
    if "stall" in results:
        st = results["stall"]
        out.append(f"### 3. One unread watch on a shared connection ({st['writes']} writes of {st['event_bytes'] / 1e6:.0f} MB events)\n")
        out.append("| variant | events the *reading* watch saw | client RSS (MB) |")
        out.append("|---|---|---|")
        for variant in ("h1", "h2", "h2x"):
            if variant in st:
                out.append(f"| {LABELS[variant]} | {st[variant]['reading_watch_saw']} / {st['writes']} | {st[variant]['client_rss_mb']:.0f} |")
        out.append("")
    if "break" in results:
        br = results["break"]
        out.append("### 4. One TCP connection cut (TCP relay between client and apiserver)\n")
        out.append("| variant | watches | TCP connections | watches ended by one cut | spread of their ends (ms) | error |")
        out.append("|---|---|---|---|---|---|")
        for variant in ("h1", "h2"):
            if variant in br:
                b = br[variant]
                out.append(f"| {LABELS[variant]} | {b['watches']} | {b['tcp_connections_through_relay']} | {b['watches_ended_by_one_cut']} | "
                           f"{(b['ended_within_ms'] or 0):.1f} | {', '.join(b['how'])} |")
        out.append("")
    return "\n".join(out)


LABELS = {
    "h1": "HTTP/1.1 aiohttp (today)",
    "h2": "HTTP/2 on `h2`, one reader per connection (prototype)",
    "h2x": "HTTP/2 httpx 0.29 / httpcore 1.0.9",
}


def fmt_load(load: Any) -> str:
    return "?" if not load else "/".join(f"{x:.2f}" for x in load)


def write_report() -> None:
    results = json.loads((HERE / "results.json").read_text())
    md = HERE / "results.md"
    tables = render_tables(results)
    begin, end = "<!-- tables:begin -->", "<!-- tables:end -->"
    text = md.read_text() if md.exists() else f"# HTTP/2 watch upstream study\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    raw = "\n## Raw results (results.json)\n\n```json\n" + json.dumps(results, indent=1, default=str) + "\n```\n"
    if "## Raw results (results.json)" in tail:
        tail = tail.split("\n## Raw results (results.json)", 1)[0] + "\n"
    md.write_text(head + begin + "\n" + tables + "\n" + end + tail.rstrip("\n") + "\n" + raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("all")
    a.add_argument("--reps", type=int, default=3)
    a.add_argument("--quick", action="store_true")
    a.add_argument("--only", default="")
    a.add_argument("--keep", action="store_true", help="merge into an existing results.json")
    a.add_argument("--watches", default="", help="bench only these watch counts, e.g. 10,100")
    a.add_argument("--no-httpx", action="store_true", help="bench without the httpx variant")
    a.add_argument("--bench-key", default="bench", help="results.json key for this bench")
    w = sub.add_parser("watcher")
    w.add_argument("--variant", choices=("h1", "h2", "h2x", "h2-one"), required=True)
    w.add_argument("--watches", type=int, required=True)
    w.add_argument("--writes", type=int, required=True)
    w.add_argument("--per-client", type=int, default=STREAMS_PER_CLIENT)
    w.add_argument("--open-timeout", type=float, default=20.0)
    for name in ("url", "rv", "ca", "cert", "key"):
        w.add_argument(f"--{name}", required=True)
    w.add_argument("--proxy", default="")
    sub.add_parser("gk-h2", add_help=False)
    sub.add_parser("report", help="render results.json into results.md (between the table markers)")
    if len(sys.argv) > 1 and sys.argv[1] == "gk-h2":
        install_h2_watch_pool()
        from gatekeeper.cli import main as gatekeeper_main

        raise SystemExit(gatekeeper_main(sys.argv[2:]))
    ns = parser.parse_args()
    if ns.command == "report":
        write_report()
        return
    if ns.command == "watcher":
        try:
            import uvloop

            uvloop.run(watcher_main(ns))
        except ImportError:
            asyncio.run(watcher_main(ns))
    else:
        run_all(ns)


if __name__ == "__main__":
    main()
