"""A small HTTP/1.1 load generator: keep-alive connections over mTLS or a Unix socket.

wrk cannot present a client certificate and ab speaks HTTP/1.0 (no chunked answers, so no
keep-alive through a streaming proxy), so the benchmark brings its own: ``processes`` worker
processes, each driving its share of the connections with a selector, one request in flight per
connection, every request timed. ``{n}`` in a path or body becomes a per-request counter
(unique names for creates); with ``counter_width``, always that many digits, zero-padded (a
binary body whose length prefixes must not move: protobuf). Bounded by ``duration`` and
``max_requests``.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import ssl
import time
from array import array
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

__all__ = ["LoadResult", "Target", "Workload", "generator_pool", "run_load"]

_RECV = 256 * 1024


@dataclass(frozen=True, slots=True)
class Target:
    """Where to send: ``host:port`` (TLS when ``ca`` is set) or a Unix socket ``path``."""

    name: str
    host: str = "127.0.0.1"
    port: int = 0
    path: str = ""
    ca: str = ""
    cert: str = ""
    key: str = ""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    method: str
    path: str
    body: bytes = b""
    content_type: str = "application/json"
    accept: str = "application/json"
    counter_width: int = 0
    """Digits ``{n}`` always becomes (zero-padded); 0: as many as the number has."""


@dataclass(slots=True)
class LoadResult:
    requests: int = 0
    errors: int = 0
    elapsed: float = 0.0
    latencies: array = field(default_factory=lambda: array("d"))
    statuses: Counter = field(default_factory=Counter)
    bytes_in: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        """Latency at quantile ``q`` in milliseconds (0 when nothing was measured)."""
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e3


def generator_pool(processes: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=processes, mp_context=get_context("spawn"))


def run_load(
    pool: ProcessPoolExecutor,
    target: Target,
    workload: Workload,
    *,
    concurrency: int,
    duration: float,
    max_requests: int = 1_000_000,
    processes: int | None = None,
    settle: float = 0.3,
) -> LoadResult:
    """Drive ``concurrency`` connections for ``duration`` seconds; merged results."""
    processes = max(1, min(concurrency, processes or (os.cpu_count() or 1)))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    start_at = time.monotonic() + settle + settle * concurrency / 16
    futures = [
        pool.submit(
            _worker, target, workload, share, start_at, duration, max_requests // processes, i
        )
        for i, share in enumerate(shares)
    ]
    merged = LoadResult()
    for future in futures:
        part = future.result(timeout=duration + 60)
        merged.requests += part.requests
        merged.errors += part.errors
        merged.elapsed = max(merged.elapsed, part.elapsed)
        merged.latencies.extend(part.latencies)
        merged.statuses.update(part.statuses)
        merged.bytes_in += part.bytes_in
    return merged


def _connect(target: Target) -> socket.socket:
    if target.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(target.path)
        return sock
    raw = socket.create_connection((target.host, target.port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not target.ca:
        return raw
    context = ssl.create_default_context(cafile=target.ca)
    if target.cert:
        context.load_cert_chain(target.cert, target.key)
    return context.wrap_socket(raw, server_hostname="localhost")


class _Conn:
    """One keep-alive connection and a streaming parser of its current response.

    Only the status line, headers and chunk-size lines are kept; body bytes are counted and
    dropped, so a megabyte list costs the generator no copies.
    """

    __slots__ = ("chunk_left", "done", "head", "left", "sent_at", "sock", "status", "total")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.head = bytearray()
        self.sent_at = 0.0
        self.reset()

    def reset(self) -> None:
        self.head.clear()
        self.left = -2  # -2 headers not read yet, -1 chunked, else body bytes still to come
        self.chunk_left = 0
        self.status = 0
        self.total = 0
        self.done = False

    def feed(self, data: memoryview) -> bool:
        """Consume ``data``; True once one whole response has arrived."""
        self.total += len(data)
        if self.left == -2:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = bytes(self.head[:end]).lower()
            rest = memoryview(bytes(self.head[end + 4 :]))
            self.head.clear()
            self.status = int(head[9:12])
            if b"transfer-encoding: chunked" in head:
                self.left = -1
            else:
                at = head.find(b"content-length:")
                # The last header line has no CRLF left in ``head`` (the kube-apiserver sends
                # Content-Length last): read to the end of the block then.
                line_end = head.find(b"\r\n", at)
                line_end = len(head) if line_end < 0 else line_end
                self.left = int(head[at + 15 : line_end]) if at >= 0 else 0
            data = rest
        if self.left >= 0:
            self.left -= len(data)
            self.done = self.left <= 0
            return self.done
        while data:  # chunked: skip chunk bodies, parse the size lines
            if self.chunk_left:
                take = min(self.chunk_left, len(data))
                self.chunk_left -= take
                data = data[take:]
                continue
            self.head += data
            eol = self.head.find(b"\r\n")
            if eol < 0:
                return False
            size = int(bytes(self.head[:eol]).split(b";")[0], 16)
            if size == 0:
                self.done = self.head.find(b"\r\n", eol + 2) >= 0
                return self.done
            data = memoryview(bytes(self.head[eol + 2 :]))
            self.head.clear()
            self.chunk_left = size + 2
        return False


def _request_bytes(target: Target, workload: Workload, n: int) -> bytes:
    counter = str(n).zfill(workload.counter_width)
    if workload.counter_width and len(counter) != workload.counter_width:
        raise ValueError(f"request number {n} has more than {workload.counter_width} digits")
    path = workload.path.replace("{n}", counter)
    body = workload.body.replace(b"{n}", counter.encode()) if workload.body else b""
    lines = [f"{workload.method} {path} HTTP/1.1", "Host: localhost", "User-Agent: gk-bench/1"]
    lines.append(f"Accept: {workload.accept}")
    lines.extend(f"{k}: {v}" for k, v in target.headers)
    if body or workload.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Type: {workload.content_type}")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _send(conn: _Conn, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = conn.sock.send(view)
            view = view[sent:]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            select.select([], [conn.sock], [], 1.0)


def _worker(
    target: Target,
    workload: Workload,
    connections: int,
    start_at: float,
    duration: float,
    max_requests: int,
    index: int,
) -> LoadResult:
    result = LoadResult()
    conns = [_Conn(_connect(target)) for _ in range(connections)]
    selector = selectors.DefaultSelector()
    for conn in conns:
        conn.sock.setblocking(False)
        selector.register(conn.sock, selectors.EVENT_READ, conn)
    counter = index * 100_000_000
    buffer = bytearray(_RECV)
    view = memoryview(buffer)
    fixed = "{n}" not in workload.path and b"{n}" not in workload.body
    request = _request_bytes(target, workload, 0)
    now = time.monotonic()
    if start_at > now:
        time.sleep(start_at - now)
    perf = time.perf_counter
    began = perf()
    stop_at = began + duration
    latencies = result.latencies
    statuses = result.statuses
    for conn in conns:
        counter += 1
        conn.sent_at = perf()
        _send(conn, request if fixed else _request_bytes(target, workload, counter))
    in_flight = len(conns)
    while in_flight:
        for key, _ in selector.select(timeout=1.0):
            conn = key.data
            complete = False
            while not complete:
                try:
                    got = conn.sock.recv_into(buffer)
                except (BlockingIOError, ssl.SSLWantReadError):
                    break
                if not got:
                    raise ConnectionError(f"{target.name}: server closed the connection")
                complete = conn.feed(view[:got])
            if not complete:
                continue
            done = perf()
            latencies.append(done - conn.sent_at)
            statuses[conn.status] += 1
            result.bytes_in += conn.total
            if not 200 <= conn.status < 300:
                result.errors += 1
            conn.reset()
            result.requests += 1
            if done >= stop_at or result.requests >= max_requests:
                in_flight -= 1
                selector.unregister(conn.sock)
                continue
            counter += 1
            conn.sent_at = perf()
            _send(conn, request if fixed else _request_bytes(target, workload, counter))
        if perf() > stop_at + 30:
            raise TimeoutError(f"{target.name}: answers stopped coming")
    result.elapsed = perf() - began
    for conn in conns:
        conn.sock.close()
    return result
