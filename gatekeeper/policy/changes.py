"""What a write changes, by the one comparison every rule uses: the fields only the apiserver
maintains (:data:`MAINTAINED`), a difference by what the apiserver stores
(:func:`first_difference`), what an OwnNode or OwnPod write may change (:func:`forbidden_change`)
and a write that sets a maintained field (:func:`maintained_change`)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath, is_field_name
from gatekeeper.policy.model import Changeable
from gatekeeper.rule import Rule, Violation
from gatekeeper.types import KubeObject

__all__ = [
    "MAINTAINED",
    "META_TIMES",
    "dotted",
    "first_difference",
    "forbidden_change",
    "maintained_change",
    "only_changes",
    "same_instant",
]

MAINTAINED: frozenset[FieldPath] = frozenset(
    ("metadata", name)
    for name in (
        "resourceVersion",
        "managedFields",
        "generation",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    )
)
"""The meta/v1 ObjectMeta fields the apiserver maintains itself, the same in every kind: what it
stores there is its own record of a write (a new resourceVersion, the writer's managedFields
entry, a new generation) or what it keeps whatever a write says (uid, creation and deletion
times). Comparisons skip them; a driver's write may not set them (:func:`maintained_change`)."""

META_TIMES: tuple[FieldPath, ...] = (
    ("metadata", "creationTimestamp"),
    ("metadata", "deletionTimestamp"),
    ("metadata", "managedFields", "time"),
)
"""Where ObjectMeta holds a time (metav1.Time; list steps left out)."""

# What the apiserver takes from a write's body although it maintains it: a create keeps the
# body's generation, and any write but one through a subresource keeps managedFields that are
# not empty (a patch or update that sets them rewrites the ownership record; [] clears it). The
# rest it overwrites (uid, creation time on a create), resets to the stored value (generation,
# creation time on an update) or refuses to change (uid, deletion time: 422).
_TAKEN_ON_CREATE = (("metadata", "generation"), ("metadata", "managedFields"))
_TAKEN_ON_UPDATE = (("metadata", "managedFields"),)


def forbidden_change(old: Any, new: Any, allowed: tuple[Changeable, ...]) -> Violation | None:
    """Why ``new`` is not ``old`` with only ``allowed`` changes (None when it is)."""
    problem = _walk(old, new, (), allowed)
    return Violation(Rule.MAY_CHANGE, problem) if problem else None


def maintained_change(new: Any, old: KubeObject | None) -> Violation | None:
    """Why ``new``, the object a driver's write asks to store over ``old`` (None: a create),
    sets a field only the apiserver maintains that the apiserver would take from it; None when
    it leaves them to the apiserver.

    Left out, null or empty, a field is the apiserver's: an update keeps the stored value, a
    create gets the apiserver's own. An update may restate the stored value (compared by
    meaning: a time re-spelled is the same instant), as a client that re-sends what it read
    does. ``metadata.managedFields: []`` is no restatement: the apiserver reads it as "clear
    every entry"."""
    meta = new.get("metadata") if isinstance(new, dict) else None
    if not isinstance(meta, dict):
        return None
    stored = old.get("metadata") if isinstance(old, dict) else None
    stored = stored if isinstance(stored, dict) else {}
    for path in _TAKEN_ON_CREATE if old is None else _TAKEN_ON_UPDATE:
        name = path[1]
        value = meta.get(name)
        if _unset(value):
            continue
        if old is None:
            why = "a create may not set it"
        elif name in stored and not first_difference(
            stored[name], value, opaque=(), times=META_TIMES, keys=path
        ):
            continue
        else:
            why = "a write may restate the stored value, or leave it out"
        return Violation(
            Rule.FORBIDDEN_FIELD,
            f"metadata.{name} is maintained by the apiserver (it changes only as the apiserver's "
            f"own record of a permitted write): {why}",
        )
    return None


def _unset(value: Any) -> bool:
    # What Go decodes to the zero value a write leaves to the apiserver ([] is not: see above).
    return value is None or value == "" or (value == 0 and not isinstance(value, bool))


def _walk(old: Any, new: Any, path: FieldPath, allowed: tuple[Changeable, ...]) -> str | None:
    if path in MAINTAINED:
        return None
    for entry in allowed:
        if entry.path == path:
            return _keys(old, new, entry, allowed) if entry.keys else None
    if _same(old, new):
        return None
    below = any(
        len(entry.path) > len(path) and entry.path[: len(path)] == path for entry in allowed
    )
    before, after = _as_map(old), _as_map(new)
    if (
        before is None
        or after is None
        or (not below and not (isinstance(old, dict) and isinstance(new, dict)))
    ):
        return f"{dotted(path)} changes: {only_changes(allowed)}"
    # Both maps (or a map that appears or goes, with an allowed path below): key by key.
    for key in sorted(set(before) | set(after), key=str):
        problem = _walk(before.get(key, MISSING), after.get(key, MISSING), (*path, key), allowed)
        if problem:
            return problem
    return None


def _keys(old: Any, new: Any, entry: Changeable, allowed: tuple[Changeable, ...]) -> str | None:
    before, after = _as_map(old), _as_map(new)
    if before is None or after is None:
        return f"{dotted(entry.path)} is not a map: {only_changes(allowed)}"
    for key in sorted(set(before) | set(after), key=str):
        if not _same(before.get(key, MISSING), after.get(key, MISSING)) and not entry.allows_key(
            str(key)
        ):
            return f"{dotted(entry.path)}[{key}] changes: {only_changes(allowed)}"
    return None


def _same(old: Any, new: Any) -> bool:
    """Whether a value stays as stored: a stored null left out does (both decode to the zero
    value), but a null where nothing was stored does not — the apiserver stores it as its
    type's zero value, which is ``""`` in a map of strings (a label or annotation added)."""
    if new is MISSING:
        return old is MISSING or old is None
    if old is MISSING:
        return False
    return first_difference(old, new, opaque=()) is None


def _as_map(value: Any) -> dict[str, Any] | None:
    if value is MISSING or value is None:
        return {}
    return value if isinstance(value, dict) else None


def only_changes(allowed: tuple[Changeable, ...]) -> str:
    """What ``mayChange`` lets a write change, as a refusal says it."""
    shown = [
        f"{dotted(entry.path)}[{', '.join(entry.keys)}]" if entry.keys else dotted(entry.path)
        for entry in allowed
    ]
    return f"a write may change only {', '.join(shown)} (policy mayChange)"


def dotted(path: FieldPath) -> str:
    """``path`` as a refusal names it (``metadata.labels``; ``the object`` for the root)."""
    return ".".join(str(step) for step in path) or "the object"


# --- the comparison ------------------------------------------------------------------------------


def first_difference(
    stored: Any,
    proposed: Any,
    prefix: str = "",
    *,
    opaque: tuple[FieldPath, ...] | None = None,
    times: tuple[FieldPath, ...] = (),
    keys: FieldPath = (),
) -> str | None:
    """The first path (in ``stored``'s key order, then ``proposed``'s new keys) where the two
    differ, like ``status.allocation.devices.results[0].device``; None when equal.

    With ``opaque=None`` the comparison is exact JSON equality (``true`` is not ``1``). With
    a tuple of opaque paths it is by meaning, as the apiserver stores it, everywhere except
    under those paths (``keys`` is where ``stored`` sits, list indexes left out):

    - at one of the ``times`` paths (where the apiserver stores a time), a string in the
      apiserver's canonical time form and a string denoting the same instant at that
      precision are equal (:func:`same_instant`); every other string is compared exactly,
      so that a time written into, say, another driver's condition message cannot be
      re-spelled;
    - a key whose stored value is null and which the proposed object leaves out is unchanged
      (a null the proposed object adds is a change: the apiserver may store a zero value).

    Both are what the official Python client does when it re-sends an object it read (it
    writes ``+00:00`` times and drops null model attributes such as ``conditions: null``);
    client-go re-encodes with the apiserver's own Go types and so sends what it read.
    Under an opaque path (a RawExtension such as ``status.devices[].data``, kept byte for byte
    as sent, see recordings 180-181) every difference counts.
    """
    if stored == proposed and _json(stored) == _json(proposed):
        # Equal JSON (Python's == alone would take true for 1 and 1.0 for 1): done, without
        # walking the subtree.
        return None
    exact = opaque is None or any(keys[: len(path)] == path for path in opaque)
    if isinstance(stored, dict) and isinstance(proposed, dict):
        return _first_in_object(stored, proposed, prefix, exact, opaque, times, keys)
    if isinstance(stored, list) and isinstance(proposed, list):
        return _first_in_list(stored, proposed, prefix, opaque, times, keys)
    if type(stored) is type(proposed) and stored == proposed:
        return None
    if not exact and keys in times and isinstance(stored, str) and isinstance(proposed, str):
        return None if same_instant(stored, proposed) else prefix or "the object"
    return prefix or "the object"


def _first_in_object(
    stored: dict[str, Any],
    proposed: dict[str, Any],
    prefix: str,
    exact: bool,
    opaque: tuple[FieldPath, ...] | None,
    times: tuple[FieldPath, ...],
    keys: FieldPath,
) -> str | None:
    for key in [*stored, *(k for k in proposed if k not in stored)]:
        child = _child(prefix, key)
        if key not in proposed and stored[key] is None and not exact:
            continue  # null and absent decode alike into the apiserver's Go types
        if key not in stored or key not in proposed:
            return child
        found = first_difference(
            stored[key], proposed[key], child, opaque=opaque, times=times, keys=(*keys, str(key))
        )
        if found:
            return found
    return None


def _first_in_list(
    stored: list[Any],
    proposed: list[Any],
    prefix: str,
    opaque: tuple[FieldPath, ...] | None,
    times: tuple[FieldPath, ...],
    keys: FieldPath,
) -> str | None:
    for index in range(max(len(stored), len(proposed))):
        child = f"{prefix}[{index}]"
        if index >= len(stored) or index >= len(proposed):
            return child
        found = first_difference(
            stored[index], proposed[index], child, opaque=opaque, times=times, keys=keys
        )
        if found:
            return found
    return None


# RFC 3339 date-time as Go's time.RFC3339 parses it (upper-case T and Z, any fraction, ASCII
# digits only).
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))$",
    re.ASCII,
)
# The forms the apiserver serves: metav1.Time (whole seconds) and metav1.MicroTime, in UTC.
_CANONICAL_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", re.ASCII)
_CANONICAL_MICRO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$", re.ASCII)


def same_instant(stored: str, proposed: str) -> bool:
    """Whether ``proposed`` denotes the instant ``stored`` holds, as the apiserver stores it.

    Only when ``stored`` is in a form the apiserver serves its times in (``…:05Z``, or
    ``…:05.123456Z`` for MicroTime) and ``proposed`` parses as an RFC 3339 date-time: the
    apiserver stores a time in UTC at that precision, cutting finer digits (recordings
    186-187: ``2026-12-02T23:30:00.5+02:00`` is stored as ``2026-12-02T21:30:00Z``).
    Callers apply it only where the apiserver stores a time (the policy's ``times`` paths):
    elsewhere the apiserver keeps a string as sent, so a re-spelling is a change.
    """
    if _CANONICAL_MICRO.match(stored):
        unit = 1
    elif _CANONICAL_TIME.match(stored):
        unit = _MICROS
    else:
        return False
    want, got = _rfc3339_micros(stored), _rfc3339_micros(proposed)
    return want is not None and got is not None and got // unit * unit == want


_MICROS = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Year 0000 is valid RFC 3339 (and Go reads it) but below datetime's range: it is read 400 years
# on, one Gregorian cycle (146,097 days: the same calendar), and moved back.
_CYCLE_YEARS = 400
_CYCLE = timedelta(days=146_097)


def _rfc3339_micros(text: str) -> int | None:
    """Microseconds since the epoch (UTC) of an RFC 3339 date-time, digits past the
    microsecond cut; None if it is not one (no such day, hour 24, second 60, offset past 23:59).

    Arithmetic only: the policy package reads no clock (tests/policy/test_purity.py).
    """
    match = _RFC3339.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zulu, sign, off_hours, off_minutes = match.groups()[6:]
    offset = timedelta(0)
    if not zulu:
        if int(off_hours) > 23 or int(off_minutes) > 59:
            return None
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes))
        offset = -offset if sign == "-" else offset
    shift = _CYCLE_YEARS if year == 0 else 0
    try:
        moment = datetime(year + shift, month, day, hour, minute, second, tzinfo=timezone(offset))
    except ValueError:
        return None
    since = moment - _EPOCH - (_CYCLE if shift else timedelta(0))
    return since // _MICROSECOND + int((fraction or "").ljust(6, "0")[:6])


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _child(prefix: str, key: Any) -> str:
    text = str(key)
    if is_field_name(text):
        return f"{prefix}.{text}" if prefix else text
    return f"{prefix}[{json.dumps(text)}]"
