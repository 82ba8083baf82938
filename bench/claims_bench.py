"""Filtered claim reads at scale: the gatekeeper's memory and another driver's latency while one
driver lists and watches a big cluster's claims (docs/operating.md, "Filtered reads").

Usage: python bench/claims_bench.py [--claims N] [--lists L] [--limit N] [--watches W]
                                    [--seconds S] [--upstream fixed|embedded]
                                    [--gatekeeper-src DIR] [--serve-flag=--max-… ...] [--json]

The cluster holds N ResourceClaims (default 2,501, ~9 MB as a list), one of them allocated to
driver GPU on this node. The upstream (answers rendered once, or with ``--upstream embedded``
the embedded API server) runs in a process of its own, the gatekeeper
(``python -m gatekeeper serve``, from this checkout or ``--gatekeeper-src``, e.g. an export of
another commit) in another, and the noisy driver in a third, so that this process only measures:

0. burst: GPU sends L claim lists at once, once: the upstream pages they cost;
1. alone: driver NIC GETs its own slice (one at a time) for S seconds, each GET followed by
   the same GET straight from the upstream: p50/p99 of both (the upstream's share);
2. noisy: the same while GPU keeps L claim lists (``limit`` per page, following continue as
   client-go's pager does) and W claim watches going at once, each watch continuing the
   list's resourceVersion (so the gatekeeper re-reads the list at that version first),
   honouring Retry-After on a 429 as client-go does;
3. the gatekeeper's RSS before, its peak (VmHWM) and the growth, against one list's size;
4. the upstream's claim list pages served meanwhile (the upstream counts them), per list GPU
   completed: what one driver's lists cost the upstream.

Everything on loopback and Unix sockets; every loop bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import free_port, token_kubeconfig, wait_ready

NODE, GPU, NIC, TOKEN = "node-a", "gpu.example.com", "nic.example.com", "bench-token"
SLICE = "/apis/resource.k8s.io/v1/resourceslices/node-a-nic"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def claim(index: int, driver: str, node: str) -> dict[str, Any]:
    """A claim of ~3.6 KB (2,501 make a 9.1 MB list), as a scheduler leaves it: eight
    requests, eight results."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    requests = [
        {"name": f"r{i}", "exactly": {"deviceClassName": "gpu.example.com", "count": 1}}
        for i in range(8)
    ]
    results = [
        {"request": f"r{i}", "driver": driver, "pool": node, "device": f"dev-{i}"} for i in range(8)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"claim-{index:05d}",
            "namespace": "default",
            "labels": {"app": "training", "team": f"team-{index % 40}"},
            "annotations": {"example.com/notes": "n" * 1900},
        },
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results},
                                  "nodeSelector": {"nodeSelectorTerms": [term]}}},
    }  # fmt: skip


def _is_page(path: str, query: Any) -> bool:
    """Whether a request is a page of the claim list (not a watch)."""
    return path == CLAIMS and query.get("watch") not in ("true", "1")


def _upstream_process(claims: int, out: Any, pages: Any) -> None:
    """The embedded API server with the cluster's claims, in a process of its own; ``pages``
    counts the claim list pages it served (from its journal)."""

    async def serve() -> None:
        apiserver = APIServer(served_kinds(load_policy(None)), token=TOKEN)
        url = await apiserver.start()
        for index in range(claims - 1):
            apiserver.add(claim(index, NIC, f"node-{index % 50 + 1:02d}"))
        apiserver.add(claim(claims - 1, GPU, NODE))
        apiserver.add(resource_slice("node-a-nic", driver=NIC, node=NODE, pool=NODE))
        apiserver.journal_limit = 10**9  # every page counted
        out.put(url)
        counted = 0
        while True:
            journal = apiserver.journal
            for entry in journal[counted:]:
                pages.value += _is_page(entry.path, parse_qs(entry.query_string))
            counted = len(journal)
            await asyncio.sleep(0.1)

    asyncio.run(serve())


def _fixed_process(claims: int, out: Any, served: Any) -> None:
    """An upstream that answers from bytes rendered once (pages by ``limit``/``continue``,
    watches held open): the gatekeeper's own work is what is measured, not the upstream's.
    ``served`` counts the claim list pages it answered."""
    from aiohttp import web

    from gatekeeper.server.runtime import loop_factory

    items = [claim(index, NIC, f"node-{index % 50 + 1:02d}") for index in range(claims - 1)]
    items.append(claim(claims - 1, GPU, NODE))
    slice_bytes = json.dumps(resource_slice("node-a-nic", driver=NIC, node=NODE, pool=NODE))
    pages: dict[tuple[int, int], bytes] = {}

    def page(limit: int, start: int) -> bytes:
        if (limit, start) not in pages:
            end = len(items) if limit <= 0 else min(len(items), start + limit)
            meta: dict[str, Any] = {"resourceVersion": "5"}
            if end < len(items):
                meta.update({"continue": str(end), "remainingItemCount": len(items) - end})
            document = {"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1",
                        "metadata": meta, "items": items[start:end]}  # fmt: skip
            pages[(limit, start)] = json.dumps(document).encode()
        return pages[(limit, start)]

    async def claims_handler(request: web.Request) -> web.StreamResponse:
        query = request.query
        if query.get("watch") in ("true", "1"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await asyncio.sleep(float(query.get("timeoutSeconds", "60")))
            return response
        body = page(int(query.get("limit", "0") or 0), int(query.get("continue", "0") or 0))
        served.value += 1
        return web.Response(body=body, content_type="application/json")

    async def fixed(request: web.Request) -> web.Response:
        if request.path == "/version":
            return web.json_response({"major": "1", "minor": "36", "gitVersion": "v1.36.0"})
        return web.Response(text=slice_bytes, content_type="application/json")

    app = web.Application()
    app.router.add_get(CLAIMS, claims_handler)
    app.router.add_get("/version", fixed)
    app.router.add_get(SLICE, fixed)
    factory = loop_factory()
    loop = factory() if factory is not None else asyncio.new_event_loop()
    port = free_port()
    out.put(f"http://127.0.0.1:{port}")
    web.run_app(app, host="127.0.0.1", port=port, loop=loop, print=None, access_log=None)


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def start_gatekeeper(url: str, work: Path, src: str | None, flags: list[str]) -> Any:
    kubeconfig = token_kubeconfig(work / "kubeconfig", url, TOKEN)
    health = free_port()
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    process = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "serve", "--node-name", NODE,
         "--driver", GPU, "--driver", NIC, "--socket-dir", str(work / "sockets"),
         "--kubeconfig", kubeconfig, "--health-listen", f"127.0.0.1:{health}", *flags],
        stderr=subprocess.DEVNULL, env=env, cwd=src or None,
    )  # fmt: skip
    return process, health


def session(work: Path, driver: str) -> aiohttp.ClientSession:
    connector = aiohttp.UnixConnector(path=str(work / "sockets" / driver / "api.sock"), limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    return aiohttp.ClientSession(base_url="http://localhost", connector=connector, timeout=timeout)


async def quiet(work: Path, seconds: float, upstream: str) -> dict[str, Any]:
    """NIC's GET of its own slice, one at a time, for ``seconds``, through the gatekeeper;
    each followed by the same GET straight from the upstream (the node's token), so that the
    two latencies, taken at the same moments, tell the upstream's share apart."""
    latencies: dict[str, list[float]] = {"through": [], "straight": []}
    codes: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    token = {"Authorization": f"Bearer {TOKEN}"}
    async with session(work, NIC) as nic, aiohttp.ClientSession(upstream, headers=token) as up:
        while time.monotonic() < deadline:
            for way, client in (("through", nic), ("straight", up)):
                began = time.perf_counter()
                async with client.get(SLICE) as response:
                    await response.read()
                    codes[response.status] += 1
                latencies[way].append(time.perf_counter() - began)
    result: dict[str, Any] = {"requests": len(latencies["through"]), "codes": dict(codes)}
    for way, values in latencies.items():
        values.sort()
        result[f"{way}_p50_ms"] = round(values[len(values) // 2] * 1000, 2)
        result[f"{way}_p99_ms"] = round(values[int(len(values) * 0.99)] * 1000, 2)
    return result


async def noisy(work: Path, seconds: float, lists: int, limit: int, watches: int) -> dict[str, Any]:
    """GPU: ``lists`` claim lists (pages of ``limit``) and ``watches`` primed claim watches at
    once, for ``seconds``."""
    codes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    seen: set[str] = set()
    async with session(work, GPU) as gpu:

        async def listing() -> str:
            """A list as client-go's pager makes it: pages of ``limit``, following continue."""
            params = {"limit": str(limit)}
            while True:
                async with gpu.get(CLAIMS, params=params) as response:
                    body = await response.read()
                    codes[f"list {response.status}"] += 1
                    if response.status != 200:
                        await asyncio.sleep(float(response.headers.get("Retry-After", 1)))
                        continue
                document = json.loads(body)
                seen.update(i["metadata"]["name"] for i in document["items"])
                if not document["metadata"].get("continue"):
                    codes["lists completed"] += 1
                    return str(document["metadata"]["resourceVersion"])
                params = {"limit": str(limit), "continue": document["metadata"]["continue"]}

        rv = await listing()

        async def lister() -> None:
            while time.monotonic() < deadline:
                await listing()

        async def watcher() -> None:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"}
            while time.monotonic() < deadline:
                async with gpu.get(CLAIMS, params=params) as response:
                    await response.read()
                    codes[f"watch {response.status}"] += 1
                    if response.status == 429:
                        await asyncio.sleep(float(response.headers.get("Retry-After", 1)))

        await asyncio.gather(
            *(lister() for _ in range(lists)), *(watcher() for _ in range(watches))
        )
    return {"codes": dict(codes), "names_seen": sorted(seen)}


async def burst(work: Path, lists: int, limit: int) -> dict[str, Any]:
    """GPU: ``lists`` claim lists sent at once, once (pages of ``limit``, following continue)."""
    async with session(work, GPU) as gpu:

        async def listing() -> int:
            params = {"limit": str(limit)}
            while True:
                async with gpu.get(CLAIMS, params=params) as response:
                    if response.status != 200:
                        return response.status
                    document = json.loads(await response.read())
                if not document["metadata"].get("continue"):
                    return 200
                params = {"limit": str(limit), "continue": document["metadata"]["continue"]}

        began = time.perf_counter()
        codes = Counter(await asyncio.gather(*(listing() for _ in range(lists))))
    return {"codes": dict(codes), "seconds": round(time.perf_counter() - began, 2)}


def _noisy_process(
    work: str, seconds: float, lists: int, limit: int, watches: int, out: Any
) -> None:
    out.put(asyncio.run(noisy(Path(work), seconds, lists, limit, watches)))


async def list_size(url: str) -> int:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(url, headers=headers) as admin, admin.get(CLAIMS) as listed:
        return len(await listed.read())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    urls = context.Queue()
    pages = context.Value("q", 0)
    serve = _fixed_process if args.upstream == "fixed" else _upstream_process
    upstream = context.Process(target=serve, args=(args.claims, urls, pages), daemon=True)
    upstream.start()
    url = await asyncio.to_thread(urls.get, True, 120)
    work = Path(tempfile.mkdtemp(prefix="gk-claims-bench-"))
    process, health = start_gatekeeper(url, work, args.gatekeeper_src, args.serve_flag)
    results: dict[str, Any] = {
        "claims": args.claims, "lists": args.lists, "limit": args.limit, "watches": args.watches,
        "seconds": args.seconds, "upstream": args.upstream, "flags": args.serve_flag,
        "load_before": os.getloadavg()[0],
    }  # fmt: skip
    try:
        await wait_ready(health, tries=400)
        results["list_bytes"] = await list_size(url)
        before = pages.value
        results["burst"] = await burst(work, args.lists, args.limit)
        await asyncio.sleep(0.3)  # the embedded upstream counts its journal every 0.1 s
        results["burst"]["upstream_pages"] = pages.value - before
        results["alone"] = await quiet(work, args.seconds, url)
        rss_start, _ = rss_kib(process.pid)
        results["rss_start_kib"] = rss_start
        out = context.Queue()
        pages_before = pages.value
        neighbour = context.Process(
            target=_noisy_process,
            args=(str(work), args.seconds + 4, args.lists, args.limit, args.watches, out),
        )
        neighbour.start()
        await asyncio.sleep(2.0)  # the neighbour at full load before measuring
        results["noisy"] = await quiet(work, args.seconds, url)
        results["neighbour"] = await asyncio.to_thread(out.get, True, 300)
        neighbour.join(30)
        await asyncio.sleep(0.3)  # the embedded upstream counts its journal every 0.1 s
        served = pages.value - pages_before
        completed = results["neighbour"]["codes"].get("lists completed", 0)
        results["upstream_pages"] = served
        results["upstream_pages_per_list"] = round(served / max(completed, 1), 2)
        rss_end, peak = rss_kib(process.pid)
        results.update(rss_end_kib=rss_end, rss_peak_kib=peak)
        growth = (peak - rss_start) * 1024
        results["rss_growth_over_list"] = round(growth / results["list_bytes"], 2)
        results["p99_noisy_over_alone"] = round(
            results["noisy"]["through_p99_ms"] / results["alone"]["through_p99_ms"], 1
        )
        results["load_after"] = os.getloadavg()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)
        upstream.terminate()
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=2501)
    parser.add_argument("--lists", type=int, default=32)
    parser.add_argument("--limit", type=int, default=500, help="the lists' limit per page")
    parser.add_argument("--watches", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--upstream", choices=["fixed", "embedded"], default="fixed",
        help="answers rendered once (default: measures the gatekeeper alone), or the "
        "embedded API server (its own work, in one Python process, adds to the latencies)",
    )  # fmt: skip
    parser.add_argument("--gatekeeper-src", help="run serve from this source tree")
    parser.add_argument("--serve-flag", action="append", default=[], help="extra serve flag")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    arguments = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    outcome = asyncio.run(main(arguments))
    outcome["neighbour"]["names_seen"] = outcome["neighbour"]["names_seen"][:5]
    print(json.dumps(outcome, indent=None if arguments.json else 1))
