"""Shared reads on a real event loop: one read in flight per key, later requests served by the
next, requests at a resourceVersion by the running one, a read nobody waits for stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gatekeeper.proxy.sharedreads import SharedReads


class Reads:
    """Reads whose end the test decides: each ``start()`` records itself and waits for its
    gate; ``done(n)`` lets the n-th read (from 0) return ``n``."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.ended: list[int] = []
        self.cancelled: list[int] = []

    async def start(self) -> int:
        number = len(self.gates)
        gate = asyncio.Event()
        self.gates.append(gate)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(number)
            raise
        self.ended.append(number)
        return number

    def done(self, number: int) -> None:
        self.gates[number].set()


async def until(condition: Callable[[], bool]) -> None:
    """Poll the state (never a fixed sleep) for up to 5 s."""
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the state was not reached")


async def test_identical_reads_in_flight_cost_one_more_read() -> None:
    """The first request starts a read; the 19 that arrive while it runs wait for one more,
    which begins only when the first has ended: 20 requests, 2 reads, never 2 at once."""
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    first = asyncio.create_task(shared.read("k", reads.start, join_running=False))
    await until(lambda: len(reads.gates) == 1)
    later = [
        asyncio.create_task(shared.read("k", reads.start, join_running=False)) for _ in range(19)
    ]
    await until(lambda: shared.waiting() == (1, 19))
    assert len(reads.gates) == 1  # the next read waits for the running one
    reads.done(0)
    assert await first == 0
    await until(lambda: len(reads.gates) == 2)
    assert shared.waiting() == (19, 0)
    reads.done(1)
    assert await asyncio.gather(*later) == [1] * 19
    assert (shared.started, shared.requests) == (2, 20)
    assert shared.waiting() == (0, 0)


async def test_a_request_at_a_version_joins_the_running_read() -> None:
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    first = asyncio.create_task(shared.read("k", reads.start, join_running=True))
    await until(lambda: len(reads.gates) == 1)
    second = asyncio.create_task(shared.read("k", reads.start, join_running=True))
    await until(lambda: shared.waiting() == (2, 0))
    reads.done(0)
    assert await asyncio.gather(first, second) == [0, 0]
    assert shared.started == 1


async def test_other_keys_do_not_wait() -> None:
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    held = asyncio.create_task(shared.read("a", reads.start, join_running=False))
    await until(lambda: len(reads.gates) == 1)
    other = asyncio.create_task(shared.read("b", reads.start, join_running=False))
    await until(lambda: len(reads.gates) == 2)
    reads.done(1)
    assert await other == 1
    assert not held.done()
    reads.done(0)
    assert await held == 0


async def test_a_read_nobody_waits_for_is_stopped_before_the_next_begins() -> None:
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    left = asyncio.create_task(shared.read("k", reads.start, join_running=False))
    await until(lambda: len(reads.gates) == 1)
    left.cancel()
    await asyncio.gather(left, return_exceptions=True)
    await until(lambda: reads.cancelled == [0])
    again = asyncio.create_task(shared.read("k", reads.start, join_running=True))
    await until(lambda: len(reads.gates) == 2)  # a new read: the stopped one is not joined
    reads.done(1)
    assert await again == 1


async def test_a_waiting_read_whose_requests_left_reads_nothing() -> None:
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    running = asyncio.create_task(shared.read("k", reads.start, join_running=False))
    await until(lambda: len(reads.gates) == 1)
    waiting = asyncio.create_task(shared.read("k", reads.start, join_running=False))
    await until(lambda: shared.waiting() == (1, 1))
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    reads.done(0)
    assert await running == 0
    await until(lambda: shared.waiting() == (0, 0) and len(shared) == 0)
    assert len(reads.gates) == 1 and shared.started == 1


async def test_a_failed_read_fails_every_request_that_waited_for_it() -> None:
    shared: SharedReads[str, int] = SharedReads()
    gate = asyncio.Event()

    async def failing() -> int:
        await gate.wait()
        raise ValueError("upstream said no")

    requests = [asyncio.create_task(shared.read("k", failing, join_running=True)) for _ in range(3)]
    await until(lambda: shared.waiting() == (3, 0))
    gate.set()
    for outcome in await asyncio.gather(*requests, return_exceptions=True):
        assert isinstance(outcome, ValueError)
    reads = Reads()
    after = asyncio.create_task(shared.read("k", reads.start, join_running=True))
    await until(lambda: len(reads.gates) == 1)  # a failure is not kept: the next one reads
    reads.done(0)
    assert await after == 0


@pytest.mark.parametrize("join_running", [False, True])
async def test_reads_one_after_another_each_read(join_running: bool) -> None:
    """Nothing is cached: a request after a read has ended starts a read of its own."""
    shared: SharedReads[str, int] = SharedReads()
    reads = Reads()
    for number in range(3):
        task = asyncio.create_task(shared.read("k", reads.start, join_running=join_running))
        await until(lambda n=number: len(reads.gates) == n + 1)
        reads.done(number)
        assert await task == number
    assert shared.started == 3
