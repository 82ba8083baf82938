"""Memory and watches of a ``dra-gatekeeper serve`` process (its own, fresh one).

RSS idle; while streaming a big pinned list (growth must be bounded, not proportional);
with N open watches (RSS, per watch, idle CPU over a window); the delay of watch events
through the gatekeeper with N watches (and straight to the upstream, for reference).
The upstream is :mod:`bench.upstream_app` (it holds watches and stamps events).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.fixtures import PINNED_QUERY, SLICES, TOKEN, free_port
from bench.stack import Stack, start_gatekeeper, start_python_upstream

__all__ = ["ResourceResult", "measure_resources"]

_MARK = b'"bench/sent": "'
_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


@dataclass
class ResourceResult:
    rss_idle_mb: float = 0.0
    big_list_mb: float = 0.0
    big_list_seconds: float = 0.0
    big_list_growth_mb: float = 0.0
    watches: int = 0
    watches_open: int = 0
    """Of ``watches``, how many reached the upstream within the wait (a cap shows here)."""
    rss_watches_mb: float = 0.0
    kb_per_watch: float = 0.0
    idle_seconds: float = 0.0
    idle_cpu_percent: float = 0.0
    delay_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    """target → (p50, p99) of watch event delay in ms."""


def _status(pid: int, key: str) -> float:
    """A ``/proc/PID/status`` memory line in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def _big_list(session: aiohttp.ClientSession, pid: int) -> tuple[int, float, float]:
    """(bytes, seconds, peak RSS growth MB) of one big list streamed through the gatekeeper."""
    before = _status(pid, "VmRSS")
    peak = before
    size = 0
    start = time.perf_counter()
    async with session.get(f"{SLICES}?{PINNED_QUERY}&labelSelector=bench%3Dbig") as response:
        if response.status != 200:
            raise RuntimeError(f"big list: HTTP {response.status}")
        async for chunk in response.content.iter_chunked(1 << 20):
            size += len(chunk)
            peak = max(peak, _status(pid, "VmRSS"))
    seconds = time.perf_counter() - start
    peak = max(peak, _status(pid, "VmHWM") if _status(pid, "VmHWM") > before else peak)
    return size, seconds, peak - before


class _Watches:
    """N watches held open by one client; each event's delay is recorded from its stamp."""

    def __init__(self, session: aiohttp.ClientSession, count: int) -> None:
        self.session, self.count = session, count
        self.delays: list[float] = []
        self.received = 0
        self.open_upstream = 0
        """How many watches got their response headers (all, unless something caps them)."""
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        url = f"{SLICES}?watch=true&{PINNED_QUERY}&timeoutSeconds=600"
        async with self.session.get(url) as response:
            if response.status != 200:
                raise RuntimeError(f"watch: HTTP {response.status}")
            self.open_upstream += 1
            async for line in response.content:
                at = line.find(_MARK)
                if at >= 0:
                    sent = int(line[at + len(_MARK) : line.index(b'"', at + len(_MARK))])
                    self.delays.append((time.monotonic_ns() - sent) / 1e6)
                    self.received += 1

    def open(self) -> None:
        self.tasks = [asyncio.create_task(self._one()) for _ in range(self.count)]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def failed(self) -> BaseException | None:
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None


async def _until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def _watch_delays(
    client: aiohttp.ClientSession, control: aiohttp.ClientSession, count: int, rounds: int
) -> _Watches:
    watches = _Watches(client, count)
    watches.open()

    deadline = time.monotonic() + 5 + count / 100
    while watches.open_upstream < count and time.monotonic() < deadline:
        if error := watches.failed():
            raise RuntimeError(f"a watch failed: {error!r}")
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.2)
    if not watches.open_upstream:
        raise RuntimeError("no watch reached the upstream")
    for index in range(rounds):
        async with control.post("/bench/emit") as response:
            await response.read()

        async def arrived(expected: int = (index + 1) * watches.open_upstream) -> bool:
            return watches.received >= expected

        await _until(
            arrived,
            30,
            f"watch events did not arrive: {watches.received} of "
            f"{(index + 1) * watches.open_upstream}",
        )
    return watches


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values) or [0.0]
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _measure(
    stack: Stack,
    upstream_url: str,
    pid: int,
    socket: str,
    watches: int,
    idle_seconds: float,
    rounds: int,
    result: ResourceResult,
) -> None:
    context = ssl.create_default_context(cafile=stack.pki.ca)
    control = aiohttp.ClientSession(
        upstream_url,
        connector=aiohttp.TCPConnector(ssl=context),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    through = aiohttp.ClientSession(
        "http://localhost",
        connector=aiohttp.UnixConnector(path=socket, limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    direct = aiohttp.ClientSession(
        upstream_url,
        connector=aiohttp.TCPConnector(ssl=context, limit=0),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    try:
        async with through.get(f"{SLICES}?{PINNED_QUERY}") as response:
            await response.read()
        await asyncio.sleep(0.5)
        result.rss_idle_mb = _status(pid, "VmRSS")
        size, result.big_list_seconds, result.big_list_growth_mb = await _big_list(through, pid)
        result.big_list_mb = size / 1e6
        for name, session in (("gatekeeper", through), ("direct", direct)):
            held = await _watch_delays(session, control, watches, rounds)
            result.delay_ms[name] = _percentiles(held.delays)
            if name == "gatekeeper":
                result.watches = watches
                result.watches_open = held.open_upstream
                result.rss_watches_mb = _status(pid, "VmRSS")
                result.kb_per_watch = (
                    (result.rss_watches_mb - result.rss_idle_mb) * 1024 / max(1, watches)
                )
                before = _cpu_seconds(pid)
                started = time.perf_counter()
                await asyncio.sleep(idle_seconds)
                result.idle_seconds = time.perf_counter() - started
                used = _cpu_seconds(pid) - before
                result.idle_cpu_percent = used / result.idle_seconds * 100
            await held.close()
    finally:
        for session in (control, through, direct):
            await session.close()


def measure_resources(
    stack: Stack, *, watches: int, idle_seconds: float, big_mb: int, rounds: int
) -> ResourceResult:
    """Start a python upstream and a fresh gatekeeper in ``stack``; measure; leave them to
    the stack to stop."""
    port = free_port()
    stack.add("watch-upstream", start_python_upstream(stack, port, 10, big_mb=big_mb))
    upstream_url = f"https://127.0.0.1:{port}"
    gk = start_gatekeeper(stack, "gatekeeper-resources", upstream_url, free_port())
    result = ResourceResult()
    asyncio.run(
        _measure(stack, upstream_url, gk.proc.pid, gk.socket, watches, idle_seconds, rounds, result)
    )
    return result
