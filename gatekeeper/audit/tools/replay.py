"""Rebuild the engine's inputs for a recorded request: method, body, stored object, patch type.

The log never holds everything the proxy had. What is missing is reconstructed, and every
request says on what ``basis`` it was decided:

- ``request``: on the request alone: it needed no body and no stored object (a list, or a
  refusal of what the request names before either mattered);
- ``full``: the log had all the inputs (request body, and the stored object exactly: a get's own
  response, or the response of an earlier write of that object at RequestResponse level);
- ``reconstructed``: the stored object is rebuilt from an earlier request body in the log;
- ``metadata``: the body or stored object is not in the log (Metadata level, or an object first
  seen here). It is assumed to belong to the caller on that node, so only request-level rules
  (driver, kind, version, verb, scope, subresource, field selectors) are checked.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.audit.tools.reader import Record
from gatekeeper.codec.jsonpath import set_field
from gatekeeper.policy import Policy
from gatekeeper.policy.model import Field, KindRule
from gatekeeper.policy.patching import APPLY, JSON_PATCH, MERGE_PATCH
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import POD_UID_EXTRA, KubeObject

__all__ = ["BASES", "BODY_VERBS", "Inputs", "ObjectMemory", "method_of", "patch_type", "worst"]

BASES = ("request", "full", "reconstructed", "metadata")
"""From the most exact to the least: a request is decided on the worst basis of its inputs."""
_VERB_METHODS = {
    "get": "GET",
    "list": "GET",
    "watch": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
    "deletecollection": "DELETE",
}
BODY_VERBS = frozenset({"create", "update", "patch"})
"""Verbs whose decision depends on a request body."""
_NAME = ("metadata", "name")


def method_of(verb: str) -> str:
    """The HTTP method of a recorded verb (non-resource verbs are lower-case methods)."""
    return _VERB_METHODS.get(verb, verb.upper())


def patch_type(record: Record, body: Any, info: RequestInfo) -> str:
    """The patch's media type: recorded by the gatekeeper, else inferred from its shape."""
    if record.content_type:
        return record.content_type
    if isinstance(body, list):
        return JSON_PATCH
    if isinstance(body, dict) and "apiVersion" in body and info.query_value("fieldManager"):
        return APPLY
    # Strategic merge cannot be told from a merge patch in the log; the engine approximates
    # both with a merge patch when no upstream preview is at hand.
    return MERGE_PATCH


@dataclass(frozen=True, slots=True)
class Inputs:
    """What :meth:`Engine.decide` gets for one recorded request."""

    body: Any
    current: KubeObject | None
    media_type: str
    proposed: KubeObject | None
    basis: str


# Writes whose answer is what the apiserver stored (a dry run of one is answered alike).
_PREDICTED = frozenset({"patch", "create", "update"})
# Answers that are not the stored object: a Status, or a form of it asked for with ``Accept``.
_NOT_OBJECTS = (None, "Status", "Table", "PartialObjectMetadata", "PartialObjectMetadataList")


def _is_object(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("kind") not in _NOT_OBJECTS
        and isinstance(value.get("metadata"), dict)
    )


class ObjectMemory:
    """Stored objects seen so far in the log, by object path, with how exactly they are known."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._objects: dict[str, tuple[KubeObject, bool]] = {}

    def inputs(
        self, record: Record, info: RequestInfo, lookup: str | None, driver: str, node: str
    ) -> Inputs:
        """The engine's inputs for ``record``; ``lookup`` is the engine's fetch path (or None)."""
        body = record.request_object
        basis = "full"
        pod_uid = _pod_uid(record)
        if info.verb in BODY_VERBS and body is None:
            body, basis = self._assumed_body(record, info, driver, node, pod_uid), "metadata"
        media_type = patch_type(record, body, info) if info.verb == "patch" else "application/json"
        current: KubeObject | None = None
        if lookup is not None:
            current, known = self._current(record, info, lookup)
            if current is None and record.code != 404:
                current, known = self._owned(info, driver, node, pod_uid), "metadata"
            if current is not None:
                current = _aligned(current, body)
            basis = worst(basis, known)
        proposed = None
        if info.verb in _PREDICTED and record.code < 300 and _is_object(record.response_object):
            # What the apiserver stored: the answer a dry run of the write would have had.
            proposed = record.response_object
        return Inputs(body, current, media_type, proposed, basis)

    def remember(self, record: Record, info: RequestInfo) -> None:
        """Track the stored object after a request that succeeded (whatever the new policy)."""
        if record.code >= 300 or not info.is_resource_request:
            return
        path = _object_path(info)
        if info.verb == "delete":
            self._objects.pop(path, None)
            return
        if info.verb == "create":
            name = _name_of(record.response_object) or _name_of(record.request_object)
            path = f"{info.path}/{name}" if name else ""
        if not path or info.verb not in ("create", "update", "patch", "get"):
            return
        if _is_object(record.response_object):
            self._objects[path] = (record.response_object, True)
        elif info.verb in ("create", "update") and _is_object(record.request_object):
            self._objects[path] = (record.request_object, False)

    def _current(
        self, record: Record, info: RequestInfo, lookup: str
    ) -> tuple[KubeObject | None, str]:
        if info.verb == "get" and record.code < 300 and _is_object(record.response_object):
            return record.response_object, "full"
        known = self._objects.get(lookup)
        if known is not None:
            return known[0], "full" if known[1] else "reconstructed"
        if info.verb == "delete" and record.code < 300 and _is_object(record.response_object):
            return record.response_object, "full"
        # A 404 the first time the object is seen: it was not there.
        return None, "full"

    def _owned(
        self, info: RequestInfo, driver: str, node: str, pod_uid: str = ""
    ) -> KubeObject | None:
        """An object of the URL's kind and name that belongs to ``driver`` on ``node`` (the
        caller's own pod, of ``pod_uid``); None where no object can be assumed to be the
        caller's: one bound to it by a CEL scope, which only the object itself can show."""
        kind = self._policy.kind_for(info.api_group, info.resource, info.verb)
        version = kind.versions.get(info.api_version) if kind else None
        if kind is None or version is None or kind.rule is KindRule.CEL:
            return None
        api_version = f"{kind.group}/{info.api_version}" if kind.group else info.api_version
        uid = pod_uid if kind.rule is KindRule.OWN_POD and pod_uid else "assumed"
        metadata = {"name": info.name or node, "resourceVersion": "1", "uid": uid}
        if info.namespace:
            metadata["namespace"] = info.namespace
        obj: KubeObject = {"apiVersion": api_version, "kind": kind.kind, "metadata": metadata}
        wanted = {Field.DRIVER: driver, Field.NODE: node, Field.POOL: node}
        for fld, path in version.paths.items():
            if path != _NAME:
                set_field(obj, path, wanted[fld])
        if (allocation := version.allocation) is not None:
            # Allocated to the caller on this node, the way the scheduler writes it.
            result: KubeObject = {}
            set_field(result, allocation.result_driver, driver)
            set_field(obj, allocation.results, [result])
            term = {"key": "metadata.name", "operator": "In", "values": [node]}
            set_field(
                obj, allocation.node_selector, {"nodeSelectorTerms": [{"matchFields": [term]}]}
            )
        return obj

    def _assumed_body(
        self, record: Record, info: RequestInfo, driver: str, node: str, pod_uid: str
    ) -> Any:
        """A body the log does not hold: the caller's own object for a create or update; for
        a patch, one that changes nothing, in the patch's own type (a JSON patch is a list of
        operations, any other an object), so that the patch is decided on metadata."""
        if info.verb == "patch":
            return [] if patch_type(record, None, info) == JSON_PATCH else {}
        return self._owned(info, driver, node, pod_uid)


def _pod_uid(record: Record) -> str:
    """The uid of the pod a token caller's token was bound to ("" when none)."""
    user = record.token_user
    return (user.first_extra(POD_UID_EXTRA) or "") if user is not None else ""


def _object_path(info: RequestInfo) -> str:
    """The stored object's path (without a subresource)."""
    if info.subresource:
        return info.path[: -(len(info.subresource) + 1)]
    return info.path


def _aligned(current: KubeObject, body: Any) -> KubeObject:
    """``current`` with the resourceVersion/uid the request named: the log cannot show a
    concurrent change, so the replay does not invent a conflict. Likewise the managedFields an
    update restates, when ``current`` (rebuilt from a request body) shows none."""
    asked = _asked_preconditions(body)
    meta = current.get("metadata", {})
    restated = body.get("metadata") if isinstance(body, Mapping) else None
    managed = restated.get("managedFields") if isinstance(restated, Mapping) else None
    if isinstance(managed, list) and isinstance(meta, Mapping) and "managedFields" not in meta:
        asked["managedFields"] = managed
    if all(meta.get(key) == value for key, value in asked.items()):
        return current
    aligned = copy.deepcopy(current)
    aligned.setdefault("metadata", {}).update(asked)
    return aligned


def _asked_preconditions(body: Any) -> dict[str, Any]:
    asked: dict[str, Any] = {}
    if isinstance(body, list):
        for op in body:
            if (
                isinstance(op, dict)
                and op.get("op") == "test"
                and op.get("path") == "/metadata/resourceVersion"
                and isinstance(op.get("value"), str)
            ):
                asked["resourceVersion"] = op["value"]
        return asked
    if not isinstance(body, Mapping):
        return asked
    for source in (body.get("metadata"), body.get("preconditions")):
        if isinstance(source, Mapping):
            for key in ("resourceVersion", "uid"):
                if isinstance(source.get(key), str) and source[key]:
                    asked[key] = source[key]
    return asked


def _name_of(obj: Any) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        name = obj["metadata"].get("name")
        return name if isinstance(name, str) else ""
    return ""


def worst(first: str, second: str) -> str:
    """The less exact of two bases."""
    return BASES[max(BASES.index(first), BASES.index(second))]
