"""List options and list semantics: selectors, resourceVersion rules, ``limit``/``continue``.

Behaviour follows the recordings: a resourceVersion in the future waits briefly and then is
504 (recording 96), an ``Exact`` resourceVersion or a continue token older than the last
compaction is 410 (recordings 106, 107), continue tokens are the apiserver's base64 JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.apiserver._errors import APIError, bad_request, gone
from gatekeeper.apiserver._kinds import ServedKind, field_values
from gatekeeper.apiserver._routing import Target
from gatekeeper.apiserver._selectors import (
    FieldTerm,
    LabelTerm,
    SelectorError,
    field_selector_matches,
    label_selector_matches,
    parse_field_selector,
    parse_label_selector,
)
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import Store

__all__ = [
    "ListOptions",
    "decode_continue",
    "encode_continue",
    "list_objects",
    "matcher",
    "parse_list_options",
]

_TOO_OLD_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True, slots=True)
class ListOptions:
    """The list/watch query parameters the embedded API server honours."""

    fields: tuple[FieldTerm, ...] = ()
    labels: tuple[LabelTerm, ...] = ()
    limit: int = 0
    continue_token: str = ""
    resource_version: str = ""
    resource_version_match: str = ""
    watch: bool = False
    allow_bookmarks: bool = False
    send_initial_events: bool = False
    timeout_seconds: int | None = None


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f'invalid value for {name}: "{raw}" is not an integer') from None


def parse_list_options(query: Mapping[str, str], kind: ServedKind, version: str) -> ListOptions:
    """Validate selectors against the kind's selectable fields; 400 on anything malformed."""
    try:
        fields = parse_field_selector(query.get("fieldSelector", ""))
    except SelectorError as exc:
        raise bad_request(str(exc)) from None
    allowed = kind.field_paths(version)
    for req in fields:
        if req.field not in allowed:
            raise bad_request(kind.unsupported_field_message(version, req.field))
    try:
        labels = parse_label_selector(query.get("labelSelector", ""))
    except SelectorError as exc:
        raise bad_request(str(exc)) from None
    rv, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if match and match not in ("Exact", "NotOlderThan"):
        raise bad_request(
            f'resourceVersionMatch: Unsupported value: "{match}": supported '
            'values: "Exact", "NotOlderThan"'
        )
    if match and not rv and not _flag(query, "sendInitialEvents"):
        raise bad_request(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden "
            "unless resourceVersion is provided"
        )
    if rv and rv != "0":
        try:
            int(rv)
        except ValueError:
            raise bad_request(f'invalid resource version "{rv}"') from None
    limit = _int_param(query, "limit") or 0
    return ListOptions(
        fields=fields,
        labels=labels,
        limit=max(limit, 0),
        continue_token=query.get("continue", ""),
        resource_version=rv,
        resource_version_match=match,
        watch=_flag(query, "watch"),
        allow_bookmarks=_flag(query, "allowWatchBookmarks"),
        send_initial_events=_flag(query, "sendInitialEvents"),
        timeout_seconds=_int_param(query, "timeoutSeconds"),
    )


def matcher(target: Target, opts: ListOptions) -> Callable[[KubeObject], bool]:
    """A predicate: the object is in the target's namespace and passes both selectors."""

    def matches(obj: KubeObject) -> bool:
        meta = obj.get("metadata") or {}
        if target.namespace and meta.get("namespace", "") != target.namespace:
            return False
        if opts.fields and not field_selector_matches(
            opts.fields, field_values(target.kind, target.version, obj)
        ):
            return False
        return not opts.labels or label_selector_matches(opts.labels, meta.get("labels") or {})

    return matches


def encode_continue(rv: int, start: str) -> str:
    """The apiserver's continue token: unpadded URL-safe base64 of compact JSON."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """``(rv, start key)``; 400 ``continue key is not valid`` on anything malformed."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data: Any = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from None
    if (
        not isinstance(data, dict)
        or data.get("v") != "meta.k8s.io/v1"
        or not isinstance(data.get("rv"), int)
        or not isinstance(data.get("start"), str)
        or ".." in data["start"]
    ):
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        )
    return data["rv"], data["start"]


def _relative_key(target: Target, obj: KubeObject) -> str:
    meta = obj.get("metadata") or {}
    if target.namespace is None:
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return str(meta.get("name", ""))


def _too_large(rv: int, current: int) -> APIError:
    body = status_body(
        504,
        f"Timeout: Too large resource version: {rv}, current: {current}",
        details={
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )
    return APIError(body, {"Retry-After": "1"})


async def _list_state(
    store: Store, target: Target, opts: ListOptions, rv_wait: float
) -> tuple[list[KubeObject], int, str]:
    """The objects to page through, the list's resourceVersion, and the start key."""
    resource, ns = target.resource_key, target.namespace or None
    if opts.continue_token:
        if opts.resource_version and opts.resource_version != "0":
            raise bad_request("specifying resource version is not allowed when using continue")
        rv, start = decode_continue(opts.continue_token)
        start_key = start.removeprefix("/")
        if rv < 0:  # an "inconsistent" continuation: from the current state
            return store.items(resource, ns), store.current_rv, start_key
        if rv < store.floor or rv > store.current_rv:
            raise gone(_TOO_OLD_CONTINUE, encode_continue(-1, start_key))
        return store.snapshot(resource, rv, ns), rv, start_key
    if opts.resource_version in ("", "0"):
        return store.items(resource, ns), store.current_rv, ""
    rv = int(opts.resource_version)
    if rv > store.current_rv:
        wait = min(rv_wait, opts.timeout_seconds) if opts.timeout_seconds else rv_wait
        if not await store.wait_for_rv(rv, wait):
            raise _too_large(rv, store.current_rv)
    if opts.resource_version_match == "Exact":
        if rv < store.floor:
            raise gone("The resourceVersion for the provided list is too old.")
        return store.snapshot(resource, rv, ns), rv, ""
    return store.items(resource, ns), store.current_rv, ""


async def list_objects(
    store: Store, target: Target, opts: ListOptions, *, rv_wait: float = 3.0
) -> tuple[list[KubeObject], KubeObject]:
    """``(items, list metadata)`` for a list request (``limit``/``continue`` applied)."""
    objects, list_rv, start_key = await _list_state(store, target, opts, rv_wait)
    matches = matcher(target, opts)
    keyed = sorted(((_relative_key(target, obj), obj) for obj in objects), key=lambda pair: pair[0])
    selected = [(key, obj) for key, obj in keyed if key >= start_key and matches(obj)]
    meta: KubeObject = {"resourceVersion": str(list_rv)}
    if opts.limit and len(selected) > opts.limit:
        page, rest = selected[: opts.limit], selected[opts.limit :]
        meta["continue"] = encode_continue(list_rv, "/" + page[-1][0] + "\x00")
        if not opts.fields and not opts.labels:
            meta["remainingItemCount"] = len(rest)
        selected = page
    return [obj for _, obj in selected], meta
