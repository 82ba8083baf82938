"""The audit writer: bounded queue with backpressure, nothing lost, write errors retried.

Write failures are injected at the OS level: the log's file descriptor is pointed at
``/dev/full`` (every write fails with ENOSPC) and later back at the file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.audit import JsonLinesWriter


def event(index: int, padding: int = 0) -> dict[str, Any]:
    return {"kind": "Event", "auditID": f"id-{index}", "verb": "get", "pad": "x" * padding}


def read_ids(path: Path) -> list[str]:
    return [json.loads(line)["auditID"] for line in path.read_text().splitlines()]


def fd_of(path: Path) -> int:
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                return int(name)
        except OSError:
            continue
    raise AssertionError(f"{path} is not open")


@contextmanager
def disk_full(path: Path) -> Iterator[None]:
    """Every write to the open ``path`` fails with ENOSPC inside the block."""
    fd = fd_of(path)
    saved = os.dup(fd)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, fd)
    os.close(full)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


async def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_concurrent_emits_all_written_with_backpressure(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    writer = JsonLinesWriter(str(path), queue_size=8)
    await asyncio.gather(*(writer.emit(event(i, 200)) for i in range(1000)))
    await writer.aclose()
    assert sorted(read_ids(path)) == sorted(f"id-{i}" for i in range(1000))
    assert writer.stats.emitted == writer.stats.written == 1000
    assert writer.stats.backpressure_waits > 0
    assert writer.stats.lost == writer.stats.write_errors == 0
    assert path.stat().st_mode & 0o777 == 0o600


async def test_write_errors_are_logged_counted_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.log"
    writer = JsonLinesWriter(str(path), queue_size=4)
    await writer.emit(event(0))
    await wait_for(lambda: writer.stats.written == 1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    with caplog.at_level(logging.ERROR, logger="gatekeeper.audit"), disk_full(path):
        ticking = asyncio.create_task(ticker())
        producers = [asyncio.create_task(writer.emit(event(i))) for i in range(1, 20)]
        await wait_for(lambda: writer.stats.write_errors >= 2 and writer.stats.backpressure_waits)
        # The queue is full and producers wait, but the event loop keeps running.
        before = ticks
        await asyncio.sleep(0.05)
        assert ticks > before
        waiting = [p for p in producers if not p.done()]
        assert waiting, "backpressure should hold some producers"
        waiting[-1].cancel()  # a cancelled request still gets its event written
    await asyncio.gather(*producers, return_exceptions=True)
    ticking.cancel()
    await writer.aclose()
    assert sorted(read_ids(path)) == sorted(f"id-{i}" for i in range(20))
    assert writer.stats.lost == 0
    assert "write failed" in caplog.text and "No space left" in caplog.text


async def test_a_file_that_never_recovers_counts_lost_events_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.log"
    writer = JsonLinesWriter(str(path), close_timeout=0.2)
    with caplog.at_level(logging.ERROR, logger="gatekeeper.audit"), disk_full(path):
        for i in range(5):
            await writer.emit(event(i))
        await writer.aclose()
    assert writer.stats.lost == 5 and writer.stats.written == 0
    assert "5 events could not be written" in caplog.text


async def test_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    writer = JsonLinesWriter("-")
    for i in range(3):
        await writer.emit(event(i))
    writer.close()
    writer.close()  # idempotent
    out = capfd.readouterr().out
    assert [json.loads(line)["auditID"] for line in out.splitlines()] == ["id-0", "id-1", "id-2"]


async def test_emit_after_close_is_counted(tmp_path: Path) -> None:
    writer = JsonLinesWriter(str(tmp_path / "audit.log"))
    writer.close()
    await writer.emit(event(0))
    assert writer.stats.lost == 1


def test_unopenable_path_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JsonLinesWriter(str(tmp_path / "missing" / "audit.log"))
