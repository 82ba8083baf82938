"""Watches of the embedded API server (``gatekeeper/apiserver/_watch.py``): delivery whatever the
bookmark setting, and no busy loop while idle (a due bookmark must not keep a watch busy)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, resource_slice

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
IDLE_SECONDS = 2.0
# An idle watch wakes a few times a second; a busy loop burns whatever CPU it gets (even at a
# quarter of a shared core, 0.5 s in 2 s). Generous: this is a correctness check, not a timing.
IDLE_CPU_BOUND = 0.4


async def _next_event(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    while True:
        line = await asyncio.wait_for(resp.content.readline(), 10)
        assert line, "the watch ended before the event arrived"
        event = json.loads(line)
        if event["type"] != "BOOKMARK":
            return event


@pytest.mark.parametrize("bookmarks", ["", "&allowWatchBookmarks=true"], ids=["plain", "bookmarks"])
async def test_a_watch_sees_an_event_made_after_an_idle_period_without_spinning(
    client: aiohttp.ClientSession, server: APIServer, bookmarks: str
) -> None:
    assert server.bookmark_interval < IDLE_SECONDS  # the bug began one interval in
    async with client.get(f"{SLICES}?watch=true&timeoutSeconds=30{bookmarks}") as resp:
        assert resp.status == 200
        cpu_before = time.process_time()
        await asyncio.sleep(IDLE_SECONDS)
        idle_cpu = time.process_time() - cpu_before
        created = await client.post(
            SLICES, json=resource_slice("late", driver="gpu.example.com", node="node-a")
        )
        assert created.status == 201
        event = await _next_event(resp)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "late")
    assert idle_cpu < IDLE_CPU_BOUND, f"{idle_cpu:.2f} s of CPU while the watch was idle"
    assert await _watchers_drain(server)


async def _watchers_drain(server: APIServer) -> bool:
    for _ in range(50):  # the server notices the closed connection within a tick
        if server.store.watcher_count == 0:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_watchlist_sends_initial_events_in_key_order_then_one_bookmark(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    for name in ("b", "a"):
        server.add(resource_slice(name, driver="gpu.example.com", node="node-a"))
    query = (
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        "&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    async with client.get(f"{SLICES}?{query}") as resp:
        lines = (await asyncio.wait_for(resp.read(), 10)).splitlines()
    events = [json.loads(line) for line in lines]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:3]] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("BOOKMARK", None),
    ]
    end = events[2]["object"]["metadata"]
    assert end == {
        "resourceVersion": str(server.store.current_rv),
        "annotations": {"k8s.io/initial-events-end": "true"},
    }
    # Later bookmarks carry no annotation; nothing else arrives without writes.
    assert all(e["type"] == "BOOKMARK" for e in events[3:])
    assert all("annotations" not in e["object"]["metadata"] for e in events[3:])
