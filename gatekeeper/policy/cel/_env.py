"""The CEL environments: the typed declarations an expression is checked against when the policy
loads, and the one runtime every checked expression is evaluated in.

The checker sees every name with its type: the built-in ``variables`` (``variables.node`` a
string; ``variables.pod`` a string or null), the fields of ``request`` (an AdmissionRequest),
the policy's own variables with the type their expression checks to, and ``object`` and
``oldObject`` as ``dyn`` (objects stay JSON). CEL resolves ``variables.node`` as one qualified
name, so a misspelt variable or field, ``variables.node + 6`` and a validation that gives a
string are load errors. The checked expression is then moved into a runtime environment that
declares nothing: every value is converted by its Python type, as JSON gives it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from gatekeeper.policy.cel._ast import CelType, Checked, Node, NodeKind, read_checked

__all__ = [
    "BUILT_INS",
    "NULLABLE_STRING",
    "OBJECT_ROOTS",
    "REQUEST_FIELDS",
    "CheckError",
    "check",
    "declarations",
    "globals_of",
    "runtime_env",
    "signature",
]

NULLABLE_STRING = "google.protobuf.StringValue"
"""A string or null (CEL's string wrapper): compared with strings and with null alike."""
OBJECT_ROOTS = ("object", "oldObject")
"""The objects of a write, ``dyn``: no schema is compiled in."""
BUILT_INS: Mapping[str, str] = {
    "node": "string",
    "driver": "string",
    "namespace": NULLABLE_STRING,
    "serviceAccount": NULLABLE_STRING,
    "pod": NULLABLE_STRING,
    "podUID": NULLABLE_STRING,
}
"""The built-in ``variables.<name>`` and their types (null where the caller's identity does not
tell: a socket caller has no ServiceAccount, a token without a pod claim no pod)."""
_GVK = "map(string, string)"
REQUEST_FIELDS: Mapping[str, str] = {
    "kind": _GVK,
    "resource": _GVK,
    "subResource": "string",
    "requestKind": _GVK,
    "requestResource": _GVK,
    "requestSubResource": "string",
    "name": "string",
    "namespace": "string",
    "operation": "string",
    "userInfo.username": "string",
    "userInfo.uid": "string",
    "userInfo.groups": "list(string)",
    "userInfo.extra": "map(string, list(string))",
    "dryRun": "bool",
    "options": "map(string, dyn)",
}
"""``request.<field>``: an AdmissionRequest's fields as an admission policy reads them, each a
name of its own (``userInfo`` by its fields)."""
_REQUEST_KEYS = {
    "kind": ("group", "version", "kind"),
    "requestKind": ("group", "version", "kind"),
    "resource": ("group", "version", "resource"),
    "requestResource": ("group", "version", "resource"),
}
_WRAPPERS = {
    "string": NULLABLE_STRING,
    "int": "google.protobuf.Int64Value",
    "uint": "google.protobuf.UInt64Value",
    "double": "google.protobuf.DoubleValue",
    "bool": "google.protobuf.BoolValue",
    "bytes": "google.protobuf.BytesValue",
}
_POSITION = re.compile(r"<input>:(\d+):(\d+): ")


class CheckError(ValueError):
    """An expression that does not parse or check; ``offset`` is where in its source (code
    points from the start; None when the runtime named no place)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


def _extensions() -> list[Any]:
    from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

    return [
        ext_optional.ExtOptional(),
        ext_strings.ExtStrings(),
        ext_bindings.ExtBindings(),
        ext_math.ExtMath(),
        ext_encoders.ExtEncoders(),
    ]


@cache
def runtime_env() -> Any:
    """The environment expressions are evaluated in: no declarations, so every bound value is
    converted by its Python type (imported here: a policy without CEL never loads the runtime)."""
    from cel_expr_python import cel

    return cel.NewEnv(extensions=_extensions())


@cache
def _checking_env(declarations: tuple[tuple[str, str], ...]) -> Any:
    from cel_expr_python import cel

    variables = {name: _cel_type(kind) for name, kind in declarations}
    return cel.NewEnv(variables=variables, extensions=_extensions())


def _cel_type(text: str) -> Any:
    """The runtime's type for a signature (``list(string)``, ``map(string, dyn)``): built from
    its parts (``cel.Type("list(string)")`` would name an opaque message type instead)."""
    from cel_expr_python import cel

    text = text.strip()
    head, _, rest = text.partition("(")
    if rest:
        params = [_cel_type(part) for part in _split_params(rest[:-1])]
        if head == "list":
            return cel.Type.List(params[0])
        if head == "map":
            return cel.Type.Map(params[0], params[1])
        return cel.Type.AbstractType(head, params)
    primitive = {
        "dyn": cel.Type.DYN,
        "null_type": cel.Type.NULL,
        "bool": cel.Type.BOOL,
        "int": cel.Type.INT,
        "uint": cel.Type.UINT,
        "double": cel.Type.DOUBLE,
        "string": cel.Type.STRING,
        "bytes": cel.Type.BYTES,
        "timestamp": cel.Type.TIMESTAMP,
        "duration": cel.Type.DURATION,
    }.get(text)
    return primitive if primitive is not None else cel.Type(text)


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def declarations(
    variables: Mapping[str, str], values: tuple[str, ...] = ()
) -> tuple[tuple[str, str], ...]:
    """Every name an expression may read: the objects, ``request``'s fields,
    ``variables.<name>`` for each of ``variables`` (name → type signature), and ``values``:
    names of values of the objects bound on their own (``dyn``)."""
    names = {root: "dyn" for root in (*OBJECT_ROOTS, *values)}
    names.update((f"request.{field}", kind) for field, kind in REQUEST_FIELDS.items())
    names.update((f"variables.{name}", kind) for name, kind in variables.items())
    return tuple(sorted(names.items()))


def check(
    source: str, variables: Mapping[str, str], values: tuple[str, ...] = ()
) -> tuple[Any, Checked]:
    """``source`` parsed and type-checked with ``variables`` (``variables.<name>`` → type
    signature) and ``values`` (:func:`declarations`): the expression moved into the runtime,
    and its checked tree. CheckError naming the problem and where."""
    parsed = _compile(runtime_env(), source, parse_only=True)
    _check_names(source, read_checked(parsed.serialize()), variables)
    compiled = _compile(_checking_env(declarations(variables, values)), source, parse_only=False)
    serialized = compiled.serialize()
    return runtime_env().deserialize(serialized), read_checked(serialized)


def _compile(env: Any, source: str, *, parse_only: bool) -> Any:
    try:
        return env.compile(source, disable_check=parse_only)
    except RuntimeError as exc:
        raise _check_error(source, str(exc)) from None


def _check_error(source: str, text: str) -> CheckError:
    """The runtime's first error, without its status prefix and caret lines, at its offset."""
    text = re.sub(r"^[A-Z_]+: ", "", text.strip())
    text = re.sub(r"\s*\[[A-Z_]+\]$", "", text)
    first = text.split("\nERROR: ")[0]
    lines = [line.strip() for line in first.splitlines() if line.strip()]
    message = " ".join(line for line in lines if not line.startswith("|"))
    message = message.removeprefix("ERROR: ")
    found = _POSITION.match(message)
    if found is None:
        return CheckError(message)
    line, column = int(found.group(1)), int(found.group(2))
    starts = [0, *(index + 1 for index, char in enumerate(source) if char == "\n")]
    offset = starts[line - 1] + column - 1 if 0 < line <= len(starts) else None
    return CheckError(message[found.end() :], offset)


def _check_names(source: str, parsed: Checked, variables: Mapping[str, str]) -> None:
    """``variables`` and ``request`` are read by their declared names (``variables.<name>``,
    ``request.<field>``), as an admission policy reads them: a misspelt one is named here,
    with what is defined, before the checker's terser "undeclared reference"."""
    parents = {child.id: node for node in parsed.root.walk() for child in node.children()}
    for node, name in globals_of(parsed):
        if name not in ("variables", "request"):
            continue
        at = parsed.positions.get(node.id)
        select = parents.get(node.id)
        field = select.name if select is not None and _selects(select, node) else None
        if name == "variables":
            if field is None:
                raise CheckError("variables is read by name, as variables.<name>", at)
            if field not in variables:
                defined = ", ".join(sorted(variables))
                raise CheckError(
                    f"reads variables.{field}, which is not defined (defined: {defined}; a "
                    "variable is read after it is defined)",
                    at,
                )
            continue
        _check_request(parents, node, select, field, at)


def _selects(select: Node | None, operand: Node) -> bool:
    return (
        select is not None
        and select.kind is NodeKind.SELECT
        and select.operand is operand
        and not select.test_only
    )


def _check_request(
    parents: Mapping[int, Node], node: Node, select: Node | None, field: str | None, at: int | None
) -> None:
    fields = sorted({name.split(".")[0] for name in REQUEST_FIELDS})
    if field is None or field not in fields:
        what = f"has no field {field}" if field is not None else "is read by its fields"
        raise CheckError(f"request {what} (fields: {', '.join(fields)})", at)
    assert select is not None
    below = parents.get(select.id)
    key = below.name if below is not None and _selects(below, select) else None
    if field == "userInfo":
        known = sorted(name.split(".")[1] for name in REQUEST_FIELDS if "." in name)
        if key not in known:
            what = f"has no field {key}" if key is not None else "is read by its fields"
            raise CheckError(f"request.userInfo {what} (fields: {', '.join(known)})", at)
    elif field in _REQUEST_KEYS and key is not None and key not in _REQUEST_KEYS[field]:
        keys = ", ".join(_REQUEST_KEYS[field])
        raise CheckError(f"request.{field} has no field {key} (fields: {keys})", at)


def globals_of(checked: Checked) -> Iterator[tuple[Node, str]]:
    """Every identifier of ``checked`` that names a declaration rather than a comprehension's
    variable, with the declaration's name (``variables.node`` for the qualified name the checker
    resolved), in source order."""
    found = [
        (checked.positions.get(node.id, 0), node, checked.references.get(node.id, node.name))
        for node, local in checked.scoped()
        if node.kind is NodeKind.IDENT and node.name not in local
    ]
    yield from ((node, name) for _, node, name in sorted(found, key=lambda item: item[0]))


def signature(kind: CelType) -> str:
    """The declaration of a value of type ``kind`` (a policy variable's type)."""
    if kind.kind in ("list", "map") and kind.params:
        return f"{kind.kind}({', '.join(signature(param) for param in kind.params)})"
    if kind.kind == "wrapper" and kind.params:
        return _WRAPPERS.get(kind.params[0].kind, "dyn")
    if kind.kind == "abstract" and kind.name == "optional_type" and kind.params:
        return f"optional_type({signature(kind.params[0])})"
    if kind.kind == "message":
        return kind.name
    if kind.kind == "null":
        return "null_type"
    if kind.kind in ("bool", "int", "uint", "double", "string", "bytes", "timestamp", "duration"):
        return kind.kind
    return "dyn"
