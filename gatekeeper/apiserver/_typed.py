"""What the apiserver's typed decoding and validation do to the DRA kinds it knows (pure).

The embedded API server stores plain JSON; these rules, keyed by group and resource (as the
printer columns in ``_render``), reproduce the few typed effects the recordings show:
timestamps served as UTC whole seconds (186, 187), device-status entries without conditions
served with ``"conditions": null`` (180-183), the 10,240-byte limit on opaque parameters
(190, 195) and numbers no Go number type holds (200). Other per-kind validation is not done.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

from gatekeeper.apiserver._errors import APIError, bad_request, invalid
from gatekeeper.apiserver._json import dumps, find_big_number
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._types import KubeObject

__all__ = ["check_numbers", "normalize", "validate"]

_GROUP: Final = "resource.k8s.io"
OPAQUE_PARAMETERS_MAX: Final = 10 * 1024
_CONFIG_LISTS: Final = {
    (_GROUP, "resourceclaims"): ("spec", "devices", "config"),
    (_GROUP, "resourceclaimtemplates"): ("spec", "spec", "devices", "config"),
    (_GROUP, "deviceclasses"): ("spec", "config"),
}
_MAP_FIELDS: Final = frozenset({"attributes", "capacity", "labels", "annotations"})
_GO_FIELDS: Final = {("attributes", "int"): ("DeviceAttribute", "int64")}


def _timestamp(value: Any) -> Any:
    """An RFC 3339 time as the apiserver serves it: UTC, whole seconds, ``Z``."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value  # a deliberate leniency: the apiserver would answer 400
    if parsed.tzinfo is None:
        return value
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(conditions: Any) -> Any:
    if not isinstance(conditions, list):
        return conditions
    return [
        {k: _timestamp(v) if k == "lastTransitionTime" else v for k, v in c.items()}
        if isinstance(c, dict)
        else c
        for c in conditions
    ]


def _device_status(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "data" and "conditions" not in entry:
            out["conditions"] = None  # a Go slice field without omitempty
        out[key] = _conditions(value) if key == "conditions" else value
    if "conditions" not in out:
        out["conditions"] = None
    return out


def normalize(kind: ServedKind, obj: KubeObject) -> KubeObject:
    """``obj`` as the apiserver would serve it back (a new dict; ``obj`` is not modified)."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {
            k: _timestamp(v) if k in ("creationTimestamp", "deletionTimestamp") else v
            for k, v in meta.items()
        }
    status = out.get("status")
    if isinstance(status, dict):
        status = dict(status)
        if "conditions" in status:
            status["conditions"] = _conditions(status["conditions"])
        devices = status.get("devices")
        if (kind.group, kind.resource) == (_GROUP, "resourceclaims") and isinstance(devices, list):
            status["devices"] = [_device_status(d) for d in devices]
        out["status"] = status
    return out


def _config_parameters(kind: ServedKind, obj: KubeObject) -> Iterator[tuple[str, Any]]:
    path = _CONFIG_LISTS.get((kind.group, kind.resource))
    node: Any = obj
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    if not path or not isinstance(node, list):
        return
    for i, item in enumerate(node):
        opaque = item.get("opaque") if isinstance(item, dict) else None
        if isinstance(opaque, dict) and "parameters" in opaque:
            yield f"{'.'.join(path)}[{i}].opaque.parameters", opaque["parameters"]


def validate(kind: ServedKind, obj: KubeObject) -> None:
    """422 for what the apiserver's validation of ``kind`` refuses and the recordings show."""
    causes = []
    for field, parameters in _config_parameters(kind, obj):
        if len(dumps(parameters).encode()) > OPAQUE_PARAMETERS_MAX:
            message = f"Too long: may not be more than {OPAQUE_PARAMETERS_MAX} bytes"
            causes.append({"reason": "FieldValueTooLong", "message": message, "field": field})
    if causes:
        raise invalid(kind, str((obj.get("metadata") or {}).get("name", "")), causes)


def check_numbers(kind: ServedKind, obj: KubeObject) -> None:
    """400 for a number literal no Go number type holds (``1e400``), in Go's words."""
    found = find_big_number(obj)
    if found is None:
        return
    path, number = found
    fields: list[str] = []
    for i, key in enumerate(path):
        if isinstance(key, str) and not (i > 0 and path[i - 1] in _MAP_FIELDS):
            fields.append(key)
    last_two = (fields[-2], fields[-1]) if len(fields) >= 2 else ("", "")
    struct, go_type = _GO_FIELDS.get(last_two, ("", "float64"))
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    where = f"Go struct field {struct}.{'.'.join(fields)}" if struct else "Go value"
    error: APIError = bad_request(
        f'{kind.kind} in version "{version}" cannot be handled as a {kind.kind}: json: cannot '
        f"unmarshal number {number.text} into {where} of type {go_type}"
    )
    raise error
