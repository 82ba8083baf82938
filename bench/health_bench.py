"""What the health listener can cost the drivers: a driver's GET latency alone, while 60 clients
scrape ``/metrics`` back to back, and while 1,100 idle connections sit on the health port with
the gatekeeper's descriptors at 1,024 (docs/operating.md, "Limits").

Usage: python bench/health_bench.py [--seconds S] [--scrapers N] [--idle N]
                                    [--gatekeeper-src DIR] [--json]

The embedded API server runs in a process of its own, the gatekeeper (``python -m gatekeeper
serve``, from this checkout or ``--gatekeeper-src``, e.g. ``git archive main | tar -x -C DIR``)
in another with ``RLIMIT_NOFILE`` 1,024 (soft and hard), the scrapers in a third, so that this
process only measures:

1. alone: driver NIC GETs its own slice (one at a time) for S seconds: p50/p99;
2. scraped: the same while N clients scrape ``/metrics`` back to back (each on its own
   keep-alive connection): the driver's p50/p99, scrapes answered per second, the gatekeeper's
   CPU share;
3. idle: N idle TCP connections opened to the health port and held, then the driver's GETs
   for S seconds: how many answered (and p50/p99), how many of the idle connections the
   gatekeeper still holds, its open descriptors, and whether ``/healthz`` still answers.

Everything on loopback and Unix sockets; every loop is bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from gatekeeper.testing.harness import free_port, token_kubeconfig, wait_ready

NODE, GPU, NIC, TOKEN = "node-a", "gpu.example.com", "nic.example.com", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DESCRIPTORS = 1024
_TICKS = os.sysconf("SC_CLK_TCK")


def _upstream_process(out: Any) -> None:
    """The embedded API server with a few slices per driver, until terminated."""
    from gatekeeper.apiserver import APIServer, resource_slice
    from gatekeeper.cli.served import served_kinds
    from gatekeeper.policy import load_policy

    async def serve() -> None:
        apiserver = APIServer(served_kinds(load_policy(None)), token=TOKEN)
        for driver in (GPU, NIC):
            for n in range(5):
                name = f"{NODE}-{driver.split('.')[0]}-{n}"
                apiserver.add(resource_slice(name, driver=driver, node=NODE, pool=NODE))
        out.put(await apiserver.start())
        await asyncio.Event().wait()

    asyncio.run(serve())


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))


def start_gatekeeper(url: str, work: Path, src: str | None) -> tuple[subprocess.Popen[bytes], int]:
    kubeconfig = token_kubeconfig(work / "kubeconfig", url, TOKEN)
    health = free_port()
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    process = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "serve", "--node-name", NODE,
         "--driver", GPU, "--driver", NIC, "--socket-dir", str(work / "sockets"),
         "--kubeconfig", kubeconfig, "--health-listen", f"127.0.0.1:{health}"],
        stderr=subprocess.DEVNULL, env=env, cwd=src or None, preexec_fn=_limit_descriptors,
    )  # fmt: skip
    return process, health


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _percentile(values: list[float], share: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * share))] * 1000, 2)


async def driver_gets(work: Path, seconds: float) -> dict[str, Any]:
    """NIC's GET of its own slice, one at a time, for ``seconds``; a failed one (reset, 503,
    no answer in 5 s) is counted, not timed."""
    connector = aiohttp.UnixConnector(path=str(work / "sockets" / NIC / "api.sock"))
    timeout = aiohttp.ClientTimeout(total=5)
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(
        base_url="http://localhost", connector=connector, timeout=timeout
    ) as nic:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            try:
                async with nic.get(f"{SLICES}/{NODE}-nic-0") as response:
                    await response.read()
                    codes[str(response.status)] += 1
                    if response.status == 200:
                        latencies.append(time.perf_counter() - began)
            except (aiohttp.ClientError, TimeoutError) as exc:
                codes[type(exc).__name__] += 1
                await asyncio.sleep(0.05)  # a failing socket: do not spin
    result: dict[str, Any] = {"requests": sum(codes.values()), "codes": dict(codes)}
    if latencies:
        result.update(p50_ms=_percentile(latencies, 0.5), p99_ms=_percentile(latencies, 0.99))
    return result


async def scrape(health: int, clients: int, seconds: float, path: str) -> dict[str, Any]:
    """``clients`` scrapers of ``path``, each on its own keep-alive connection, back to back."""
    codes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    url = f"http://127.0.0.1:{health}{path}"

    async def scraper() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(url) as response:
                        await response.read()
                        codes[str(response.status)] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    codes[type(exc).__name__] += 1

    await asyncio.gather(*(scraper() for _ in range(clients)))
    return {"codes": dict(codes), "per_second": round(codes["200"] / seconds, 1)}


def _scrape_process(health: int, clients: int, seconds: float, path: str, out: Any) -> None:
    out.put(asyncio.run(scrape(health, clients, seconds, path)))


async def hold_idle(health: int, count: int) -> list[asyncio.Task[bytes]]:
    """``count`` idle connections to the health port; each task ends when the gatekeeper
    closes its connection (or it could not be made)."""

    async def idle() -> bytes:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", health)
        except OSError:
            return b"refused"
        try:
            return await reader.read()
        except OSError:
            return b""
        finally:
            writer.close()

    tasks = [asyncio.create_task(idle()) for _ in range(count)]
    await asyncio.sleep(1.0)  # the connects made (this process only opens them)
    return tasks


async def healthz(health: int) -> int | str:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(f"http://127.0.0.1:{health}/healthz") as response,
        ):
            return response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def main(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.idle + 512)), hard))
    context = multiprocessing.get_context("spawn")
    urls = context.Queue()
    upstream = context.Process(target=_upstream_process, args=(urls,), daemon=True)
    upstream.start()
    url = await asyncio.to_thread(urls.get, True, 120)
    work = Path(tempfile.mkdtemp(prefix="gk-health-bench-"))
    process, health = start_gatekeeper(url, work, args.gatekeeper_src)
    results: dict[str, Any] = {
        "seconds": args.seconds, "scrapers": args.scrapers, "idle": args.idle,
        "gatekeeper": args.gatekeeper_src or "this checkout", "load_before": os.getloadavg()[0],
    }  # fmt: skip
    try:
        await wait_ready(health, tries=400)
        results["alone"] = await driver_gets(work, args.seconds)
        out = context.Queue()
        scrapers = context.Process(
            target=_scrape_process, args=(health, args.scrapers, args.seconds + 3, args.path, out)
        )
        scrapers.start()
        await asyncio.sleep(2.0)  # the scrapers at full speed before measuring
        cpu = cpu_seconds(process.pid)
        results["scraped"] = await driver_gets(work, args.seconds)
        results["scraped"]["gatekeeper_cpu"] = round(
            (cpu_seconds(process.pid) - cpu) / args.seconds, 2
        )
        results["scrapes"] = await asyncio.to_thread(out.get, True, 120)
        scrapers.join(30)
        results["descriptors_before_idle"] = descriptors(process.pid)
        idle = await hold_idle(health, args.idle)
        try:
            results["idle_phase"] = await driver_gets(work, args.seconds)
            results["idle_phase"]["healthz"] = await healthz(health)
            results["idle_phase"]["descriptors"] = descriptors(process.pid)
            closed = sum(1 for task in idle if task.done())
            results["idle_phase"]["idle_closed_by_gatekeeper"] = closed
            results["idle_phase"]["idle_open_or_connecting"] = len(idle) - closed
        finally:
            for task in idle:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*idle, return_exceptions=True)
        results["load_after"] = os.getloadavg()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)
        upstream.terminate()
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--scrapers", type=int, default=60)
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--path", default="/metrics", help="what the scrapers ask for")
    parser.add_argument("--gatekeeper-src", help="run serve from this source tree")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    arguments = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(asyncio.run(main(arguments)), indent=None if arguments.json else 1))
