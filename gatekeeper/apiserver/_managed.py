"""Field ownership (``metadata.managedFields``) and server-side apply, simply but faithfully.

Each manager entry (manager, operation ``Update`` or ``Apply``, subresource) owns a set of leaf
field paths. A write through create, update or patch (operation ``Update``) takes the fields it
changes from every other entry; an apply owns exactly the fields of its configuration, and is
409 when it would change a value another entry owns (recording 170: a POST and an apply by the
same manager name are different entries). Deliberate simplifications: lists are atomic (the
apiserver merges ``listType=map`` lists by key), only ``metadata.labels`` and
``metadata.annotations`` are tracked in metadata, apply is never forced, and the ``fieldsV1``
written is the apiserver's shape without its per-type ``"."`` markers (labels and annotations
aside).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

from gatekeeper.apiserver._errors import APIError
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import now_timestamp

__all__ = ["APPLY_OP", "UPDATE_OP", "apply_config", "manager_name", "owned_after"]

UPDATE_OP: Final = "Update"
APPLY_OP: Final = "Apply"
_UNTRACKED: Final = ("apiVersion", "kind", "metadata")
_MAPS: Final = ("labels", "annotations")

Path = tuple[str, ...]


def manager_name(field_manager: str, user_agent: str) -> str:
    """``fieldManager``, else the User-Agent's product (``kubectl/v1.32`` → ``kubectl``)."""
    return field_manager or user_agent.split("/", 1)[0].strip() or "unknown"


def _leaves(value: Any, prefix: Path) -> set[Path]:
    """Leaf paths under ``value`` (iterative: documents may nest 10,000 levels)."""
    out: set[Path] = set()
    stack: list[tuple[Path, Any]] = [(prefix, value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict) and node:
            stack.extend(((*path, key), child) for key, child in node.items())
        else:
            out.add(path)
    return out


def _tracked(obj: KubeObject, subresource: str, status_split: bool) -> set[Path]:
    """The paths an entry for ``subresource`` can own in ``obj``."""
    if subresource == "status":
        return _leaves(obj["status"], ("status",)) if "status" in obj else set()
    paths: set[Path] = set()
    for key, value in obj.items():
        if key in _UNTRACKED or (status_split and key == "status"):
            continue
        paths |= _leaves(value, (key,))
    meta = obj.get("metadata") or {}
    if subresource != "status" and isinstance(meta.get("generateName"), str):
        paths.add(("metadata", "generateName"))  # the apiserver tracks it (f:generateName)
    for name in _MAPS:
        if isinstance(meta.get(name), dict):
            paths |= {("metadata", name, key) for key in meta[name]}
    return paths


def _value(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


_ABSENT: Final = object()


def _is_leaf(obj: KubeObject, path: Path) -> bool:
    """``path`` is still a leaf of ``obj`` (present, and not an object with members)."""
    value = _value(obj, path)
    return value is not _ABSENT and not (isinstance(value, dict) and value)


def _fields_v1(paths: Iterable[Path], *, dotted_maps: bool) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for i, key in enumerate(path):
            if dotted_maps and i == 2 and path[0] == "metadata" and path[1] in _MAPS:
                node.setdefault(".", {})
            node = node.setdefault(f"f:{key}", {})
    return root


def _paths(fields: Any) -> set[Path]:
    out: set[Path] = set()
    stack: list[tuple[Path, Any]] = [((), fields)]
    while stack:
        path, node = stack.pop()
        children = {}
        if isinstance(node, dict):
            children = {k: v for k, v in node.items() if k.startswith("f:")}
        if not children and path:
            out.add(path)
        stack.extend(((*path, k[2:]), v) for k, v in children.items())
    return out


def _entry_key(entry: dict[str, Any]) -> tuple[str, str, str]:
    return (str(entry["manager"]), str(entry["operation"]), str(entry.get("subresource", "")))


def _entry(manager: str, op: str, api_version: str, paths: set[Path], sub: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": op,
        "apiVersion": api_version,
        "time": now_timestamp(),
        "fieldsType": "FieldsV1",
        "fieldsV1": _fields_v1(paths, dotted_maps=op == UPDATE_OP),
    }
    if sub:
        entry["subresource"] = sub
    return entry


def _owners(obj: KubeObject) -> list[tuple[dict[str, Any], set[Path]]]:
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return [(e, _paths(e.get("fieldsV1") or {})) for e in entries if isinstance(e, dict)]


def _overlaps(a: Path, b: Path) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def owned_after(
    old: KubeObject | None,
    new: KubeObject,
    *,
    manager: str,
    operation: str,
    api_version: str,
    subresource: str = "",
    status_split: bool = False,
    applied: set[Path] | None = None,
) -> list[dict[str, Any]]:
    """The ``managedFields`` of ``new`` after a write by ``manager``: an update takes the
    fields it changed from the other entries; an apply (``applied``: its configuration's
    paths) owns exactly those, sharing the ones others own with the same value."""
    paths = _tracked(new, subresource, status_split)
    if applied is None:
        before = set() if old is None else _tracked(old, subresource, status_split)
        taken = {p for p in paths if old is None or _value(old, p) != _value(new, p)}
        gone = before - paths
    else:
        taken, gone = applied, set()
    key = (manager, operation, subresource)
    result: list[dict[str, Any]] = []
    mine_at, mine = -1, set(taken)
    for entry, entry_paths in [] if old is None else _owners(old):
        kept = {p for p in entry_paths if p not in gone and _is_leaf(new, p)}
        if _entry_key(entry) == key:
            mine_at = len(result)
            if applied is None:
                mine |= kept
            if mine == entry_paths:
                result.append(entry)  # unchanged, its time too
            else:
                result.append(_entry(manager, operation, api_version, mine, subresource))
            continue
        if applied is None:
            kept = {p for p in kept if not any(_overlaps(p, t) for t in taken)}
        if kept == entry_paths:
            result.append(entry)
        elif kept:
            dotted = entry.get("operation") == UPDATE_OP
            result.append(dict(entry, fieldsV1=_fields_v1(kept, dotted_maps=dotted)))
    if mine_at < 0 and mine:
        result.append(_entry(manager, operation, api_version, mine, subresource))
    elif mine_at >= 0 and not mine:
        del result[mine_at]
    return sorted(result, key=_entry_order)


def _entry_order(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """The apiserver's order of entries: Apply before Update, then by time (to the second),
    manager and subresource (``sortEncodedManagedFields`` in k8s.io/apiserver)."""
    return (
        str(entry.get("operation", "")),
        str(entry.get("time") or ""),
        str(entry.get("manager", "")),
        str(entry.get("subresource", "")),
    )


def _conflict(conflicts: list[tuple[dict[str, Any], Path]]) -> APIError:
    def who(entry: dict[str, Any]) -> str:
        name = json.dumps(str(entry.get("manager")))
        if entry.get("subresource"):
            name += f" with subresource {json.dumps(entry['subresource'])}"
        if entry.get("operation") == UPDATE_OP:
            name += f" using {entry.get('apiVersion')}"
        return name

    shown = [(who(e), "." + ".".join(p)) for e, p in conflicts]
    if len(shown) == 1:
        message = f"Apply failed with 1 conflict: conflict with {shown[0][0]}: {shown[0][1]}"
    else:
        lines = []
        for manager in sorted({m for m, _ in shown}):
            lines.append(f"conflicts with {manager}:")
            lines += [f"- {p}" for m, p in shown if m == manager]
        message = f"Apply failed with {len(shown)} conflicts: " + "\n".join(lines)
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {m}", "field": p}
        for m, p in shown
    ]
    return APIError(status_body(409, message, reason="Conflict", details={"causes": causes}))


def _set(obj: dict[str, Any], path: Path, value: Any) -> None:
    node = obj
    for key in path[:-1]:
        child = node.get(key)
        node[key] = dict(child) if isinstance(child, dict) else {}
        node = node[key]
    node[path[-1]] = value


def _remove(obj: dict[str, Any], path: Path) -> None:
    node = obj
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return
        node[key] = dict(child)
        node = node[key]
    node.pop(path[-1], None)


def apply_config(
    live: KubeObject,
    config: KubeObject,
    *,
    manager: str,
    subresource: str = "",
    status_split: bool = False,
) -> tuple[KubeObject, set[Path]]:
    """``(the applied object, the configuration's paths)``; 409 on a conflict with another
    manager's field whose value the configuration changes."""
    wanted = _tracked(config, subresource, status_split)
    conflicts = []
    previous: set[Path] = set()
    others: set[Path] = set()
    for entry, entry_paths in _owners(live):
        if _entry_key(entry) == (manager, APPLY_OP, subresource):
            previous = entry_paths
            continue
        others |= entry_paths
        for path in sorted(wanted):
            if _value(live, path) == _value(config, path):
                continue
            clash = next((p for p in sorted(entry_paths) if _overlaps(p, path)), None)
            if clash is not None:
                conflicts.append((entry, path))
    if conflicts:
        raise _conflict(conflicts)
    out: dict[str, Any] = {k: v for k, v in live.items()}
    out["metadata"] = dict(live.get("metadata") or {})
    for path in sorted(previous - wanted):
        if not any(_overlaps(path, o) for o in others):
            _remove(out, path)
    for path in sorted(wanted):
        _set(out, path, _value(config, path))
    return out, wanted
