"""Graceful shutdown of a real ``serve`` process: SIGTERM during a write and a watch."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.testing.harness import (
    GPU,
    NODE,
    SERVE,
    free_port,
    metric_value,
    token_kubeconfig,
    wait_ready,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"


async def _in_flight(health: int, count: int) -> None:
    """Poll /metrics until ``count`` of the driver's requests are in the pipeline (admitted)."""
    url = f"http://127.0.0.1:{health}/metrics"
    async with asyncio.timeout(20), aiohttp.ClientSession() as session:
        while True:
            async with session.get(url) as response:
                text = await response.text()
            if metric_value(text, "dra_gatekeeper_requests_in_flight", driver=GPU) >= count:
                return
            await asyncio.sleep(0.05)


async def _logged(stderr: asyncio.StreamReader, line: bytes) -> bytes:
    """The process's log up to and including the first line holding ``line``."""
    seen = b""
    async with asyncio.timeout(20):
        while line not in seen:
            read = await stderr.readline()
            assert read, seen.decode()  # the log ended without it
            seen += read
    return seen


async def test_sigterm_finishes_the_write_ends_the_watch_and_flushes_the_audit(
    apiserver: APIServer, tmp_path: Path
) -> None:
    sockets, audit, health = tmp_path / "s", tmp_path / "audit.log", free_port()
    process = await asyncio.create_subprocess_exec(
        *SERVE,
        *("--node-name", NODE, "--driver", GPU, "--socket-dir", str(sockets)),
        *("--kubeconfig", token_kubeconfig(tmp_path / "kc", apiserver.url)),
        *("--health-listen", f"127.0.0.1:{health}", "--audit-log", str(audit)),
        *("--shutdown-grace-period", "20"),
        stderr=asyncio.subprocess.PIPE,
    )
    socket = sockets / GPU / "api.sock"
    try:
        await wait_ready(health)
        connector = aiohttp.UnixConnector(path=str(socket), limit=4)
        async with aiohttp.ClientSession("http://localhost", connector=connector) as session:
            watch = await session.get(f"{SLICES}?{PINNED}&watch=true")
            assert watch.status == 200
            body_started, release = asyncio.Event(), asyncio.Event()
            payload = json.dumps(resource_slice(f"{NODE}-late", driver=GPU, node=NODE)).encode()

            async def slow_body() -> AsyncIterator[bytes]:
                yield payload[:10]
                body_started.set()
                await release.wait()
                yield payload[10:]

            write = asyncio.ensure_future(
                session.post(
                    SLICES,
                    data=slow_body(),
                    headers={"Content-Type": "application/json"},
                )
            )
            await body_started.wait()
            await _in_flight(health, 2)  # the watch, and the write with its body half sent
            process.send_signal(signal.SIGTERM)
            assert process.stderr is not None
            logged = await _logged(process.stderr, b"stopping: draining in-flight requests")
            # Stopping, the gatekeeper ends the watch while the write is still in flight. It
            # ends cleanly (no broken stream): the driver's informer re-watches.
            rest = await asyncio.wait_for(watch.content.read(), 20)
            assert b"ERROR" not in rest
            watch.release()
            release.set()
            response = await asyncio.wait_for(write, 20)
            assert response.status == 201, await response.text()
            created = await response.json()
            assert created["metadata"]["name"] == f"{NODE}-late"
        _, err = await asyncio.wait_for(process.communicate(), 30)
        err = logged + err
    finally:
        if process.returncode is None:
            process.kill()
            _, err = await process.communicate()
            print(err.decode())
    assert process.returncode == 0, err.decode()
    assert "stopping: draining in-flight requests" in err.decode()
    assert not socket.exists()
    assert apiserver.get("resource.k8s.io", "resourceslices", f"{NODE}-late") is not None
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    completed = [e for e in events if e["stage"] == "ResponseComplete"]
    watches = [e for e in completed if e["verb"] == "watch"]
    creates = [e for e in completed if e["verb"] == "create"]
    assert len(watches) == 1 and watches[0]["responseStatus"]["code"] == 200
    assert len(creates) == 1 and creates[0]["responseStatus"]["code"] == 201
