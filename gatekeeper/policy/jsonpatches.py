"""JSON patches (RFC 6902) applied as the kube-apiserver applies them, and bounded as it bounds
them (DESIGN §4.4; docs/security.md, "What the apiserver will store").

The apiserver applies a JSON patch with evanphx/json-patch v4 (``gopkg.in/evanphx/json-patch.v4``
v4.13.0 in k8s.io/apiserver v0.36.3) to the stored object's JSON. Where that library departs
from the RFC, this follows it, so that the object the gatekeeper decides on is the one the
apiserver computes: ``add`` without a ``value`` adds null, ``replace`` of a missing object key
adds it, ``copy`` from a missing object key copies null, ``test`` of a missing or null member
against null passes, ``add`` cannot replace the whole document. Forms the library reads in
ways that are easy to get wrong are refused (422) instead, never guessed: a path that does not
start with ``/`` (the library drops its first segment), and an array index that is negative
(the library counts from the end) or not in canonical decimal form (``01``, ``+1``).

Bounds, checked before the patch is applied or as it goes, so that no patch costs the
gatekeeper more than the apiserver lets it cost there: at most :data:`MAX_OPERATIONS`
operations (the apiserver's ``maxJSONPatchOperations``, 413), at most :data:`MAX_COPY_BYTES`
bytes copied by ``copy`` operations together (its ``JSONPatchMaxCopyBytes``, counted before each
copy is made, 422), elements shifted by array inserts and removals within :data:`MAX_WORK`, and
no value nested deeper than :data:`~gatekeeper.codec.jsonbounds.MAX_OBJECT_DEPTH` (422).
"""

from __future__ import annotations

import re
from typing import Any

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, within_depth
from gatekeeper.policy.patching import PatchError
from gatekeeper.types import KubeObject

__all__ = ["MAX_COPY_BYTES", "MAX_OPERATIONS", "MAX_WORK", "apply_json_patch"]

MAX_OPERATIONS = 10_000
"""Operations in one JSON patch: the apiserver's ``maxJSONPatchOperations`` (413 past it)."""
MAX_COPY_BYTES = 3 * 1024 * 1024
"""Bytes that ``copy`` operations may add together: the apiserver's default
``JSONPatchMaxCopyBytes`` (evanphx/json-patch ``AccumulatedCopySizeLimit``), counted as Go
counts them, the compact JSON of each copied value."""
MAX_WORK = 16 * 1024 * 1024
"""Array elements that inserts and removals may shift, all operations together (each is a
memory move of the array's tail; an honest patch shifts a few hundred)."""

_INDEX = re.compile(r"0|[1-9][0-9]*")
_ESCAPE = re.compile(r"~[01]")
# Go's encoder writes <, > and & as \\u003c, \\u003e, \\u0026 and U+2028/9 as \\u2028/9.
_HTML = (b"<", b">", b"&")
_SEPARATORS = ("\u2028".encode(), "\u2029".encode())
_MISSING_PATH = "doc is missing path"

_Container = dict[str, Any] | list[Any]


def apply_json_patch(document: KubeObject, patch: Any) -> KubeObject:
    """The object the apiserver would compute from ``document`` and ``patch``; PatchError with
    the apiserver's code otherwise (400 not a patch, 413 too many operations, 422 does not
    apply or past a bound). Neither input is modified."""
    if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
        raise PatchError(
            "json: cannot unmarshal the body into Go value of type jsonpatch.Patch", 400
        )
    if len(patch) > MAX_OPERATIONS:
        raise PatchError(
            f"The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {len(patch)}",
            413,
        )
    try:
        state = _State(_copy(document))
        for op in patch:
            state.apply(op)
    except PatchError:
        raise
    except (RecursionError, TypeError, ValueError) as exc:
        # Values moved deeper than a copy can encode, or a stored object the gatekeeper read
        # past its depth limit: refused, never a crash.
        why = f"the JSON patch cannot be applied within the gatekeeper's bounds: {exc}"
        raise PatchError(why) from None
    result = state.doc
    if not isinstance(result, dict):
        raise PatchError("the JSON patch does not leave an object")
    if not within_depth(result, MAX_OBJECT_DEPTH):
        raise PatchError(
            f"the JSON patch nests the object more than {MAX_OBJECT_DEPTH} levels deep"
        )
    return result


class _State:
    """One application: the document so far and what the operations have cost."""

    __slots__ = ("copied", "doc", "work")

    def __init__(self, doc: Any) -> None:
        self.doc = doc
        self.copied = 0
        self.work = 0

    def apply(self, op: dict[str, Any]) -> None:
        kind = op.get("op")
        if kind == "add":
            self._add(_path(op, "path"), op.get("value"))
        elif kind == "remove":
            parent, key = self._find(_path(op, "path"), "remove")
            self._remove(parent, key, "remove")
        elif kind == "replace":
            self._replace(op)
        elif kind == "move":
            parent, key = self._find(_path(op, "from"), "move", "from path")
            value = self._get(parent, key, "move")
            self._remove(parent, key, "move")
            self._add(_path(op, "path"), value, copy=False)
        elif kind == "copy":
            self._copy_op(op)
        elif kind == "test":
            self._test(op)
        else:
            raise PatchError(f"Unexpected kind: {kind if isinstance(kind, str) else 'unknown'}")

    def _find(self, path: str, what: str, which: str = "path") -> tuple[_Container, str]:
        """The container of ``path``'s last token and that token, as evanphx's findObject
        walks: every step must be an object or an array (null is missing)."""
        if "/" not in path:
            raise PatchError(f'{what} operation does not apply: {_MISSING_PATH}: "{path}"')
        if not path.startswith("/"):
            raise PatchError(
                f'{what} operation {which} "{path}" does not start with "/" (the apiserver would '
                "drop its first segment)"
            )
        *parts, last = path[1:].split("/")
        node: Any = self.doc
        for part in parts:
            node = _child(node, _unescape(part)) if isinstance(node, dict | list) else None
            if not isinstance(node, dict | list):
                raise PatchError(f'{what} operation does not apply: {_MISSING_PATH}: "{path}"')
        if not isinstance(node, dict | list):
            raise PatchError(f'{what} operation does not apply: {_MISSING_PATH}: "{path}"')
        return node, _unescape(last)

    def _get(self, parent: _Container, key: str, what: str) -> Any:
        if isinstance(parent, dict):
            return parent.get(key)  # a missing member reads as null, as in Go
        return parent[_index(key, len(parent) - 1, what)]

    def _add(self, path: str, value: Any, *, copy: bool = True) -> None:
        parent, key = self._find(path, "add")
        value = self._bounded(value, path) if copy else value
        if isinstance(parent, dict):
            parent[key] = value
        elif key == "-":
            parent.append(value)
        else:
            index = _index(key, len(parent), "add")
            self._shift(len(parent) - index)
            parent.insert(index, value)

    def _remove(self, parent: _Container, key: str, what: str) -> None:
        if isinstance(parent, dict):
            if key not in parent:
                raise PatchError(f"Unable to remove nonexistent key: {key}: missing value")
            del parent[key]
            return
        index = _index(key, len(parent) - 1, what)
        self._shift(len(parent) - index)
        del parent[index]

    def _replace(self, op: dict[str, Any]) -> None:
        path, value = _path(op, "path"), op.get("value")
        if path == "":
            if not isinstance(value, dict | list):
                raise PatchError("replace operation value must be object or array")
            self.doc = self._bounded(value, path)
            return
        parent, key = self._find(path, "replace")
        if isinstance(parent, dict):
            parent[key] = self._bounded(value, path)  # a missing member is added, as in Go
        else:
            parent[_index(key, len(parent) - 1, "replace")] = self._bounded(value, path)

    def _copy_op(self, op: dict[str, Any]) -> None:
        parent, key = self._find(_path(op, "from"), "copy", "from path")
        value = self._get(parent, key, "copy")
        path = _path(op, "path")
        self._find(path, "copy")  # the destination's container exists before anything is copied
        # SECURITY: docs/security.md "What the apiserver will store" — each copy is counted
        # before it is made and refused at the apiserver's own limit: 30 doubling copies never
        # hold more than it lets them (strings, immutable, are shared rather than copied).
        self.copied += _go_size(jsoncodec.dumps(value)) if value is not None else 0
        if self.copied > MAX_COPY_BYTES:
            raise PatchError(
                "Unable to complete the copy, the accumulated size increase of copy is "
                f"{self.copied}, exceeding the limit {MAX_COPY_BYTES}"
            )
        copied = _shared_copy(value, _room(path))
        if copied is _TOO_DEEP:
            raise PatchError(_too_deep(path))
        self._add(path, copied, copy=False)

    def _test(self, op: dict[str, Any]) -> None:
        path = _path(op, "path")
        if path == "":
            found: Any = self.doc
        else:
            parent, key = self._find(path, "test")
            found = self._get(parent, key, "test")
        if found is None:
            passed = op.get("value") is None
        else:
            passed = "value" in op and _equal(found, op["value"])
        if not passed:
            raise PatchError(f"testing value {path} failed: test failed")

    def _bounded(self, value: Any, path: str) -> Any:
        """A private copy of a value from the patch (the patch is forwarded as sent)."""
        if not isinstance(value, dict | list):
            return value
        return self._deep_enough(jsoncodec.loads(jsoncodec.dumps(value)), path)

    def _deep_enough(self, value: Any, path: str) -> Any:
        if isinstance(value, dict | list) and not within_depth(value, _room(path)):
            raise PatchError(_too_deep(path))
        return value

    def _shift(self, elements: int) -> None:
        self.work += elements
        if self.work > MAX_WORK:
            raise PatchError(
                f"the JSON patch shifts more than {MAX_WORK} array elements in all: it is refused "
                "before it costs more"
            )


def _path(op: dict[str, Any], name: str) -> str:
    value = op.get(name)
    if not isinstance(value, str):
        raise PatchError(f"operation missing {name} field: missing value")
    return value


def _child(node: _Container, token: str) -> Any:
    if isinstance(node, dict):
        return node.get(token)
    if _INDEX.fullmatch(token) and int(token) < len(node):
        return node[int(token)]
    _check_index(token)
    return None


def _index(token: str, last: int, what: str) -> int:
    """An array index ``0..last`` in canonical decimal form; 422 otherwise."""
    _check_index(token)
    index = int(token) if _INDEX.fullmatch(token) else -1
    if not 0 <= index <= last:
        raise PatchError(f"error in {what}: Unable to access invalid index: {token}")
    return index


def _check_index(token: str) -> None:
    if re.fullmatch(r"[+-]?[0-9]+", token) and not _INDEX.fullmatch(token):
        raise PatchError(
            f'array index "{token}" is not a plain decimal index: the gatekeeper does not apply '
            "negative indexes or indexes with a sign or leading zeros (the apiserver reads them "
            "in ways of its own)"
        )


def _unescape(token: str) -> str:
    # One pass, ~1 then ~0 at each position (Go's strings.NewReplacer): "~01" is "~1".
    return _ESCAPE.sub(lambda m: "/" if m.group() == "~1" else "~", token)


def _copy(document: Any) -> Any:
    return jsoncodec.loads(jsoncodec.dumps(document))


_TOO_DEEP = object()


def _room(path: str) -> int:
    """How many levels a value added at ``path`` may nest."""
    return max(MAX_OBJECT_DEPTH - path.count("/"), 0)


def _too_deep(path: str) -> str:
    return f'the value at "{path}" would nest the object more than {MAX_OBJECT_DEPTH} levels deep'


def _shared_copy(value: Any, room: int) -> Any:
    """A copy of ``value``'s containers, its scalars (immutable) shared, made iteratively;
    :data:`_TOO_DEEP` when it nests more than ``room`` levels."""
    holder: list[Any] = [None]
    pending: list[tuple[Any, Any, Any, int]] = [(value, holder, 0, 1)]
    while pending:
        item, parent, key, depth = pending.pop()
        if isinstance(item, dict | list) and depth > room:
            return _TOO_DEEP
        if isinstance(item, dict):
            copied: Any = dict.fromkeys(item)
            pending.extend((child, copied, name, depth + 1) for name, child in item.items())
        elif isinstance(item, list):
            copied = [None] * len(item)
            pending.extend((child, copied, index, depth + 1) for index, child in enumerate(item))
        else:
            copied = item
        parent[key] = copied
    return holder[0]


def _go_size(encoded: bytes) -> int:
    """The length of Go's json.Marshal of the value ``encoded`` holds (it escapes <, >, & and
    the two line separators, which orjson writes as they are)."""
    extra = 5 * sum(map(encoded.count, _HTML)) + 3 * sum(map(encoded.count, _SEPARATORS))
    return len(encoded) + extra


def _equal(stored: Any, value: Any) -> bool:
    """``test`` equality: JSON values of the same type (``1`` is neither ``1.0`` nor ``true``,
    which Go's byte comparison keeps apart too)."""
    if isinstance(stored, dict):
        return (
            isinstance(value, dict)
            and stored.keys() == value.keys()
            and all(_equal(stored[key], value[key]) for key in stored)
        )
    if isinstance(stored, list):
        return (
            isinstance(value, list)
            and len(stored) == len(value)
            and all(_equal(a, b) for a, b in zip(stored, value, strict=True))
        )
    return type(stored) is type(value) and stored == value
