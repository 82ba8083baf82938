"""How the gatekeeper process runs: on uvloop when installed (C transports), else asyncio's
loop; with the start-up heap frozen out of the cyclic GC and its young generation widened."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

log = logging.getLogger("gatekeeper.runtime")

_T = TypeVar("_T")

_GC_THRESHOLDS = (20_000, 20, 50)
"""Each request allocates a few hundred short-lived objects, almost none in cycles: collecting
the young generation every 700 allocations (the default) costs more than it frees."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default loop) when it is not installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)`` on the fastest loop available, with the GC tuned for serving.

    What exists by now (modules, policy, configuration) lives for the whole process: frozen,
    the collector never walks it again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    factory = loop_factory()
    log.debug("event loop=%s", "uvloop" if factory is not None else "asyncio")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
