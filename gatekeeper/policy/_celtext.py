"""CEL as text, for the admission-policy export: reading and renaming references outside string
literals, and the comparison of two objects but for what ``mayChange`` allows."""

from __future__ import annotations

import json
import re

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.policy.changes import MAINTAINED
from gatekeeper.policy.model import Changeable

__all__ = ["reads", "rename", "unchanged_but"]

_STRING = re.compile(
    r"""[rR]?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""", re.S
)
_MAINTAINED = tuple(path[1] for path in sorted(MAINTAINED))


def _code_spans(source: str) -> list[tuple[int, int, bool]]:
    """The source cut into (start, end, is_code) spans: string literals are never rewritten."""
    spans: list[tuple[int, int, bool]] = []
    at = 0
    for match in _STRING.finditer(source):
        spans.append((at, match.start(), True))
        spans.append((match.start(), match.end(), False))
        at = match.end()
    spans.append((at, len(source), True))
    return spans


def _reference(name: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])" + re.escape(name).replace(r"\.", r"\s*\.\s*") + r"(?!\w)")


def reads(source: str, name: str) -> bool:
    pattern = _reference(name)
    return any(code and pattern.search(source[a:b]) for a, b, code in _code_spans(source))


def rename(source: str, name: str, replacement: str) -> str:
    pattern = _reference(name)
    return "".join(
        pattern.sub(lambda _: replacement, source[a:b]) if code else source[a:b]
        for a, b, code in _code_spans(source)
    )


def unchanged_but(allowed: tuple[Changeable, ...]) -> str:
    """CEL that holds when ``object`` is ``oldObject`` but for ``allowed`` (and the fields the
    apiserver maintains): the same comparison :func:`~gatekeeper.policy.changes.forbidden_change`
    makes."""
    return _compare("object", "oldObject", (), allowed)


def _compare(new: str, old: str, at: FieldPath, allowed: tuple[Changeable, ...]) -> str:
    exact = [entry for entry in allowed if entry.path == at]
    if exact:
        return _keys(new, old, exact[0]) if exact[0].keys else "true"
    below = {
        entry.path[len(at)]
        for entry in allowed
        if entry.path[: len(at)] == at and len(entry.path) > len(at)
    }
    skip = set(below) | ({*_MAINTAINED} if at == ("metadata",) else set())
    if not below and at:
        return f"{new} == {old}"
    listed = json.dumps(sorted(skip))
    parts = [
        f"{new}.all(k, k in {listed} || (k in {old} && {new}[k] == {old}[k]))",
        f"{old}.all(k, k in {listed} || k in {new})",
    ]
    for step in sorted(below):
        child_new, child_old = (
            f"{new}[?{json.dumps(step)}].orValue({{}})",
            f"{old}[?{json.dumps(step)}].orValue({{}})",
        )
        parts.append(f"({_compare(child_new, child_old, (*at, step), allowed)})")
    return " && ".join(parts)


def _keys(new: str, old: str, entry: Changeable) -> str:
    exact = [k for k in entry.keys if not k.endswith("*")]
    prefixes = [k[:-1] for k in entry.keys if k.endswith("*")]
    allowed = " || ".join(
        [f"k in {json.dumps(exact)}"] * bool(exact)
        + [f"k.startsWith({json.dumps(prefix)})" for prefix in prefixes]
    )
    return (
        f"{new}.all(k, {allowed} || (k in {old} && {new}[k] == {old}[k])) && "
        f"{old}.all(k, {allowed} || k in {new})"
    )
