"""Audit benchmarks (DESIGN §5): the writer behind the proxy, and ``audit summarize`` speed.

    .venv/bin/python bench/audit_bench.py [--requests N] [--concurrency C] [--events N]

1. The writer alone: events/s from ``emit`` to the file, closed (everything on disk).
2. Behind the proxy: small GETs through the gatekeeper (Unix socket, embedded API server on
   loopback) with the audit log off and on; requests/s = audit events/s, and the difference.
3. ``summarize`` on a generated log of ``--events`` events (default 1,000,000): seconds, events/s.
4. ``check`` on the same log under the packaged policy: seconds, events/s.
5. ``generate`` on the same log: seconds, events/s, and the process's peak RSS after it
   (requests are counted by shape, not kept: it stays flat however long the log).
``--only summarize,check`` runs just those parts. Bounded loops, loopback only, temporary files
removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel, AuditSink, JsonLinesWriter, NullSink
from gatekeeper.audit.tools.check import check_records
from gatekeeper.audit.tools.generate import generate_policy
from gatekeeper.audit.tools.reader import ReadStats, iter_events, iter_records
from gatekeeper.audit.tools.summarize import summarize
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from gatekeeper.server.config import AuditSettings, ServeConfig
from gatekeeper.server.server import GatekeeperServer, socket_path
from gatekeeper.upstream.kubeconfig import UpstreamConfig

GPU, NIC, NODE, TOKEN = "gpu.example.com", "nic.example.com", "node-a", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}"


def sample_event(index: int) -> dict[str, Any]:
    """A realistic gatekeeper event (about 900 bytes as JSON)."""
    verb = ("list", "watch", "create", "update", "get", "delete")[index % 6]
    refused = verb == "create" and index % 4 == 0  # a create into another pool: refused
    driver = (GPU, NIC)[index % 2]
    name = f"node-a-slice-{index % 100}"
    # As drivers send them: list and watch pinned to the collection, a create to the collection.
    uri = {
        "list": f"{SLICES}?fieldSelector=spec.driver%3D{driver}%2Cspec.nodeName%3D{NODE}",
        "watch": f"{SLICES}?fieldSelector=spec.driver%3D{driver}%2Cspec.nodeName%3D{NODE}"
        "&watch=true",
        "create": SLICES,
    }.get(verb, f"{SLICES}/{name}")
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": f"00000000-0000-4000-8000-{index:012d}",
        "stage": "ResponseComplete",
        "requestURI": uri,
        "verb": verb,
        "user": {
            "username": driver,
            "groups": ["dra-gatekeeper:drivers"],
            "extra": {
                "authentication.kubernetes.io/node-name": [NODE],
                "dra-gatekeeper.io/transport": ["unix"],
                "dra-gatekeeper.io/peer-pid": [str(1000 + index % 50)],
                "dra-gatekeeper.io/peer-uid": ["0"],
                "dra-gatekeeper.io/peer-gid": ["0"],
            },
        },
        "sourceIPs": [],
        "userAgent": "gpu-kubeletplugin/v1.0.0 (linux/amd64) kubernetes/$Format",
        "objectRef": {
            "resource": "resourceslices",
            **({} if verb in ("list", "watch") else {"name": name}),
            "apiGroup": "resource.k8s.io",
            "apiVersion": "v1",
        },
        "responseStatus": {"metadata": {}, "code": 403 if refused else 200},
        "requestReceivedTimestamp": f"2025-06-01T10:{index // 60_000 % 60:02d}:"
        f"{index // 1000 % 60:02d}.{index % 1000:03d}000Z",
        "stageTimestamp": f"2025-06-01T10:{index // 60_000 % 60:02d}:"
        f"{index // 1000 % 60:02d}.{index % 1000:03d}900Z",
        "annotations": {
            "authorization.k8s.io/decision": "forbid" if refused else "allow",
            "authorization.k8s.io/reason": (
                f'spec.pool.name "other-{index % 3}" is not prefixed by node name "node-a"'
                if refused
                else "object belongs to the driver on this node"
            ),
        },
    }


async def bench_writer(directory: Path, count: int) -> float:
    writer = JsonLinesWriter(str(directory / "writer.log"))
    events = [sample_event(i) for i in range(1000)]
    start = time.perf_counter()
    for index in range(count):
        await writer.emit(events[index % 1000])
    await writer.aclose()
    return count / (time.perf_counter() - start)


async def bench_proxy(
    directory: Path, audit: AuditSink, requests: int, concurrency: int
) -> tuple[float, float]:
    """(requests/s through the gatekeeper, seconds) for ``requests`` small GETs."""
    policy = load_policy(None).with_drivers(frozenset({GPU, NIC}))
    upstream = APIServer(served_kinds(policy), token=TOKEN)
    await upstream.start()
    socket_dir = Path(tempfile.mkdtemp(prefix="gk-bench-", dir=directory))
    config = ServeConfig(
        node_name=NODE,
        policy=policy,
        upstream=UpstreamConfig(server=upstream.url, token=TOKEN),
        socket_dir=socket_dir,
        audit=AuditSettings(level=AuditLevel.METADATA),
    )
    server = GatekeeperServer(config, audit=audit)
    await server.start()
    connector = aiohttp.UnixConnector(path=str(socket_path(socket_dir, GPU)), limit=concurrency)
    try:
        async with aiohttp.ClientSession("http://localhost", connector=connector) as session:

            async def worker(share: int) -> None:
                for index in range(share):
                    path = PINNED if index % 2 else "/version"
                    async with session.get(path) as response:
                        await response.read()
                        assert response.status == 200, response.status

            await worker(10)  # warm up (connections, caches)
            upstream.journal.clear()
            start = time.perf_counter()
            await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
            elapsed = time.perf_counter() - start
    finally:
        await server.stop()  # closes (flushes) the audit sink
        await upstream.close()
    done = requests // concurrency * concurrency
    return done / elapsed, elapsed


def write_log(path: Path, count: int) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, count, 10_000):
            handle.write(
                "".join(
                    json.dumps(sample_event(i), separators=(",", ":")) + "\n"
                    for i in range(start, min(count, start + 10_000))
                )
            )


def bench_summarize(path: Path, count: int) -> tuple[float, float]:
    start = time.perf_counter()
    stats = ReadStats()
    summary = summarize(iter_events([str(path)], stats), {})
    elapsed = time.perf_counter() - start
    assert summary.requests == count == stats.events, (summary.requests, stats.events)
    return elapsed, count / elapsed


def bench_check(path: Path, count: int) -> tuple[float, float]:
    """``audit check`` of the log under the packaged policy (drivers from the log itself)."""
    start = time.perf_counter()
    report = check_records(iter_records([str(path)], {}), load_policy(None))
    elapsed = time.perf_counter() - start
    seen = sum(report.decided.values()) + sum(report.skipped.values())
    assert seen == count and not report.changes, (seen, report.changes[:1])
    return elapsed, count / elapsed


def bench_generate(path: Path, count: int) -> tuple[float, float, float]:
    """``audit generate`` of the log with the packaged default as the base; the last value is
    the process's peak RSS in MB afterwards."""
    start = time.perf_counter()
    text = generate_policy(iter_records([str(path)], {}), load_policy(None))
    elapsed = time.perf_counter() - start
    assert "rule: NodeLocal" in text, text
    return elapsed, count / elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--writer-events", type=int, default=200_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--only",
        default="writer,proxy,summarize,check,generate",
        help="comma-separated parts to run",
    )
    args = parser.parse_args()
    parts = set(args.only.split(","))
    directory = Path(tempfile.mkdtemp(prefix="gk-audit-bench-"))
    try:
        if parts & {"writer", "proxy"}:
            await bench_writer_and_proxy(directory, args, parts)
        if parts & {"summarize", "check", "generate"}:
            log = directory / "summarize.log"
            write_log(log, args.events)
            size_mb = log.stat().st_size / 1e6
        if "summarize" in parts:
            seconds, per_second = bench_summarize(log, args.events)
            print(
                f"summarize: {args.events:,} events ({size_mb:,.0f} MB) in {seconds:.1f} s "
                f"= {per_second:,.0f} events/s"
            )
        if "generate" in parts:
            seconds, per_second, peak = bench_generate(log, args.events)
            print(
                f"generate: {args.events:,} events ({size_mb:,.0f} MB) in {seconds:.1f} s "
                f"= {per_second:,.0f} events/s; peak RSS {peak:.0f} MB"
            )
        if "check" in parts:
            seconds, per_second = bench_check(log, args.events)
            print(
                f"check: {args.events:,} events ({size_mb:,.0f} MB) in {seconds:.1f} s "
                f"= {per_second:,.0f} events/s"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def bench_writer_and_proxy(
    directory: Path, args: argparse.Namespace, parts: set[str]
) -> None:
    if "writer" in parts:
        rate = await bench_writer(directory, args.writer_events)
        print(f"writer alone: {args.writer_events} events, {rate:,.0f} events/s (to disk)")
    if "proxy" in parts:
        plain, _ = await bench_proxy(directory, NullSink(), args.requests, args.concurrency)
        audited_log = directory / "proxy-audit.log"
        writer = JsonLinesWriter(str(audited_log))
        audited, _ = await bench_proxy(directory, writer, args.requests, args.concurrency)
        lines = audited_log.read_bytes().count(b"\n")
        print(
            f"behind the proxy (c={args.concurrency}, small GETs): no audit {plain:,.0f} req/s; "
            f"audit to file {audited:,.0f} req/s = events/s ({lines} lines, "
            f"{writer.stats.backpressure_waits} backpressure waits, "
            f"{writer.stats.write_errors} write errors); overhead {1 - audited / plain:.1%}"
        )


if __name__ == "__main__":
    asyncio.run(main())
