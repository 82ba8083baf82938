"""Throughput and latency through the gatekeeper vs straight to the same upstream, one run.

Usage: python bench/proxy_bench.py [--requests N] [--concurrency C]
Loopback only; every loop is bounded. Prints requests/s, p50/p99 latency and the ratios.
The embedded API server runs in the same process and event loop as the gatekeeper here, so
on a 2-core machine the ratio is a pessimistic bound (the upstream competes for the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp

from gatekeeper.config import ServeConfig
from gatekeeper.identity import Identity
from gatekeeper.kubeconfig import UpstreamConfig
from gatekeeper.policy import Engine, load_policy
from gatekeeper.policy.plan import Plan
from gatekeeper.requestinfo import parse_request
from gatekeeper.server import GatekeeperServer, socket_path
from gatekeeper.testing import APIServer, resource_slice, served_kinds

NODE, DRIVER, TOKEN = "node-a", "gpu.example.com", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{DRIVER}"


def slice_body(name: str) -> dict:
    """About 2 KB: 24 devices with an attribute each."""
    devices = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(24)]
    return resource_slice(name, driver=DRIVER, node=NODE, devices=devices)


async def measure(session: aiohttp.ClientSession, make, total: int, concurrency: int):
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for index in counter:
            method, path, body = make(index)
            start = time.perf_counter()
            async with session.request(method, path, json=body) as response:
                await response.read()
                assert response.status < 300, (response.status, await response.text())
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return total / elapsed, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def engine_micros(rounds: int = 20000) -> float:
    engine = Engine(load_policy(None).with_drivers(frozenset({DRIVER})), NODE)
    who = Identity(DRIVER, "unix")
    info = parse_request("POST", SLICES)
    body = slice_body("x")
    start = time.perf_counter()
    for _ in range(rounds):
        plan = engine.plan(who, info)  # a create reads nothing first
        assert isinstance(plan, Plan)
        engine.decide(plan, body)
    return (time.perf_counter() - start) / rounds * 1e6


async def main(total: int, concurrency: int) -> None:
    policy = load_policy(None).with_drivers(frozenset({DRIVER}))
    api = APIServer(served_kinds(policy), token=TOKEN)
    api.journal_limit = 0
    await api.start()
    for i in range(5):
        api.add(slice_body(f"{NODE}-seed-{i}"))
    sockets = Path(tempfile.mkdtemp(prefix="gk-bench-"))
    server = GatekeeperServer(
        ServeConfig(
            node_name=NODE,
            policy=policy,
            upstream=UpstreamConfig(server=api.url, token=TOKEN),
            socket_dir=sockets,
        )
    )
    await server.start()
    direct = aiohttp.ClientSession(api.url, headers={"Authorization": f"Bearer {TOKEN}"})
    proxied = aiohttp.ClientSession(
        "http://localhost", connector=aiohttp.UnixConnector(path=str(socket_path(sockets, DRIVER)))
    )
    scenarios = {
        "small GET (one slice)": lambda i: ("GET", f"{SLICES}/{NODE}-seed-{i % 5}", None),
        "list, pinned selector": lambda i: ("GET", f"{SLICES}?{PINNED}", None),
        "2 KB create": lambda i: ("POST", SLICES, slice_body(f"{NODE}-w-{i}")),
    }
    try:
        print(f"{total} requests per scenario, concurrency {concurrency}")
        for name, make in scenarios.items():
            results = {}
            for label, session in (("direct", direct), ("gatekeeper", proxied)):
                if name.startswith("2 KB"):
                    for obj in api.objects("resource.k8s.io", "resourceslices"):
                        if "-w-" in obj["metadata"]["name"]:
                            api.store.delete(
                                ("resource.k8s.io", "resourceslices"), ("", obj["metadata"]["name"])
                            )
                results[label] = await measure(session, make, total, concurrency)
            (d_rps, d50, d99), (g_rps, g50, g99) = results["direct"], results["gatekeeper"]
            print(
                f"{name:24s} direct {d_rps:7.0f} req/s "
                f"p50 {d50 * 1e3:5.2f} ms p99 {d99 * 1e3:5.2f} ms | "
                f"gatekeeper {g_rps:7.0f} req/s p50 {g50 * 1e3:5.2f} ms p99 {g99 * 1e3:5.2f} ms | "
                f"throughput ratio {g_rps / d_rps:.2f}, added p50 {(g50 - d50) * 1e3:.2f} ms"
            )
        print(f"engine alone: {engine_micros():.1f} µs per create decision")
    finally:
        await direct.close()
        await proxied.close()
        await server.stop()
        await api.close()
        shutil.rmtree(sockets, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.concurrency))
