"""Resource handlers of the embedded API server: get, list/watch, create, update, patch, delete."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from gatekeeper.apiserver._delete import (
    check_delete_preconditions,
    delete_object,
    parse_delete_options,
)
from gatekeeper.apiserver._errors import (
    APIError,
    already_exists,
    bad_request,
    not_found,
    unknown_body_format,
)
from gatekeeper.apiserver._json import deep, dumps
from gatekeeper.apiserver._list import list_objects, parse_list_options
from gatekeeper.apiserver._managed import (
    APPLY_OP,
    UPDATE_OP,
    apply_config,
    manager_name,
    owned_after,
)
from gatekeeper.apiserver._negotiate import negotiate_object
from gatekeeper.apiserver._objects import (
    check_type_meta,
    decode_object,
    metadata_of,
    prepare_create,
    prepare_update,
)
from gatekeeper.apiserver._patch import APPLY, apply_patch, parse_patch
from gatekeeper.apiserver._render import render_list, render_object, versioned
from gatekeeper.apiserver._routing import Target
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._typed import check_numbers, normalize, validate
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver._watch import serve_watch
from gatekeeper.apiserver.store import Store, object_key

__all__ = ["Call", "handle_resource", "json_response", "method_not_allowed"]


@dataclass(frozen=True, slots=True)
class Call:
    """One request to a resource path, with what the handlers need from the server."""

    request: web.Request
    store: Store
    target: Target
    body: bytes
    rv_wait: float
    bookmark_interval: float

    @property
    def query(self) -> Mapping[str, str]:
        """Query parameters (the first value of each)."""
        return self.request.query

    @property
    def dry_run(self) -> bool:
        """``dryRun=All``; 400 for any other value."""
        values = self.request.query.getall("dryRun", [])
        for value in values:
            if value != "All":
                raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        return bool(values)

    @property
    def manager(self) -> str:
        """The field manager a write is recorded under."""
        agent = self.request.headers.get("User-Agent", "")
        return manager_name(self.query.get("fieldManager", ""), agent)

    def key(self, name: str | None = None) -> tuple[str, str]:
        """The store key of the addressed object."""
        return (self.target.namespace or "", name if name is not None else self.target.name)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """Compact JSON, ``Content-Type: application/json`` (the apiserver's framing)."""
    return web.Response(
        body=dumps(body).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def method_not_allowed() -> APIError:
    """405 as the apiserver words it."""
    body = status_body(405, "the server does not allow this method on the requested resource")
    return APIError({k: v for k, v in body.items() if k != "code"} | {"details": {}, "code": 405})


def _reply(call: Call, obj: KubeObject, status: int = 200) -> web.Response:
    neg = negotiate_object(call.request.headers.get("Accept", ""), collection=False)
    return json_response(render_object(call.target.kind, call.target.version, obj, neg), status)


def _body_media_type(call: Call) -> str:
    """The body's media type; 415 for one the embedded server does not read (protobuf, CBOR:
    it decodes JSON and YAML only, as the recordings' third session shows a real one refuse
    CBOR, and a custom resource never accepts protobuf)."""
    content_type = call.request.headers.get("Content-Type", "application/json")
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("application/json", "", "application/yaml"):
        raise unknown_body_format(call.target.kind, media)
    return media


def _decode_body(call: Call) -> KubeObject:
    media = _body_media_type(call)
    kind = call.target.kind
    if media in ("application/json", ""):
        obj = decode_object(call.body, kind)
    else:
        try:
            obj = yaml.safe_load(call.body.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise bad_request(f"error decoding YAML: {exc}") from None
        if not isinstance(obj, dict):
            raise bad_request("error decoding YAML: the object must be a mapping")
    check_type_meta(obj, kind, call.target.version)
    check_numbers(kind, obj)
    return obj


async def _get(call: Call) -> web.Response:
    stored = call.store.get(call.target.resource_key, call.key())
    if stored is None:
        raise not_found(call.target.kind, call.target.name)
    return _reply(call, stored)


async def _list_or_watch(call: Call) -> web.StreamResponse:
    target = call.target
    opts = parse_list_options(call.query, target.kind, target.version)
    accept = call.request.headers.get("Accept", "")
    neg = negotiate_object(accept, collection=not opts.watch)
    if opts.watch:
        return await serve_watch(
            call.request, call.store, target, opts, neg, bookmark_interval=call.bookmark_interval
        )
    items, meta = await list_objects(call.store, target, opts, rv_wait=call.rv_wait)
    return json_response(render_list(target.kind, target.version, items, meta, neg))


def _same(a: KubeObject, b: KubeObject) -> bool:
    return bool(a == b)


def _with_managed(
    call: Call,
    old: KubeObject | None,
    new: KubeObject,
    operation: str,
    applied: set[tuple[str, ...]] | None = None,
) -> KubeObject:
    target = call.target
    fields = deep(
        owned_after,
        old,
        new,
        manager=call.manager,
        operation=operation,
        api_version=target.kind.group_version(target.version),
        subresource=target.subresource,
        status_split="status" in target.kind.subresources,
        applied=applied,
    )
    meta = {k: v for k, v in new["metadata"].items() if k != "managedFields"}
    if fields:
        meta["managedFields"] = fields
    return {**new, "metadata": meta}


def _create_object(
    call: Call, obj: KubeObject, *, reset_status: bool, operation: str = UPDATE_OP
) -> KubeObject:
    target, store = call.target, call.store
    meta = metadata_of(obj)
    generated = not meta.get("name") and bool(meta.get("generateName"))
    for _ in range(8 if generated else 1):  # generateName collisions are retried, boundedly
        prepared = prepare_create(
            target.kind, target.version, target.namespace or "", obj, reset_status=reset_status
        )
        if store.get(target.resource_key, object_key(prepared)) is None:
            break
    else:
        raise already_exists(target.kind, prepared["metadata"]["name"])
    prepared = normalize(target.kind, prepared)
    validate(target.kind, prepared)
    prepared = _with_managed(call, None, prepared, operation)
    if call.dry_run:
        return prepared
    return store.create(target.resource_key, prepared)


async def _create(call: Call) -> web.Response:
    obj = _decode_body(call)
    return _reply(call, _create_object(call, obj, reset_status=True), 201)


def _commit(
    call: Call,
    stored: KubeObject,
    new: KubeObject,
    operation: str = UPDATE_OP,
    applied: set[tuple[str, ...]] | None = None,
) -> KubeObject:
    """Store an update unless it is a no-op or a dry run; removing the last finalizer of an
    object being deleted deletes it (answered at its last stored resourceVersion, as
    recording 159 shows)."""
    new = normalize(call.target.kind, new)
    validate(call.target.kind, new)
    new = _with_managed(call, stored, new, operation, applied)
    if deep(_same, new, stored):
        return stored
    if call.dry_run:
        return new
    meta = new["metadata"]
    if meta.get("deletionTimestamp") and not meta.get("finalizers"):
        call.store.delete(call.target.resource_key, call.key(), final=new)
        return new
    return call.store.replace(call.target.resource_key, new)


def _prepare_update(call: Call, stored: KubeObject, body: KubeObject) -> KubeObject:
    target = call.target
    return prepare_update(
        target.kind,
        target.version,
        target.namespace or "",
        target.name,
        stored,
        body,
        subresource=target.subresource,
    )


async def _update(call: Call) -> web.Response:
    body = _decode_body(call)
    target = call.target
    stored = call.store.get(target.resource_key, call.key())
    if stored is None:
        raise not_found(target.kind, target.name)
    return _reply(call, _commit(call, stored, _prepare_update(call, stored, body)))


def _field_manager_required() -> APIError:
    cause = {
        "reason": "FieldValueRequired",
        "message": "Required value: is required for apply patch",
        "field": "fieldManager",
    }
    return APIError(
        status_body(
            422,
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for '
            "apply patch",
            details={"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [cause]},
        )
    )


def _apply_create(call: Call, patch: KubeObject) -> web.Response:
    target = call.target
    meta = metadata_of(patch)
    if meta.get("name", "") != target.name:
        raise bad_request(
            f"the name of the object ({meta.get('name', '')}) does not match "
            f"the name on the URL ({target.name})"
        )
    # Apply creates a missing object and ignores a resourceVersion in the configuration,
    # as a real 1.36 apiserver does (recording 174).
    creating = {**patch, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    obj = _create_object(call, creating, reset_status=False, operation=APPLY_OP)
    return _reply(call, obj, 201)


def _apply(call: Call, stored: KubeObject, patch: KubeObject) -> web.Response:
    target = call.target
    live = versioned(target.kind, target.version, stored)
    merged, wanted = deep(
        apply_config,
        live,
        patch,
        manager=call.manager,
        subresource=target.subresource,
        status_split="status" in target.kind.subresources,
    )
    config_rv = (patch.get("metadata") or {}).get("resourceVersion")
    if config_rv:  # a resourceVersion in the configuration is a precondition
        merged["metadata"]["resourceVersion"] = config_rv
    new = _prepare_update(call, stored, merged)
    return _reply(call, _commit(call, stored, new, APPLY_OP, wanted))


async def _patch(call: Call) -> web.Response:
    target = call.target
    patch_type, patch = parse_patch(call.request.headers.get("Content-Type", ""), call.body)
    if patch_type == APPLY:
        if not call.query.get("fieldManager"):
            raise _field_manager_required()
        check_type_meta(patch, target.kind, target.version)
    stored = call.store.get(target.resource_key, call.key())
    if stored is None:
        if patch_type != APPLY or target.subresource:
            raise not_found(target.kind, target.name)
        return _apply_create(call, patch)
    if patch_type == APPLY:
        return _apply(call, stored, patch)
    result = apply_patch(patch_type, patch, versioned(target.kind, target.version, stored))
    check_numbers(target.kind, result)
    return _reply(call, _commit(call, stored, _prepare_update(call, stored, result)))


async def _delete(call: Call) -> web.Response:
    if call.body.strip():
        _body_media_type(call)
    options = parse_delete_options(call.body, call.request.query)
    target = call.target
    stored = call.store.get(target.resource_key, call.key())
    if stored is None:
        raise not_found(target.kind, target.name)
    check_delete_preconditions(target.kind, stored, options)
    obj, status = delete_object(call.store, target.resource_key, stored, options)
    return _reply(call, obj, status)


async def _delete_collection(call: Call) -> web.Response:
    target = call.target
    opts = parse_list_options(call.query, target.kind, target.version)
    if call.body.strip():
        _body_media_type(call)
    options = parse_delete_options(call.body, call.request.query)
    items, meta = await list_objects(call.store, target, opts, rv_wait=call.rv_wait)
    for item in items:
        delete_object(call.store, target.resource_key, item, options)
    neg = negotiate_object(call.request.headers.get("Accept", ""), collection=True)
    return json_response(render_list(target.kind, target.version, items, meta, neg))


async def handle_resource(call: Call) -> web.StreamResponse:
    """Dispatch on method and on whether the path names an object or a collection."""
    method, named = call.request.method, bool(call.target.name)
    if call.target.subresource and method not in ("GET", "PUT", "PATCH"):
        raise method_not_allowed()
    if method == "GET":
        return await (_get(call) if named else _list_or_watch(call))
    if method == "POST" and not named:
        return await _create(call)
    if method == "PUT" and named:
        return await _update(call)
    if method == "PATCH" and named:
        return await _patch(call)
    if method == "DELETE":
        return await (_delete(call) if named else _delete_collection(call))
    raise method_not_allowed()
