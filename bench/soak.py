"""A soak: ``dra-gatekeeper serve`` under steady mixed load for an hour, with watches open.

    python bench/soak.py [--minutes 60] [--rate 300] [--watches 500] [--json FILE]

Three drivers, over their Unix sockets, send ``--rate`` requests a second in all: get, create then
delete, update, a pinned list, a claim status merge patch, and one request in twenty that the
policy refuses (another driver's slice: an intended refusal); ``--watches`` watches stay open
(slices, pinned, and claims; 15 see every change, the others wait on DevicePools nothing writes),
re-opened when the server ends one. The upstream is the embedded
API server in its own process (``demo --upstream-only``). Every minute: RSS of the serving
process, requests, p50/p99, errors. It passes when RSS at the end is within 5 % of RSS at minute
5, no error but the intended refusals, exactly one audit event per request, and p99 stable;
it exits 1 when it does not. Bounded: it stops by itself after ``--minutes``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["main"]

DRIVERS = ("gpu.example.com", "nic.example.com", "fpga.example.com")
NODE = "demo-node"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
_MIX = (
    ("get", 30),
    ("update", 20),
    ("create-delete", 15),
    ("list", 15),
    ("claim", 15),
    ("refused", 5),
)


def _slice(name: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"dev-{i}"} for i in range(8)],
        },
    }


def _claim(name: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": driver, "pool": NODE, "device": "dev-0"}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            }
        },
    }


@dataclass
class Minute:
    started: float
    latencies: list[float] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    unexpected: int = 0


@dataclass
class Soak:
    workdir: Path
    rate: float
    watches: int
    minutes: list[Minute] = field(default_factory=list)
    requests: int = 0
    """HTTP requests sent, watches aside (a create-delete is two)."""
    watch_opens: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        out = open(self.workdir / log, "wb")  # noqa: SIM115 - lives as long as the process
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process


async def _wait_for(path: Path, pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (found := re.search(pattern, path.read_text())):
            return found
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{path}: no {pattern!r} within {timeout} s")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _start(soak: Soak) -> tuple[subprocess.Popen[bytes], str, str]:
    """The embedded API server (upstream), then serve; returns serve, its upstream URL and token."""
    python = sys.executable
    soak.spawn(
        python,
        "-m",
        "gatekeeper",
        "demo",
        "--upstream-only",
        "--dir",
        str(soak.workdir / "up"),
        log="upstream.log",
    )
    await _wait_for(soak.workdir / "upstream.log", r"READY")
    kubeconfig = soak.workdir / "up" / "upstream.kubeconfig"
    config = json.loads(json.dumps(__import__("yaml").safe_load(kubeconfig.read_text())))
    url = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"]["token"]
    serve = soak.spawn(
        python, "-m", "gatekeeper", "serve",
        "--node-name", NODE, *[a for d in DRIVERS for a in ("--driver", d)],
        "--kubeconfig", str(kubeconfig), "--socket-dir", str(soak.workdir / "sockets"),
        "--audit-log", str(soak.workdir / "audit.log"),
        "--max-watches-per-driver", str(soak.watches), "--max-requests-per-driver", "256",
        # Each watch holds a connection: a driver's watches and its requests' keep-alive pool.
        "--max-connections-per-driver", str(soak.watches + 128),
        "--max-connections", str(len(DRIVERS) * (soak.watches + 128)),
        "--upstream-watch-connections", str(soak.watches + 64),
        log="serve.log",
    )  # fmt: skip
    await _wait_for(soak.workdir / "serve.log", r"listening driver=fpga")
    return serve, url, token


async def _seed(url: str, token: str, ca: str) -> None:
    import ssl

    context = ssl.create_default_context(cafile=ca)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), headers=headers
    ) as s:
        for driver in DRIVERS:
            for i in range(10):
                async with s.post(url + SLICES, json=_slice(f"{driver}-{i}", driver)) as r:
                    assert r.status in (201, 409), await r.text()
            claim = _claim(f"claim-{driver}", driver)
            async with s.post(url + CLAIMS, json=claim) as r:
                assert r.status in (201, 409), await r.text()
            async with s.get(url + f"{CLAIMS}/claim-{driver}") as r:
                stored = await r.json()
            stored["status"] = claim["status"]
            async with s.put(url + f"{CLAIMS}/claim-{driver}/status", json=stored) as r:
                assert r.status == 200, await r.text()


def _session(soak: Soak, driver: str) -> aiohttp.ClientSession:
    socket = soak.workdir / "sockets" / driver / "api.sock"
    connector = aiohttp.UnixConnector(path=str(socket), limit=0)
    return aiohttp.ClientSession(base_url="http://localhost", connector=connector)


async def _one(session: aiohttp.ClientSession, driver: str, kind: str, n: int) -> tuple[int, bool]:
    """One request of ``kind``; (code, expected)."""
    pinned = f"fieldSelector=spec.driver%3D{driver}%2Cspec.nodeName%3D{NODE}"
    name = f"{driver}-{n % 10}"
    if kind == "get":
        async with session.get(f"{SLICES}/{name}") as r:
            return r.status, r.status == 200
    if kind == "update":
        async with session.put(f"{SLICES}/{name}", json=_slice(name, driver)) as r:
            return r.status, r.status in (200, 409)  # 409: a concurrent update of the same one
    if kind == "list":
        async with session.get(f"{SLICES}?{pinned}") as r:
            await r.read()
            return r.status, r.status == 200
    if kind == "claim":
        patch = {
            "status": {
                "devices": [{"driver": driver, "pool": NODE, "device": "dev-0", "data": {"n": n}}]
            }
        }
        headers = {"Content-Type": "application/merge-patch+json"}
        async with session.patch(
            f"{CLAIMS}/claim-{driver}/status", data=json.dumps(patch), headers=headers
        ) as r:
            return r.status, r.status in (200, 409)
    if kind == "refused":
        other = DRIVERS[(DRIVERS.index(driver) + 1) % len(DRIVERS)]
        async with session.post(SLICES, json=_slice(f"x-{n}", other)) as r:
            return r.status, r.status == 403
    temporary = f"{driver}-tmp-{n}"
    async with session.post(SLICES, json=_slice(temporary, driver)) as r:
        created = r.status
    async with session.delete(f"{SLICES}/{temporary}") as r:
        return max(created, r.status), created == 201 and r.status == 200


# Watches that see every change: per driver, four on its slices and one on claims. The others
# wait on the driver's DevicePools, which nothing writes here (a node's informers mostly wait):
# every write fanned out to 500 watches would be 75,000 events a second, a load test of the
# event path (and of the embedded API server's selectors) rather than a soak of the serving
# process.
LIVE_WATCHES = 15
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"


async def _watch(
    soak: Soak, session: aiohttp.ClientSession, driver: str, number: int, stop: float
) -> None:
    pinned = f"fieldSelector=spec.driver%3D{driver}%2Cspec.nodeName%3D{NODE}"
    if number >= LIVE_WATCHES:
        path = f"{POOLS}?watch=true&{pinned}"
    elif number % 5 == 4:
        path = f"{CLAIMS}?watch=true"
    else:
        path = f"{SLICES}?watch=true&{pinned}"
    while time.monotonic() < stop:
        soak.watch_opens += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        try:
            async with session.get(f"{path}&timeoutSeconds=300", timeout=timeout) as r:
                async for _ in r.content:
                    if time.monotonic() >= stop:
                        return
        except aiohttp.ClientError:
            await asyncio.sleep(1)


async def _load(soak: Soak, serve_pid: int, minutes: float) -> None:
    sessions = {driver: _session(soak, driver) for driver in DRIVERS}
    stop = time.monotonic() + minutes * 60
    kinds = [kind for kind, weight in _MIX for _ in range(weight)]
    watchers = [
        asyncio.create_task(_watch(soak, sessions[DRIVERS[i % 3]], DRIVERS[i % 3], i, stop))
        for i in range(soak.watches)
    ]
    pending: set[asyncio.Task[None]] = set()
    n = 0
    began = time.monotonic()
    minute = Minute(began)
    soak.minutes.append(minute)

    async def timed(driver: str, kind: str, number: int, into: Minute) -> None:
        started = time.perf_counter()
        try:
            code, expected = await _one(sessions[driver], driver, kind, number)
        except (aiohttp.ClientError, TimeoutError):
            code, expected = 0, False
        into.latencies.append(time.perf_counter() - started)
        into.codes[code] = into.codes.get(code, 0) + 1
        into.unexpected += not expected

    try:
        while (now := time.monotonic()) < stop:
            if now - minute.started >= 60:
                soak.rss.append((now - began, _rss_kb(serve_pid)))
                _report(soak, minute)
                minute = Minute(now)
                soak.minutes.append(minute)
            n += 1
            driver, kind = DRIVERS[n % 3], random.choice(kinds)
            soak.requests += 2 if kind == "create-delete" else 1
            task = asyncio.create_task(timed(driver, kind, n, minute))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, began + n / soak.rate - time.monotonic()))
        await asyncio.gather(*pending)
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        for session in sessions.values():
            await session.close()
    soak.rss.append((time.monotonic() - began, _rss_kb(serve_pid)))


def _p99_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies) or [0.0]
    return ordered[int(len(ordered) * 0.99)] * 1e3


def _report(soak: Soak, minute: Minute) -> None:
    print(
        f"minute {len(soak.minutes):3d}: {len(minute.latencies)} requests, p50 "
        f"{statistics.median(minute.latencies or [0.0]) * 1e3:.2f} ms, p99 "
        f"{_p99_ms(minute.latencies):.2f} ms, unexpected "
        f"{minute.unexpected}, RSS {soak.rss[-1][1] / 1024:.1f} MB, codes {minute.codes}",
        flush=True,
    )


def _verdict(soak: Soak, audit: Path) -> dict[str, Any]:
    """The pass criteria: one audit event per request (watches included), no unexpected
    answer, RSS at the end within 5 % of minute 5, and p99 stable: after the first five
    minutes, the median of the per-minute p99s in the second half is at most 1.25 times
    that of the first half."""
    complete = 0
    with audit.open("rb") as log:  # an hour is about a million events: read line by line
        for line in log:
            if line.strip() and json.loads(line).get("stage") == "ResponseComplete":
                complete += 1
    p99s = [round(_p99_ms(m.latencies), 2) for m in soak.minutes if m.latencies]
    steady = p99s[5:] or p99s or [0.0]
    half = len(steady) // 2
    first, second = statistics.median(steady[:half] or steady), statistics.median(steady[half:])
    at5 = next((rss for t, rss in soak.rss if t >= 300), soak.rss[0][1] if soak.rss else 0)
    end = soak.rss[-1][1] if soak.rss else 0
    verdict: dict[str, Any] = {
        "requests": soak.requests,
        "watch_opens": soak.watch_opens,
        "audit_events_complete": complete,
        "unexpected": sum(m.unexpected for m in soak.minutes),
        "rss_minute5_mb": round(at5 / 1024, 1),
        "rss_end_mb": round(end / 1024, 1),
        "rss_growth": round((end - at5) / at5, 4) if at5 else 0.0,
        "p99_ms_per_minute": p99s,
        "p99_median_first_half_ms": round(first, 2),
        "p99_median_second_half_ms": round(second, 2),
    }
    verdict["passed"] = (
        complete == soak.requests + soak.watch_opens
        and verdict["unexpected"] == 0
        and abs(verdict["rss_growth"]) <= 0.05
        and second <= 1.25 * first
    )
    return verdict


async def _main(ns: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gk-soak-"))
    soak = Soak(workdir, ns.rate, ns.watches)
    try:
        serve, url, token = await _start(soak)
        await _seed(url, token, str(workdir / "up" / "ca.crt"))
        await _load(soak, serve.pid, ns.minutes)
        serve.send_signal(2)
        serve.wait(60)
        return _verdict(soak, workdir / "audit.log")
    finally:
        for process in soak.processes:
            if process.poll() is None:
                process.terminate()
                process.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--watches", type=int, default=500)
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args(argv)
    verdict = asyncio.run(_main(ns))
    print(json.dumps(verdict, indent=2))
    if ns.json is not None:
        ns.json.write_text(json.dumps(verdict, indent=2))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
