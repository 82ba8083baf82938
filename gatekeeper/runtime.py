"""The event loop the gatekeeper runs on: uvloop when installed (its TLS and socket transports
are C; the proxy does the same work at about twice the rate), else asyncio's own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

log = logging.getLogger("gatekeeper.runtime")

_T = TypeVar("_T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default loop) when it is not installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)`` on the fastest loop available."""
    factory = loop_factory()
    log.info("event loop=%s", "uvloop" if factory is not None else "asyncio")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
