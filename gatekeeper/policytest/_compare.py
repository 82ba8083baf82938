"""Compare a case's expectation with its outcome; each difference is one readable line pair."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gatekeeper.policytest._harness import Forwarded, Outcome
from gatekeeper.policytest._model import Expectation, ForwardedSpec

__all__ = ["Mismatch", "compare", "subset_differences"]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One difference: ``key`` (e.g. ``code``, ``forwarded.query.fieldSelector``)."""

    key: str
    expected: str
    actual: str


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def compare(expect: Expectation, outcome: Outcome) -> list[Mismatch]:
    """Every way ``outcome`` differs from ``expect`` (empty: the case passes)."""
    if outcome.error:
        return [Mismatch("request", "an answer", outcome.error)]
    out: list[Mismatch] = []
    actual_allowed = outcome.decision == "allow"
    if expect.allowed != actual_allowed:
        shown = outcome.decision or "no decision recorded"
        out.append(Mismatch("allowed", _show(expect.allowed), f"{_show(actual_allowed)} ({shown})"))
    if expect.code is not None and expect.code != outcome.code:
        out.append(Mismatch("code", str(expect.code), str(outcome.code)))
    if expect.reason is not None and not (
        expect.reason.search(outcome.reason) or expect.reason.search(outcome.message)
    ):
        out.append(Mismatch("reason", f"/{expect.reason.pattern}/", _show(outcome.reason)))
    if expect.message is not None and not expect.message.search(outcome.message):
        out.append(Mismatch("message", f"/{expect.message.pattern}/", _show(outcome.message)))
    if expect.validation is not None and expect.validation != outcome.validation:
        out.append(Mismatch("validation", _show(expect.validation), _show(outcome.validation)))
    if expect.check_forwarded:
        out.extend(_forwarded(expect.forwarded, outcome.forwarded))
    return out


def _forwarded(spec: ForwardedSpec | None, actual: Forwarded | None) -> list[Mismatch]:
    if spec is None:
        if actual is None:
            return []
        return [Mismatch("forwarded", "nothing", f"{actual.method} {actual.path}")]
    if actual is None:
        return [Mismatch("forwarded", "a request", "nothing reached the upstream")]
    out: list[Mismatch] = []
    if spec.method is not None and spec.method != actual.method:
        out.append(Mismatch("forwarded.method", spec.method, actual.method))
    if spec.path is not None and spec.path != actual.path:
        out.append(Mismatch("forwarded.path", spec.path, actual.path))
    if spec.query is not None:
        for key in sorted(set(spec.query) | set(actual.query)):
            want, got = spec.query.get(key), actual.query.get(key)
            if want != got:
                out.append(Mismatch(f"forwarded.query.{key}", _maybe(want), _maybe(got)))
    if spec.headers is not None:
        lower = {k.lower(): v for k, v in actual.headers.items()}
        for key, want in spec.headers.items():
            got = lower.get(key.lower())
            if want != got:
                out.append(Mismatch(f"forwarded.headers.{key}", _show(want), _maybe(got)))
    if spec.has_body:
        out.extend(
            Mismatch(f"forwarded.body{where}", want, got)
            for where, want, got in subset_differences(spec.body, actual.body)
        )
    return out


def _maybe(value: str | None) -> str:
    return "(absent)" if value is None else _show(value)


def subset_differences(want: Any, got: Any, where: str = "") -> list[tuple[str, str, str]]:
    """Where ``got`` fails to match ``want``: mappings by the keys ``want`` gives (recursively),
    lists item by item and of equal length, anything else by equality."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [(where, _show(want), _show(got))]
        out: list[tuple[str, str, str]] = []
        for key, value in want.items():
            if key not in got:
                out.append((f"{where}.{key}", _show(value), "(absent)"))
            else:
                out.extend(subset_differences(value, got[key], f"{where}.{key}"))
        return out
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [(where, _show(want), _show(got))]
        out = []
        for index, (item, other) in enumerate(zip(want, got, strict=True)):
            out.extend(subset_differences(item, other, f"{where}[{index}]"))
        return out
    if want != got or type(want) is not type(got):
        return [(where, _show(want), _show(got))]
    return []
