"""What unauthenticated callers of the token listener cost, on a real kube-apiserver 1.36: a flood
of distinct garbage bearer tokens (each client one keep-alive connection, ignoring Retry-After)
beside a driver on its Unix socket and a driver on the token listener; and how long a deleted
pod's token keeps working, straight to the apiserver and through the gatekeeper.

    python bench/token_flood_bench.py [--seconds 12] [--clients 48] [--new-connections]
                                      [--gatekeeper-src DIR] [--serve-flag=--max-… ...]
                                      [--no-token-life] [--json FILE]

Needs Go (it starts the real tier of the test suite, tests/realcluster). ``--gatekeeper-src``
runs ``serve`` from another tree (``git archive main | tar -x -C DIR``: a before/after).

1. quiet, then flood, each ``--seconds``: the Unix-socket driver's GET+PUT of its slice (one
   after the other; the median and p99 of the pair) and the token driver's pinned list (its
   token's answer cached: no review, never limited); TokenReviews upstream counted in the
   apiserver's own audit log; the flood's answers by status. ``--new-connections``: each flood
   request on a new TLS connection (what is left once a connection's answers are paced).
2. token life: a pod-bound token used once straight away (the apiserver caches that success),
   the pod deleted, then the token polled every 0.1 s straight to the apiserver (401 once it no
   longer accepts it) and through the gatekeeper from 9 s after the deletion on (its first
   review late, as in issue 29: the worst case for a cache counted from that review).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import ssl
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.realcluster.build import build
from tests.realcluster.cluster import Api, ApiError, RealCluster
from tests.realcluster.conftest import DRIVERS, SERVICE_ACCOUNTS
from tests.realcluster.objects import GATEKEEPER_NS, GATEKEEPER_SA, bootstrap, bound_token
from tests.realcluster.processes import GatekeeperProcess

__all__ = ["main"]

GPU = "gpu.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MINE = f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3Dnode-a"
SLICE = "flood-bench"


@contextlib.contextmanager
def serving_from(source: str | None) -> Iterator[None]:
    """Start processes from ``source`` (``python -m`` puts the working directory first)."""
    if source is None:
        yield
        return
    before, path = Path.cwd(), os.environ.get("PYTHONPATH")
    os.chdir(source)
    os.environ["PYTHONPATH"] = source
    try:
        yield
    finally:
        os.chdir(before)
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path


def _slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": GPU,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(4)],
        },
    }


def _tls(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


async def unix_driver(socket: Path, seconds: float) -> dict[str, Any]:
    """GET then PUT the driver's slice, one pair after another, for ``seconds``."""
    pairs: list[float] = []
    codes: Counter[int] = Counter()
    connector = aiohttp.UnixConnector(path=str(socket))
    async with aiohttp.ClientSession("http://localhost", connector=connector) as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            async with session.get(f"{SLICES}/{SLICE}") as got:
                codes[got.status] += 1
                body = await got.json()
            async with session.put(f"{SLICES}/{SLICE}", json=body) as put:
                codes[put.status] += 1
                await put.read()
            pairs.append(time.perf_counter() - began)
    return _summary(pairs, codes)


async def token_driver(url: str, ca: str, token: str, seconds: float) -> dict[str, Any]:
    """The token driver's pinned list on one keep-alive connection, for ``seconds``."""
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(ssl=_tls(ca), limit=1)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(url, connector=connector, headers=headers) as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            async with session.get(MINE) as answer:
                codes[answer.status] += 1
                await answer.read()
            latencies.append(time.perf_counter() - began)
    return _summary(latencies, codes)


def _summary(latencies: list[float], codes: Counter[int]) -> dict[str, Any]:
    latencies.sort()
    return {
        "count": len(latencies),
        "codes": {str(k): v for k, v in sorted(codes.items())},
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2) if latencies else None,
    }


async def _flood(url: str, ca: str, clients: int, fresh: bool, running: Any, out: Any) -> None:
    codes: Counter[int] = Counter()
    tag = os.getpid()

    async def client(index: int) -> None:
        connector = aiohttp.TCPConnector(ssl=_tls(ca), limit=1, force_close=fresh)
        async with aiohttp.ClientSession(url, connector=connector) as session:
            n = 0
            while running.is_set():
                n += 1
                headers = {"Authorization": f"Bearer garbage.{tag}-{index}-{n}.token"}
                try:
                    async with session.get(MINE, headers=headers) as answer:
                        await answer.read()
                        codes[answer.status] += 1
                except aiohttp.ClientError:
                    codes[0] += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    out.put(dict(codes))


def _flood_process(url: str, ca: str, clients: int, fresh: bool, running: Any, out: Any) -> None:
    """The flood in a process of its own, so it does not load the measuring loop."""
    asyncio.run(_flood(url, ca, clients, fresh, running, out))


def _reviews(cluster: RealCluster) -> int:
    return sum(
        1
        for event in cluster.audit_events()
        if (event.get("objectRef") or {}).get("resource") == "tokenreviews"
        and event.get("stage") == "ResponseComplete"
    )


def flood_phases(
    cluster: RealCluster, gatekeeper: GatekeeperProcess, seconds: float, clients: int, fresh: bool
) -> dict[str, Any]:
    cluster.admin.create(SLICES, _slice())
    token, _ = bound_token(cluster, "gpu-system", "gpu-driver", "node-a")
    socket = gatekeeper.socket_dir / GPU / "api.sock"
    url = f"https://127.0.0.1:{gatekeeper.token_port}"
    ca = gatekeeper.pki.path("ca.crt")

    async def measure() -> dict[str, Any]:
        unix, tokens = await asyncio.gather(
            unix_driver(socket, seconds), token_driver(url, ca, token, seconds)
        )
        return {"unix_get_put": unix, "token_driver_list": tokens}

    results: dict[str, Any] = {}
    before = _reviews(cluster)
    started = time.monotonic()
    results["quiet"] = asyncio.run(measure())
    results["quiet"]["reviews_per_s"] = round(
        (_reviews(cluster) - before) / (time.monotonic() - started), 1
    )
    context = multiprocessing.get_context("spawn")
    running, out = context.Event(), context.Queue()
    running.set()
    flood = context.Process(target=_flood_process, args=(url, ca, clients, fresh, running, out))
    flood.start()
    time.sleep(2.0)  # the flood at full rate before measuring
    before = _reviews(cluster)
    started = time.monotonic()
    results["flood"] = asyncio.run(measure())
    elapsed = time.monotonic() - started
    results["flood"]["reviews_per_s"] = round((_reviews(cluster) - before) / elapsed, 1)
    running.clear()
    results["flood"]["flood_codes"] = out.get(timeout=60)
    flood.join(30)
    results["flood"]["clients"] = clients
    results["flood"]["connection_per_request"] = fresh
    return results


def _works_directly(cluster: RealCluster, token: str) -> bool:
    api = Api(cluster.url, cluster.ca_file)
    api.token = token
    try:
        api.get(SLICES)
    except ApiError as error:
        return error.code != 401  # 403: authenticated, only not allowed
    return True


def _works_through(gatekeeper: GatekeeperProcess, token: str) -> bool:
    api = Api(f"https://127.0.0.1:{gatekeeper.token_port}", Path(gatekeeper.pki.path("ca.crt")))
    api.token = token
    try:
        api.get(MINE)
    except ApiError:
        return False
    return True


def token_life(cluster: RealCluster, gatekeeper: GatekeeperProcess) -> dict[str, Any]:
    """Seconds after the pod's deletion that its token last worked, directly and through."""
    token, pod = bound_token(cluster, "gpu-system", "gpu-driver", "node-a", pod="life-bench")
    assert _works_directly(cluster, token)  # the apiserver caches this success
    path = f"/api/v1/namespaces/gpu-system/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
    cluster.admin.delete(path)
    deleted = time.monotonic()
    last = {"direct": 0.0, "gatekeeper": None}
    direct_done = through_done = False
    while not (direct_done and through_done) and time.monotonic() - deleted < 60:
        now = time.monotonic() - deleted
        if not direct_done:
            if _works_directly(cluster, token):
                last["direct"] = round(time.monotonic() - deleted, 2)
            else:
                direct_done = True
        if now >= 9.0 and not through_done:
            if _works_through(gatekeeper, token):
                last["gatekeeper"] = round(time.monotonic() - deleted, 2)
            else:
                through_done = True
        time.sleep(0.1)
    return {"last_worked_s": last}


def run(args: argparse.Namespace) -> dict[str, Any]:
    binaries = build()
    cluster = RealCluster.start(binaries)
    gatekeeper = None
    results: dict[str, Any] = {
        "source": args.gatekeeper_src or "this checkout",
        "serve_flags": args.serve_flag,
        "loadavg_before": os.getloadavg(),
    }
    try:
        policy = cluster.workdir / "policy.yaml"
        default = Path(__import__("gatekeeper").__file__).parent / "policies" / "default.yaml"
        mapping = "".join(f"  {d}: [{a}]\n" for d, a in SERVICE_ACCOUNTS.items())
        policy.write_text(default.read_text() + "\nserviceAccounts:\n" + mapping)
        bootstrap(cluster, policy, DRIVERS)
        token, _ = bound_token(cluster, GATEKEEPER_NS, GATEKEEPER_SA, "node-a")
        token_file = cluster.workdir / "gatekeeper.token"
        token_file.write_text(token)
        gatekeeper = GatekeeperProcess(
            cluster, policy, DRIVERS, token_file, listen_token=True,
            extra_args=tuple(args.serve_flag),
        )  # fmt: skip
        with serving_from(args.gatekeeper_src):
            gatekeeper.start()
        results.update(
            flood_phases(cluster, gatekeeper, args.seconds, args.clients, args.new_connections)
        )
        if not args.no_token_life:
            results["token_life"] = token_life(cluster, gatekeeper)
    finally:
        if gatekeeper is not None:
            gatekeeper.stop()
        cluster.stop()
    results["loadavg_after"] = os.getloadavg()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--gatekeeper-src", help="run serve from this source tree")
    parser.add_argument("--serve-flag", action="append", default=[], help="an extra serve flag")
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="the flood opens a new TLS connection for each request (no keep-alive)",
    )
    parser.add_argument("--no-token-life", action="store_true")
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args(argv)
    results = run(ns)
    text = json.dumps(results, indent=1)
    print(text)
    if ns.json is not None:
        ns.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
