"""The requests a generated policy-test file is made of: the drivers' allowed requests as the
log shows them, one of each, with the object stored before each (what a case stores first).

Collected in the same pass as the policy (:meth:`Examples.tap`); memory grows with the distinct
requests (at most :data:`PER_KIND` of each verb and resource per node) and the objects the log
shows, not with its length.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.audit.tools.generate._observe import is_kind_object, object_path, remember
from gatekeeper.audit.tools.reader import Record
from gatekeeper.audit.tools.replay import method_of
from gatekeeper.codec.jsonpath import get_field
from gatekeeper.errors import Refusal
from gatekeeper.request.requestinfo import RequestInfo, parse_request
from gatekeeper.types import POD_NAME_EXTRA, KubeObject

__all__ = ["PER_KIND", "Example", "Examples", "Kind"]

PER_KIND = 10
"""Distinct requests of one verb, resource and version written per node; the others are
counted (a driver reads a claim per pod: the first ten show what the rest are)."""

_VOLATILE = frozenset({"resourceVersion", "timeout", "timeoutSeconds"})
"""Query parameters a client changes on every repetition of the same request (a watch)."""
Kind = tuple[str, str, str, str, str]
"""(verb, group, resource, subresource, version)."""


@dataclass(slots=True)
class Example:
    """One distinct allowed request, as first seen."""

    record: Record
    info: RequestInfo
    before: KubeObject | None
    """The object stored at the request's path just before it, as the log last showed it (the
    answer to an earlier request, or the body of an earlier write); None: the log shows none."""
    count: int = 1

    @property
    def kind(self) -> Kind:
        info = self.info
        return (info.verb, info.api_group, info.resource, info.subresource, info.api_version)

    @property
    def pod(self) -> str:
        """The pod the caller's token is bound to ("" for a socket caller or an unbound one)."""
        user = self.record.token_user
        return (user.first_extra(POD_NAME_EXTRA) or "") if user is not None else ""


@dataclass(slots=True)
class Examples:
    """The allowed requests of drivers in a log, by node: see the module."""

    by_node: dict[str, dict[tuple[Any, ...], Example]] = field(default_factory=dict)
    beyond: Counter[tuple[str, Kind]] = field(default_factory=Counter)
    """Distinct requests not kept (beyond :data:`PER_KIND`), by node and kind."""
    _kinds: Counter[tuple[str, Kind]] = field(default_factory=Counter)
    _stored: dict[str, KubeObject] = field(default_factory=dict)

    def tap(self, records: Iterable[Record]) -> Iterator[Record]:
        """``records`` as they are, each seen on its way."""
        for record in records:
            self._see(record)
            yield record

    def _see(self, record: Record) -> None:
        if record.decision != "allow" or record.driver is None or not record.node:
            return
        try:
            info = parse_request(method_of(record.verb), record.request_uri)
        except Refusal:
            return  # refused whatever the policy says: audit generate skips it too
        if not info.is_resource_request:
            return
        before = self._stored.get(object_path(info))
        remember(self._stored, record, info)
        seen = self.by_node.setdefault(record.node, {})
        key = _key(record, info)
        if (example := seen.get(key)) is not None:
            example.count += 1
            return
        example = Example(record, info, before)
        counted = (record.node, example.kind)
        self._kinds[counted] += 1
        if self._kinds[counted] > PER_KIND:
            self.beyond[counted] += 1
            return
        seen[key] = example

    def node(self) -> str | None:
        """The node whose requests the tests are made of: the one with the most kinds of
        request (a test file is one node's; other nodes' drivers do the same)."""
        if not self.by_node:
            return None
        return max(sorted(self.by_node), key=lambda node: len(self.by_node[node]))


def _key(record: Record, info: RequestInfo) -> tuple[Any, ...]:
    """What makes two requests the same case: all the request says, bodies aside (a driver
    rewrites the same object), and the name a create gives."""
    created = None
    if info.verb == "create" and is_kind_object(record.request_object):
        created = get_field(record.request_object, ("metadata", "name"))
    user = record.token_user
    pod = user.first_extra(POD_NAME_EXTRA) if user is not None else None
    caller = (record.driver, user.username if user is not None else "", pod)
    query = tuple(sorted((k, v) for k, v in info.query if k not in _VOLATILE))
    return (info.method, info.path, query, created, record.content_type, caller)
