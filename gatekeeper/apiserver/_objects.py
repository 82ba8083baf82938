"""Object lifecycle rules of the embedded API server: what create, update and delete store.

Deliberate differences from the apiserver: little per-kind validation and no defaulting
runs (name rules, ``immutable_fields``, the ``status`` subresource split and the few typed
rules of ``_typed``), and a body whose ``apiVersion`` is
another served version of the kind is refused (400) instead of converted. ``managedFields``
are computed by ``_managed``; those sent by a client are ignored. ``generation`` is kept
for every kind but the built-in ones whose strategy sets none (``ServedKind.sets_generation``).
"""

from __future__ import annotations

import copy
import json
import secrets
from typing import Any, Final

from gatekeeper.apiserver._errors import APIError, bad_request, conflict, field_invalid, invalid
from gatekeeper.apiserver._json import deep, dumps, loads
from gatekeeper.apiserver._jsonpath import MISSING, get_field, parse_field_path
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import new_uid, now_timestamp

__all__ = [
    "check_type_meta",
    "decode_object",
    "generate_name",
    "mark_deleting",
    "metadata_of",
    "prepare_create",
    "prepare_update",
]

_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
_SYSTEM_META: Final = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def decode_object(body: bytes, kind: ServedKind) -> KubeObject:
    """A JSON object from a request body; 400 in the apiserver's words (recordings 22, 194)."""
    try:
        obj: Any = loads(body)
        if not isinstance(obj, dict):
            raise ValueError("cannot unmarshal a non-object into an object")
    except (ValueError, UnicodeDecodeError) as exc:
        text = body[:30].decode("utf-8", "replace") + (" ..." if len(body) > 30 else "")
        error = str(exc)
        if isinstance(exc, json.JSONDecodeError) and "Expecting" in str(exc):
            error = "unexpected end of JSON input"
        raise bad_request(
            f"the object provided is unrecognized (must be of type {kind.kind}): couldn't get "
            f"version/kind; json parse error: {error} ({text})"
        ) from None
    return obj


def metadata_of(obj: KubeObject) -> dict[str, Any]:
    """``obj["metadata"]`` if it is an object, else an empty dict."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def check_type_meta(obj: KubeObject, kind: ServedKind, version: str) -> None:
    """``apiVersion``/``kind`` must be the URL's (400 like recording 23)."""
    body_kind, body_version = obj.get("kind"), obj.get("apiVersion")
    if not isinstance(body_kind, str) or not body_kind:
        raise bad_request(f"Object 'Kind' is missing in '{dumps(obj)[:200]}'")
    if not isinstance(body_version, str) or not body_version:
        raise bad_request(f"Object 'apiVersion' is missing in '{dumps(obj)[:200]}'")
    if body_kind == kind.kind and body_version == kind.group_version(version):
        return
    short_version = body_version.rpartition("/")[2]
    internal = kind.group.split(".")[0] if kind.group else "core"
    raise bad_request(
        f'{body_kind} in version "{short_version}" cannot be handled as a {kind.kind}: '
        f"converting ({short_version}.{body_kind}) to ({internal}.{kind.kind}): unknown conversion"
    )


def generate_name(prefix: str) -> str:
    """``generateName`` + 5 random characters from the apiserver's alphabet."""
    return prefix[:58] + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))


def _check_name(kind: ServedKind, name: str) -> None:
    problem = ""
    if name in (".", ".."):
        problem = f"may not be '{name}'"
    elif "/" in name or "%" in name:
        problem = "may not contain '/'" if "/" in name else "may not contain '%'"
    elif len(name) > 253:
        problem = "must be no more than 253 characters"
    if problem:
        raise invalid(kind, name, [field_invalid("metadata.name", name, problem)])


def _namespace(kind: ServedKind, meta: dict[str, Any], namespace: str) -> str:
    body_ns = meta.get("namespace") or ""
    if not kind.namespaced:
        return ""
    if body_ns and body_ns != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    return namespace


def prepare_create(
    kind: ServedKind,
    version: str,
    namespace: str,
    obj: KubeObject,
    *,
    reset_status: bool,
    seeding: bool = False,
) -> KubeObject:
    """The object to store for a create: system metadata set, name generated if asked.

    ``reset_status`` drops ``.status`` for kinds with a status subresource, as the
    apiserver's strategies do on create. ``seeding``
    (:meth:`~gatekeeper.apiserver.server.APIServer.add`) keeps a given uid, creationTimestamp,
    generation and deletion fields and ignores a resourceVersion.
    """
    out = deep(copy.deepcopy, obj)
    meta = out.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = _created_name(kind, meta)
    if meta.get("resourceVersion") and not seeding:
        raise _internal_error("resourceVersion should not be set on objects to be created")
    kept = {k: meta[k] for k in _SYSTEM_META if seeding and k in meta}
    meta = {
        k: v
        for k, v in meta.items()
        if k not in ("resourceVersion", "managedFields", "selfLink", *_SYSTEM_META)
    }
    meta["name"] = name
    ns = _namespace(kind, meta, namespace)
    if ns:
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    generation = {"generation": 1} if kind.sets_generation else {}
    meta |= {"uid": new_uid(), **generation, "creationTimestamp": now_timestamp()} | kept
    if reset_status and "status" in kind.subresources:
        out.pop("status", None)
    if kind.status_always:
        out.setdefault("status", {})
    out["metadata"] = _ordered_meta(meta)
    return {
        "kind": kind.kind,
        "apiVersion": kind.group_version(kind.versions[0]),
        **{k: v for k, v in out.items() if k not in ("kind", "apiVersion")},
    }


def _created_name(kind: ServedKind, meta: dict[str, Any]) -> str:
    """The name a create stores: the given one, or one generated from ``generateName``."""
    name = str(meta.get("name") or "")
    if not name and meta.get("generateName"):
        name = generate_name(str(meta["generateName"]))
    if not name:
        cause = {
            "reason": "FieldValueRequired",
            "field": "metadata.name",
            "message": "Required value: name or generateName is required",
        }
        raise invalid(kind, "", [cause])
    _check_name(kind, name)
    return name


def _internal_error(message: str) -> APIError:
    """500 as the apiserver wraps an error that is not an API status."""
    body = status_body(
        500, f"Internal error occurred: {message}", details={"causes": [{"message": message}]}
    )
    return APIError(body)


_META_ORDER: Final = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def _ordered_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata keys in the order the apiserver serializes them."""
    head = {k: meta[k] for k in _META_ORDER if k in meta}
    return head | {k: v for k, v in meta.items() if k not in head}


def _spec_part(obj: KubeObject) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _differ(a: Any, b: Any) -> bool:
    return bool(a != b)


def _check_immutable(kind: ServedKind, version: str, old: KubeObject, new: KubeObject) -> None:
    causes = []
    for path in kind.immutable_fields.get(version, ()):
        parsed = parse_field_path(path)
        before, after = get_field(old, parsed), get_field(new, parsed)
        if before != after:
            shown = None if after is MISSING else after
            causes.append(field_invalid(path, shown, "field is immutable"))
    if causes:
        raise invalid(kind, str(old["metadata"]["name"]), causes)


def _check_preconditions(kind: ServedKind, stored: KubeObject, meta: dict[str, Any]) -> None:
    name = str(stored["metadata"]["name"])
    uid = meta.get("uid")
    if uid and uid != stored["metadata"].get("uid"):
        raise conflict(
            kind,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in "
            f"object meta: {stored['metadata'].get('uid')}",
        )
    rv = meta.get("resourceVersion")
    if rv and rv != stored["metadata"].get("resourceVersion"):
        raise conflict(
            kind,
            name,
            "the object has been modified; please apply your changes "
            "to the latest version and try again",
        )


def prepare_update(
    kind: ServedKind,
    version: str,
    namespace: str,
    name: str,
    stored: KubeObject,
    body: KubeObject,
    *,
    subresource: str,
) -> KubeObject:
    """The object an update (or a patch's result) stores; equal to ``stored`` for a no-op.

    An empty ``metadata.resourceVersion`` is unconditional; a stale one is 409. Through
    ``/status`` only ``.status`` changes; through the main resource ``.status`` is kept when
    the kind has a status subresource (recording 140).
    """
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    if meta.get("name", "") != name:
        raise bad_request(
            f"the name of the object ({meta.get('name', '')}) does not match the "
            f"name on the URL ({name})"
        )
    _namespace(kind, meta, namespace)
    _check_preconditions(kind, stored, meta)
    if subresource == "status":
        return _status_update(kind, stored, body)
    new_meta = {k: v for k, v in meta.items() if k not in ("managedFields", "selfLink")}
    for key in (*_SYSTEM_META, "namespace", "resourceVersion", "managedFields"):
        new_meta.pop(key, None)
        if key in stored["metadata"]:
            new_meta[key] = stored["metadata"][key]
    new = {k: v for k, v in deep(copy.deepcopy, body).items() if k not in ("kind", "apiVersion")}
    if "status" in kind.subresources:
        new.pop("status", None)
        if "status" in stored:
            new["status"] = stored["status"]
    new = {"kind": kind.kind, "apiVersion": stored["apiVersion"], **new}
    _check_immutable(kind, version, stored, new)
    if kind.sets_generation and deep(_differ, _spec_part(new), _spec_part(stored)):
        new_meta["generation"] = int(stored["metadata"].get("generation", 0)) + 1
    new["metadata"] = _ordered_meta(new_meta)
    return new


def _status_update(kind: ServedKind, stored: KubeObject, body: KubeObject) -> KubeObject:
    """Through ``/status`` only ``.status`` changes."""
    new = dict(stored)
    if "status" in body:
        new["status"] = deep(copy.deepcopy, body["status"])
    elif kind.status_always:
        new["status"] = {}
    else:
        new.pop("status", None)
    return new


def mark_deleting(stored: KubeObject) -> KubeObject:
    """An object with finalizers is not removed by delete: it gets a ``deletionTimestamp``
    (and ``deletionGracePeriodSeconds: 0``, generation + 1) the first time."""
    meta = dict(stored["metadata"])
    if not meta.get("deletionTimestamp"):
        meta["deletionTimestamp"] = now_timestamp()
        meta["deletionGracePeriodSeconds"] = 0
        if meta.get("generation"):  # as the apiserver's BeforeDelete does
            meta["generation"] = int(meta["generation"]) + 1
    return {**stored, "metadata": _ordered_meta(meta)}
