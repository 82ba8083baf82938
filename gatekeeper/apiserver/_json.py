"""Bounded JSON for the embedded API server: the apiserver's depth limit, and deep documents.

The apiserver's decoder (Go's ``encoding/json``) refuses a document nesting more than
10,000 levels and reads anything shallower (recordings 194-196). Python's ``json``,
``copy.deepcopy`` and ``==`` recurse, and stop at the interpreter's recursion limit (1,000 by
default). Rewriting each of them iteratively would be a lot of code to get subtly wrong, so
:func:`deep` runs the same standard-library code again, only after an ordinary attempt hit
``RecursionError``, in a thread with a large stack and a raised recursion limit. The limit is
process-wide, so it is raised under a lock while the calling thread (the event loop) waits,
and restored before the call returns: the gatekeeper under test keeps the default limit.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = [
    "MAX_DEPTH",
    "BigNumber",
    "DepthExceeded",
    "JSONSyntaxError",
    "deep",
    "dumps",
    "find_big_number",
    "loads",
]

MAX_DEPTH: Final = 10_000
"""Nesting levels the apiserver's decoder reads (Go ``encoding/json``'s ``maxNestingDepth``)."""

_STACK_BYTES: Final = 128 * 1024 * 1024  # virtual: only the pages a deep call touches are used
_DEEP_RECURSION_LIMIT: Final = 8 * MAX_DEPTH  # deepcopy and merge use a few frames per level
_LOCK = threading.Lock()
_T = TypeVar("_T")
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class DepthExceeded(ValueError):
    """A document nests more than :data:`MAX_DEPTH` levels; ``char`` opened the level too many."""

    def __init__(self, char: str) -> None:
        super().__init__(f"invalid character '{char}' exceeded max depth")
        self.char = char


class JSONSyntaxError(ValueError):
    """Not JSON, in Go's words where they are known (``NaN`` and ``Infinity`` are not JSON)."""


class BigNumber(float):
    """A number literal no float64 holds (``1e400``); ``text`` is the literal as sent."""

    text: str

    def __new__(cls, text: str) -> BigNumber:
        value = super().__new__(cls, float(text))
        value.text = text
        return value


def deep(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``; if that recursed too deep, again in a thread that can go
    deeper (``fn`` must not have changed anything before it failed)."""
    try:
        return fn(*args, **kwargs)
    except RecursionError:
        pass
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append((False, exc))

    with _LOCK:
        old_limit, old_stack = sys.getrecursionlimit(), threading.stack_size()
        threading.stack_size(_STACK_BYTES)
        try:
            sys.setrecursionlimit(max(old_limit, _DEEP_RECURSION_LIMIT))
            worker = threading.Thread(target=run, name="gatekeeper.testing.deep-json")
            worker.start()
            worker.join()
        finally:
            sys.setrecursionlimit(old_limit)
            threading.stack_size(old_stack)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _check_depth(text: str) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("{", "["):
            depth += 1
            if depth > MAX_DEPTH:
                raise DepthExceeded(token)
        elif token in ("}", "]"):
            depth -= 1


def _constant(name: str) -> Any:
    raise JSONSyntaxError(f"invalid character '{name[0]}' looking for beginning of value")


def _number(text: str) -> float:
    value = float(text)
    return BigNumber(text) if math.isinf(value) else value


def _loads(text: str) -> Any:
    return json.loads(text, parse_float=_number, parse_constant=_constant)


def loads(data: bytes | str) -> Any:
    """Decode as the apiserver would: ValueError (``DepthExceeded``, ``JSONSyntaxError``,
    ``json.JSONDecodeError``) for what it refuses; numbers too big for float64 come back as
    :class:`BigNumber` for the caller to refuse where the schema says so."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        return _loads(text)
    except RecursionError:
        pass
    _check_depth(text)
    return deep(_loads, text)


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def dumps(obj: Any) -> str:
    """Compact JSON (the apiserver's framing), whatever the depth."""
    return deep(_compact, obj)


def find_big_number(obj: Any) -> tuple[list[str | int], BigNumber] | None:
    """The path to the first :class:`BigNumber` in ``obj`` (iterative, any depth), or None."""
    parents: list[tuple[int, str | int]] = []  # node -> (its parent's node, its key there)
    stack: list[tuple[int, Any]] = [(-1, obj)]
    while stack:
        node, value = stack.pop()
        if isinstance(value, BigNumber):
            path: list[str | int] = []
            while node >= 0:
                node, key = parents[node]
                path.append(key)
            return path[::-1], value
        if isinstance(value, dict | list):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in reversed(list(items)):
                parents.append((node, key))
                stack.append((len(parents) - 1, child))
    return None
