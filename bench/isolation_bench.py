"""No driver can hurt another: a quiet driver's latency with and without a noisy neighbour, and
the gatekeeper's memory under deep claims and a YAML alias bomb.

Usage: python bench/isolation_bench.py [--seconds S] [--workers W]

The gatekeeper runs as its own process (``python -m gatekeeper serve``, default limits: 32
requests and 64 watches per driver), so its RSS is its own; the embedded API server and the
load run in this process. Loopback and Unix sockets only; every loop is bounded by --seconds.

1. quiet: driver NIC runs a steady GET load (W workers, pinned slice lists) for S seconds.
2. noisy: the same, while driver GPU holds its whole watch budget (64 watches) and keeps 10x
   its in-flight budget (320 workers) of requests that stay upstream (a list at a future
   resourceVersion waits there) or are refused 429, retrying at once.
3. RSS while the deepest claim the apiserver accepts (opaque parameters nested as deep as
   their 10 KiB limit allows) is allocated to GPU and both drivers list and watch claims.
4. RSS after a 563-byte YAML alias bomb (refused, 400).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import SERVE, free_port, token_kubeconfig, wait_ready

NODE, GPU, NIC, TOKEN = "node-a", "gpu.example.com", "nic.example.com", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
DEEP = 5000  # "[" nesting: 10 KB, the most opaque parameters may hold
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
)


def pinned(driver: str, **extra: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={NODE},spec.driver={driver}", **extra}


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def start_gatekeeper(url: str, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    kubeconfig = token_kubeconfig(work / "kubeconfig", url, TOKEN)
    health = free_port()
    process = subprocess.Popen(
        [*SERVE, "--node-name", NODE,
         "--driver", GPU, "--driver", NIC, "--socket-dir", str(work / "sockets"),
         "--kubeconfig", kubeconfig, "--health-listen", f"127.0.0.1:{health}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return process, health


def session(work: Path, driver: str) -> aiohttp.ClientSession:
    connector = aiohttp.UnixConnector(path=str(work / "sockets" / driver / "api.sock"), limit=0)
    return aiohttp.ClientSession(base_url="http://localhost", connector=connector)


async def steady(nic: aiohttp.ClientSession, seconds: float, workers: int) -> dict[str, Any]:
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            async with nic.get(SLICES, params=pinned(NIC)) as response:
                await response.read()
                codes[response.status] += 1
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(worker() for _ in range(workers)))
    latencies.sort()
    return {
        "requests": len(latencies),
        "codes": dict(codes),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


async def noisy(work: Path, seconds: float, honor_retry: bool) -> dict[int, int]:
    """GPU: its whole watch budget held, and 10x its in-flight budget of requests for
    ``seconds``, each retried at once (a client ignoring Retry-After) or, with ``honor_retry``,
    after the Retry-After of a 429 (as client-go does)."""
    codes: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    future = pinned(GPU, resourceVersion="99999999", resourceVersionMatch="NotOlderThan")
    async with session(work, GPU) as gpu:
        watches = [await gpu.get(SLICES, params=pinned(GPU, watch="true")) for _ in range(64)]
        codes.update(w.status for w in watches)

        async def worker() -> None:
            while time.monotonic() < deadline:
                async with gpu.get(SLICES, params=future) as response:
                    await response.read()
                    codes[response.status] += 1
                    retry = float(response.headers.get("Retry-After", 0))
                if honor_retry and response.status == 429:
                    await asyncio.sleep(retry)

        await asyncio.gather(*(worker() for _ in range(320)))
        for watch in watches:
            watch.close()
    return dict(codes)


def _noisy_process(work: str, seconds: float, honor_retry: bool, out: Any) -> None:
    """The noisy neighbour in a process of its own, so it does not load this one's loop."""
    out.put(asyncio.run(noisy(Path(work), seconds, honor_retry)))


async def deep_claim(url: str) -> int:
    """Create the deep claim over HTTP (as any user may), then allocate it to GPU on this node
    (as the scheduler does, through the status subresource). The resourceVersion's status."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "deep", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "req"}], "config": [
            {"opaque": {"driver": GPU, "parameters": "HOLE"}}]}},
    }  # fmt: skip
    nested = "[" * DEEP + "]" * DEEP
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(base_url=url, headers=headers) as admin:
        body = json.dumps(claim).replace('"HOLE"', nested)
        async with admin.post(CLAIMS, data=body) as created:
            assert created.status == 201, await created.text()
            stored = json.loads((await created.text()).replace(nested, '"HOLE"'))
        stored["status"] = {"allocation": {
            "devices": {"results": [{"request": "req", "driver": GPU, "pool": NODE,
                                     "device": "d"}]},
            "nodeSelector": {"nodeSelectorTerms": [term]}}}  # fmt: skip
        body = json.dumps(stored).replace('"HOLE"', nested)
        async with admin.put(f"{CLAIMS}/deep/status", data=body) as allocated:
            assert allocated.status == 200, await allocated.text()
            return allocated.status


async def normal_claim(url: str) -> None:
    """An ordinary claim allocated to GPU on this node, beside the deep one."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "normal", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(base_url=url, headers=headers) as admin:
        async with admin.post(CLAIMS, json=claim) as created:
            stored = await created.json()
        stored["status"] = {"allocation": {
            "devices": {"results": [{"request": "req", "driver": GPU, "pool": NODE,
                                     "device": "d"}]},
            "nodeSelector": {"nodeSelectorTerms": [term]}}}  # fmt: skip
        async with admin.put(f"{CLAIMS}/normal/status", json=stored) as allocated:
            assert allocated.status == 200, await allocated.text()


async def claims_load(work: Path) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    async with session(work, GPU) as gpu, session(work, NIC) as nic:
        watches = []
        for name, driver in (("gpu", gpu), ("nic", nic)):
            for _ in range(10):
                async with driver.get(CLAIMS) as listed:
                    body = await listed.json()
            outcome[f"{name}_list"] = (
                listed.status,
                [i["metadata"]["name"] for i in body["items"]],
            )
            watches.append(await driver.get(CLAIMS, params={"watch": "true"}))
        await asyncio.sleep(1.0)
        for watch in watches:
            watch.close()
    return outcome


async def main(seconds: float, workers: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="gk-isolation-"))
    apiserver = APIServer(served_kinds(load_policy(None)), token=TOKEN)
    apiserver.rv_wait_seconds = 2.0
    url = await apiserver.start()
    await normal_claim(url)
    for index, driver in enumerate((GPU, NIC)):
        for n in range(5):
            apiserver.add(resource_slice(f"s-{index}-{n}", driver=driver, node=NODE, pool=NODE))
    process, health = start_gatekeeper(url, work)
    results: dict[str, Any] = {}
    try:
        await wait_ready(health, tries=400)
        results["rss_start_kib"] = rss_kib(process.pid)
        async with session(work, NIC) as nic:
            results["quiet"] = await steady(nic, seconds, workers)
            for mode, honor_retry in (("ignoring", False), ("honoring", True)):
                context = multiprocessing.get_context("spawn")
                out = context.Queue()
                args = (str(work), seconds + 3, honor_retry, out)
                neighbour = context.Process(target=_noisy_process, args=args)
                neighbour.start()
                await asyncio.sleep(2.0)  # the neighbour at full budget before measuring
                results[f"noisy_{mode}_retry_after"] = await steady(nic, seconds, workers)
                codes = await asyncio.to_thread(out.get, True, 60)
                results[f"neighbour_codes_{mode}_retry_after"] = codes
                neighbour.join(30)
        results["rss_after_noise_kib"] = rss_kib(process.pid)
        await deep_claim(url)
        results["deep_claims"] = await claims_load(work)
        results["rss_deep_claim_kib"] = rss_kib(process.pid)
        async with session(work, GPU) as gpu:
            patch = f"{SLICES}/s-0-0?fieldManager=bench"
            headers = {"Content-Type": "application/apply-patch+yaml"}
            async with gpu.patch(patch, data=BOMB.encode(), headers=headers) as refused:
                results["alias_bomb"] = (refused.status, len(BOMB))
        results["rss_after_alias_bomb_kib"] = rss_kib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)
        await apiserver.close()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(args.seconds, args.workers))
