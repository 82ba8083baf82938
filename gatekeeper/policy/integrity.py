"""Write integrity, purely: the body checks, resourceVersion pins and preconditions that make
a write land only on the object that was checked (DESIGN §4.4); shared by every rule."""

from __future__ import annotations

import copy
import re
from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.policy.decision import Decision, allow, deny
from gatekeeper.policy.model import KindSpec
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule
from gatekeeper.types import KubeObject

__all__ = [
    "DELETE_OPTION_FIELDS",
    "body_shape",
    "checked_delete_options",
    "delete_options",
    "pin_delete",
    "pin_resource_version",
    "pinned_update",
    "requested_resource_version",
    "stale_conflict",
    "stored_resource_version",
]


def stored_resource_version(current: KubeObject) -> str:
    """The fetched object's ``metadata.resourceVersion`` ("" when absent)."""
    meta = current.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""


def body_shape(info: RequestInfo, kind: KindSpec, body: KubeObject | None) -> Decision | None:
    if not isinstance(body, dict):
        return deny(
            400, f"{info.verb} of {kind.qualified} needs a JSON object body", rule=Rule.BAD_BODY
        )
    expected = f"{kind.group}/{info.api_version}" if kind.group else info.api_version
    if body.get("apiVersion") != expected or body.get("kind") != kind.kind:
        return deny(
            400,
            f'body apiVersion/kind "{body.get("apiVersion")}"/"{body.get("kind")}" does not match '
            f'the URL ("{expected}"/"{kind.kind}")',
            rule=Rule.BAD_BODY,
        )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return deny(400, "metadata must be an object", rule=Rule.BAD_BODY)
    metadata = metadata or {}
    namespace = metadata.get("namespace")
    if namespace and namespace != info.namespace:
        return deny(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
            rule=Rule.BAD_BODY,
        )
    if info.name and metadata.get("name") != info.name:
        return deny(
            400,
            f"the name of the object ({metadata.get('name')}) does not match the name on the URL "
            f"({info.name})",
            rule=Rule.BAD_BODY,
        )
    return None


def pin_resource_version(body: KubeObject, resource_version: str) -> KubeObject:
    # SECURITY: DESIGN §4.4 — the check ran against the stored object; pinning its
    # resourceVersion makes a concurrent change fail with 409 instead of slipping past the check.
    if get_field(body, ("metadata", "resourceVersion")) == resource_version:
        return body
    pinned = copy.deepcopy(body)
    pinned.setdefault("metadata", {})["resourceVersion"] = resource_version
    return pinned


def requested_resource_version(body: Any) -> str:
    """The ``metadata.resourceVersion`` a client's body or patch asks for ("" when none)."""
    value = get_field(body, ("metadata", "resourceVersion"))
    return value if isinstance(value, str) else ""


def pinned_update(
    info: RequestInfo, kind: KindSpec, body: KubeObject, current: KubeObject
) -> Decision | KubeObject:
    """``body`` pinned to ``current``'s resourceVersion; 409 if the client asked for another."""
    stored_rv = stored_resource_version(current)
    if conflict := stale_conflict(info, kind, requested_resource_version(body), stored_rv):
        return conflict
    return pin_resource_version(body, stored_rv)


def stale_conflict(info: RequestInfo, kind: KindSpec, asked: str, stored: str) -> Decision | None:
    """409 when the client's resourceVersion is not the one the decision was made on.

    Forwarding it would let the write land on a version the gatekeeper never checked.
    """
    if not asked or asked == stored:
        return None
    return deny(
        409,
        "resourceVersion does not match the stored object",
        f'Operation cannot be fulfilled on {kind.qualified} "{info.name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        group=kind.group,
        kind=kind.resource,
        name=info.name,
    )


def pin_delete(
    info: RequestInfo,
    kind: KindSpec,
    body: KubeObject | None,
    current: KubeObject,
    reason: str = "stored object belongs to the driver on this node",
) -> Decision:
    """Allow the delete with the client's options (:func:`delete_options`) and preconditions on
    ``current``'s uid and resourceVersion; 409 when the client's own preconditions differ."""
    options = delete_options(info, kind, body)
    if isinstance(options, Decision):
        return options
    options.setdefault("kind", "DeleteOptions")
    options.setdefault("apiVersion", "v1")
    meta = current.get("metadata", {})
    preconditions = options.get("preconditions") or {}
    for key, stored in (("uid", meta.get("uid")), ("resourceVersion", meta.get("resourceVersion"))):
        asked = preconditions.get(key)
        if asked not in (None, "") and asked != stored:
            label = "UID" if key == "uid" else "ResourceVersion"
            return deny(
                409,
                "delete precondition does not match the stored object",
                f'Operation cannot be fulfilled on {kind.qualified} "{info.name}": Precondition '
                f"failed: {label} in precondition: {asked}, {label} in object meta: {stored}",
            )
        preconditions[key] = stored
    options["preconditions"] = preconditions
    # SECURITY: DESIGN §4.4 — the delete lands only on the object that was checked.
    return allow(reason, info, options)


DELETE_OPTION_FIELDS = frozenset(
    {
        "kind",
        "apiVersion",
        "gracePeriodSeconds",
        "preconditions",
        "orphanDependents",
        "propagationPolicy",
        "dryRun",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
    }
)
"""The fields of a meta/v1 DeleteOptions body."""

_OPTION_TYPES: dict[str, tuple[str, type]] = {
    "kind": ("string", str),
    "apiVersion": ("string", str),
    "gracePeriodSeconds": ("int64", int),
    "orphanDependents": ("bool", bool),
    "propagationPolicy": ("string", str),
    "ignoreStoreReadErrorWithClusterBreakingPotential": ("bool", bool),
}
_INT64 = re.compile(r"^[+-]?[0-9]+$")
_INT64_RANGE = range(-(2**63), 2**63)


def delete_options(info: RequestInfo, kind: KindSpec, body: Any) -> Decision | KubeObject:
    """The DeleteOptions the apiserver would act on, as a body to forward (a new dict).

    With a body the apiserver reads the options from the body alone and ignores the query
    (recordings 149 and 154: ``?dryRun=All`` or ``?propagationPolicy=Orphan`` beside a body
    change nothing), so the body is taken as it is (checked by
    :func:`checked_delete_options`). Without one it reads the query, whose options are
    carried into the body here: the gatekeeper always sends one (its preconditions), and a
    query option left behind would be ignored — a dry-run delete would really delete.
    """
    if body is not None:
        return checked_delete_options(info, kind, body)
    options: KubeObject = {}
    for key, value in info.query:
        if key == "dryRun":
            options["dryRun"] = [value]
        elif key == "propagationPolicy":
            options["propagationPolicy"] = value
        elif key == "orphanDependents":
            # requestinfo admits only the values Go's ParseBool and the apiserver agree on.
            options["orphanDependents"] = value.lower() not in ("0", "false")
        elif key == "gracePeriodSeconds":
            if not _INT64.match(value) or int(value) not in _INT64_RANGE:
                return deny(
                    400,
                    f'gracePeriodSeconds "{value}" is not an integer',
                    f'invalid value "{value}" for gracePeriodSeconds: must be an int64',
                    rule=Rule.BAD_QUERY,
                )
            options["gracePeriodSeconds"] = int(value)
    return options


def checked_delete_options(info: RequestInfo, kind: KindSpec, body: Any) -> Decision | KubeObject:
    """A copy of a client's DeleteOptions body, or 400 when it is not one: a JSON object whose
    keys are DeleteOptions fields of the right JSON types, ``kind`` (if given) DeleteOptions,
    ``apiVersion`` (if given) ``v1``, ``meta.k8s.io/v1`` or the request's own group version.
    """
    if not isinstance(body, dict):
        return deny(400, "a DeleteOptions body must be a JSON object", rule=Rule.BAD_BODY)
    for key, value in body.items():
        if key not in DELETE_OPTION_FIELDS:
            return deny(400, f'DeleteOptions has no field "{key}"', rule=Rule.BAD_BODY)
        if value is not None and (problem := _option_type_problem(key, value)):
            return deny(400, f"DeleteOptions.{key}: {problem}", rule=Rule.BAD_BODY)
    own = f"{kind.group}/{info.api_version}" if kind.group else info.api_version
    if body.get("kind") not in (None, "DeleteOptions"):
        return deny(400, f'body kind "{body["kind"]}" is not DeleteOptions', rule=Rule.BAD_BODY)
    if body.get("apiVersion") not in (None, "v1", "meta.k8s.io/v1", own):
        return deny(
            400,
            f'DeleteOptions apiVersion "{body["apiVersion"]}" is not meta.k8s.io/v1',
            rule=Rule.BAD_BODY,
        )
    return copy.deepcopy(body)


def _option_type_problem(key: str, value: Any) -> str | None:
    if key == "dryRun":
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return None
        return "must be a list of strings"
    if key == "preconditions":
        if not isinstance(value, dict):
            return "must be an object"
        for name, item in value.items():
            if name not in ("uid", "resourceVersion"):
                return f'Preconditions has no field "{name}"'
            if item is not None and not isinstance(item, str):
                return f"{name} must be a string"
        return None
    type_name, expected = _OPTION_TYPES[key]
    # bool is an int in Python, not in JSON: true is no gracePeriodSeconds.
    if isinstance(value, expected) and (expected is bool or not isinstance(value, bool)):
        return None
    return f"must be of type {type_name}"
