"""Read audit logs: the gatekeeper's and the kube-apiserver's, plain, gzipped or stdin.

Both are ``audit.k8s.io/v1`` Event JSON lines (a webhook-style ``EventList`` line is expanded).
A record is one finished request: its ``ResponseComplete`` (or ``Panic``) event.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, cast

from gatekeeper.audit.event import (
    CONTENT_TYPE_ANNOTATION,
    DECISION_ANNOTATION,
    REASON_ANNOTATION,
)
from gatekeeper.errors import ConfigError
from gatekeeper.types import DRIVERS_GROUP, NODE_NAME_EXTRA, UserInfo

__all__ = [
    "FINAL_STAGES",
    "ReadStats",
    "Record",
    "decision_of",
    "iter_events",
    "iter_records",
    "open_log",
    "parse_driver_users",
    "resource_key",
    "to_record",
]

FINAL_STAGES = frozenset({"ResponseComplete", "Panic"})
_GZIP_MAGIC = b"\x1f\x8b"
_DECODER = json.JSONDecoder()


@dataclass(slots=True)
class ReadStats:
    """What the reader saw besides records."""

    lines: int = 0
    events: int = 0
    malformed: int = 0
    first_malformed: str = ""


@dataclass(frozen=True, slots=True)
class Record:
    """One finished request, from either log format."""

    audit_id: str
    source: str
    """``gatekeeper`` (user in the drivers group) or ``apiserver``."""
    username: str
    driver: str | None
    """The driver: the gatekeeper's username, or the ``--driver-user`` mapping (else None)."""
    node: str
    transport: str
    verb: str
    request_uri: str
    object_ref: Mapping[str, str]
    code: int
    decision: str
    """``allow`` or ``forbid`` (inferred from the status code when not annotated)."""
    reason: str
    received: str
    completed: str
    level: str
    content_type: str = ""
    request_object: Any = None
    response_object: Any = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    impersonated: bool = False
    """The kube-apiserver served it as another user (``impersonatedUser``): the caller sent
    ``Impersonate-*`` headers."""
    token_user: UserInfo | None = None
    """A token caller as the apiserver reviewed it (what CEL reads as ``request.userInfo``):
    rebuilt from the gatekeeper's event's peer facts, or the kube-apiserver's event's own user
    when that is a ServiceAccount (the token the driver would show the token listener); None
    for a socket or certificate caller."""

    @property
    def resource_key(self) -> str:
        """``resourceslices.resource.k8s.io[/status]``, or the path of a non-resource request."""
        return resource_key(self.object_ref, self.request_uri)


def resource_key(object_ref: Mapping[str, str] | None, request_uri: str) -> str:
    if not object_ref:
        return request_uri.split("?", 1)[0]
    resource = object_ref.get("resource", "")
    group = object_ref.get("apiGroup", "")
    key = f"{resource}.{group}" if group else resource
    sub = object_ref.get("subresource")
    return f"{key}/{sub}" if sub else key


def parse_driver_users(pairs: Iterable[str]) -> dict[str, str]:
    """``USER=DRIVER`` flags → {user: driver}; ConfigError on a malformed one."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        user, sep, driver = pair.partition("=")
        if not sep or not user or not driver:
            raise ConfigError(f"--driver-user {pair!r} must be USER=DRIVER")
        mapping[user] = driver
    return mapping


def open_log(path: str) -> IO[bytes]:
    """A binary stream of ``path`` (``-`` is stdin); gzip is detected by its magic bytes."""
    if path == "-":
        raw: IO[bytes] = io.BufferedReader(cast("io.RawIOBase", sys.stdin.buffer))
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def iter_events(paths: Iterable[str], stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Every Event in ``paths``, in order; unparseable lines are counted, not fatal."""
    stats = stats if stats is not None else ReadStats()
    decode = _DECODER.decode
    for path in paths:
        stream = open_log(path)
        try:
            for line in stream:
                stats.lines += 1
                try:
                    doc = decode(line.decode())
                except ValueError:  # UnicodeDecodeError included
                    doc = None
                if type(doc) is dict and "verb" in doc and doc.get("kind") != "EventList":
                    stats.events += 1  # the fast path: one Event per line
                    yield doc
                elif line.strip():
                    yield from _events_of(doc, path, stats)
        except (OSError, EOFError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from exc
        finally:
            if path != "-":
                stream.close()


def _events_of(doc: Any, path: str, stats: ReadStats) -> Iterator[dict[str, Any]]:
    if isinstance(doc, dict) and doc.get("kind") == "EventList":
        items = doc.get("items")
        docs: list[Any] = items if isinstance(items, list) else []
    else:
        docs = [doc]
    for item in docs:
        if isinstance(item, dict) and isinstance(item.get("verb"), str):
            stats.events += 1
            yield item
        else:
            stats.malformed += 1
            if not stats.first_malformed:
                stats.first_malformed = f"{path}: line {stats.lines}"


def decision_of(event: Mapping[str, Any]) -> tuple[str, str]:
    """(``allow``|``forbid``, reason) from the annotations, else from the status code."""
    annotations = event.get("annotations") or {}
    decision = annotations.get(DECISION_ANNOTATION)
    reason = annotations.get(REASON_ANNOTATION, "")
    if decision in ("allow", "forbid"):
        return decision, reason
    code = (event.get("responseStatus") or {}).get("code", 0)
    if code in (401, 403):
        message = (event.get("responseStatus") or {}).get("message", "")
        return "forbid", reason or message or f"HTTP {code}"
    return "allow", reason


def to_record(event: Mapping[str, Any], driver_users: Mapping[str, str]) -> Record:
    """The Record of one final-stage event."""
    user = event.get("user") or {}
    username = str(user.get("username", ""))
    extra = user.get("extra") or {}
    gatekeeper = DRIVERS_GROUP in (user.get("groups") or ())
    driver = username if gatekeeper else driver_users.get(username)
    decision, reason = decision_of(event)
    annotations = event.get("annotations") or {}
    return Record(
        audit_id=str(event.get("auditID", "")),
        source="gatekeeper" if gatekeeper else "apiserver",
        username=username,
        driver=driver,
        node=_first(extra.get(NODE_NAME_EXTRA)),
        transport=_first(extra.get("dra-gatekeeper.io/transport")),
        verb=str(event.get("verb", "")),
        request_uri=str(event.get("requestURI", "")),
        object_ref=event.get("objectRef") or {},
        code=int((event.get("responseStatus") or {}).get("code", 0) or 0),
        decision=decision,
        reason=reason,
        received=str(event.get("requestReceivedTimestamp", "")),
        completed=str(event.get("stageTimestamp", "")),
        level=str(event.get("level", "")),
        content_type=annotations.get(CONTENT_TYPE_ANNOTATION, ""),
        request_object=event.get("requestObject"),
        response_object=event.get("responseObject"),
        annotations=annotations,
        impersonated=bool(event.get("impersonatedUser")),
        token_user=_token_user(extra) if gatekeeper else _service_account_user(user),
    )


_PEER = "dra-gatekeeper.io/peer-"
_SERVICE_ACCOUNT = "system:serviceaccount:"
# Peer facts of a token caller → the TokenReview extra they came from.
_TOKEN_EXTRAS = {
    "podName": "authentication.kubernetes.io/pod-name",
    "podUID": "authentication.kubernetes.io/pod-uid",
    "nodeName": NODE_NAME_EXTRA,
    "credentialID": "authentication.kubernetes.io/credential-id",
}


def _token_user(extra: Mapping[str, Any]) -> UserInfo | None:
    """The reviewed user of a token caller: its ServiceAccount, the groups the apiserver gives
    every ServiceAccount token, and the extras the event kept."""
    username = _first(extra.get(f"{_PEER}serviceAccount"))
    if _first(extra.get("dra-gatekeeper.io/transport")) != "token" or not username:
        return None
    namespace = username.split(":")[2] if username.count(":") == 3 else ""
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
              "system:authenticated")  # fmt: skip
    extras = {
        key: (value,)
        for fact, key in _TOKEN_EXTRAS.items()
        if (value := _first(extra.get(f"{_PEER}{fact}")))
    }
    uid = _first(extra.get(f"{_PEER}serviceAccountUID"))
    return UserInfo(username, uid, groups, extras)


def _service_account_user(user: Mapping[str, Any]) -> UserInfo | None:
    """A kube-apiserver event's user, when it is a ServiceAccount: the apiserver authenticated
    its token, so this is what a TokenReview of the same token says."""
    username = user.get("username")
    if not isinstance(username, str) or not username.startswith(_SERVICE_ACCOUNT):
        return None
    groups = tuple(str(group) for group in user.get("groups") or ())
    raw = user.get("extra") or {}
    extra = {
        str(key): tuple(str(value) for value in values)
        for key, values in (raw.items() if isinstance(raw, Mapping) else ())
        if isinstance(values, list)
    }
    return UserInfo(username, str(user.get("uid", "")), groups, extra)


def iter_records(
    paths: Iterable[str], driver_users: Mapping[str, str], stats: ReadStats | None = None
) -> Iterator[Record]:
    """Every finished request in ``paths`` as a Record."""
    for event in iter_events(paths, stats):
        if event.get("stage") in FINAL_STAGES:
            yield to_record(event, driver_users)


def _first(values: Any) -> str:
    if isinstance(values, list) and values:
        return str(values[0])
    return str(values) if isinstance(values, str) else ""
