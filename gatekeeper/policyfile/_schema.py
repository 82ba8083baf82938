"""Structural validation by the published JSON Schemas (draft 2020-12), worded for people.

The schemas (``policy.schema.json`` and ``policytest.schema.json`` beside this module, linked
from the repository's ``schemas/``) are the one definition of both file formats: editors check
a file with them as it is written, the loaders when it is read. Each refusal is worded from the
schema, naming the key path and the allowed values:

- a ``title`` names what a value must be (``5 is not a field path``); the ``title`` of an
  ``if`` says when its ``then`` applies (``… (rule OwnNode)``);
- ``patternErrorMessage`` (which editors show too) says what a pattern wants;
- ``x-messages`` words one refusal of that schema where the generic wording would say less:
  ``{keyword: message}``, or ``{"required": {key: message}}``. Editors ignore it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, cast

import jsonschema
from jsonschema.exceptions import ValidationError

from gatekeeper.policy.draft import KeyPath
from gatekeeper.policyfile._yaml import LineDict, line_at

__all__ = ["KEYWORDS", "POLICY", "POLICY_TEST", "Fault", "faults", "first_fault", "schema"]

POLICY = "policy"
POLICY_TEST = "policytest"
KEYWORDS = frozenset(
    {
        *("$schema", "$defs", "$ref", "title", "description", "x-messages"),
        *("patternErrorMessage", "type", "enum", "const", "pattern", "minLength", "maxLength"),
        *("minimum", "maximum", "properties", "patternProperties", "additionalProperties"),
        *("propertyNames", "required", "dependentRequired", "minProperties", "items"),
        *("minItems", "maxItems", "uniqueItems", "contains", "allOf", "anyOf", "not", "if"),
        "then",
    }
)
"""The keywords the schemas may use: each refusal of one is worded here (a test holds them)."""
_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "null": "null",
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One refusal: where (the key path from the document's top) and why."""

    path: KeyPath
    message: str


@cache
def schema(name: str) -> Mapping[str, Any]:
    """The schema ``policy`` or ``policytest``, as shipped with the gatekeeper."""
    text = resources.files(__package__).joinpath(f"{name}.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator(name: str, definition: str) -> jsonschema.Draft202012Validator:
    root = dict(schema(name))
    if definition:  # one of its $defs, with the others in reach of its $refs
        root = {**root["$defs"][definition], "$defs": root["$defs"]}
    return jsonschema.Draft202012Validator(root)


def faults(name: str, doc: Any, definition: str = "") -> list[Fault]:
    """Every refusal of ``doc`` by schema ``name`` (or by its ``$defs/<definition>``), in the
    schema's order, those of an ``anyOf`` last; empty if it validates. An ``anyOf`` that failed
    where a branch an ``if`` chose failed is left out: that branch's refusal says more."""
    validator = _validator(name, definition)
    root: Mapping[str, Any] = cast(Any, validator.schema)
    strong: list[Fault] = []
    weak: list[tuple[KeyPath, Fault]] = []  # an anyOf's refusals, with the anyOf's own path
    for error in validator.iter_errors(doc):
        rendered = _render(error, root)
        if error.validator in ("anyOf", "oneOf"):
            weak.extend((tuple(error.absolute_path), fault) for fault in rendered)
        else:
            strong.extend(rendered)
    kept = strong + [
        fault for at, fault in weak if not any(other.path[: len(at)] == at for other in strong)
    ]
    return list(dict.fromkeys(kept))


def first_fault(name: str, doc: Any) -> Fault | None:
    """The refusal of a loaded document to report: the first in the file (ties: the schema's
    order), so that a fix moves on to the next one down. A missing key counts as written after
    the keys of its mapping: a misspelt key is reported as the unknown key it is."""
    found = faults(name, doc)
    return min(found, key=lambda fault: _written_at(doc, fault.path)) if found else None


def _written_at(doc: Any, path: KeyPath) -> float:
    parent = _value_at(doc, path[:-1])
    if path and isinstance(parent, LineDict) and path[-1] not in parent:
        return max(parent.key_lines.values(), default=parent.line) + 0.5
    return line_at(doc, path)


def _value_at(doc: Any, path: KeyPath) -> Any:
    for step in path:
        listed = isinstance(doc, list) and isinstance(step, int) and 0 <= step < len(doc)
        if not listed and not (isinstance(doc, dict) and step in doc):
            return None
        doc = doc[step]
    return doc


def _render(error: ValidationError, root: Mapping[str, Any]) -> list[Fault]:
    """One jsonschema error as the refusals it stands for (one per unknown key, say)."""
    path: KeyPath = tuple(error.absolute_path)
    if "propertyNames" in error.relative_schema_path:  # a key, not a value, is at fault
        path = (*path, cast(str, error.instance))
    node: Mapping[str, Any] = error.schema if isinstance(error.schema, dict) else {}
    keyword = str(error.validator)
    worded = node.get("x-messages", {}).get(keyword)
    when = _conditions(root, error.absolute_schema_path)
    suffix = f" ({', '.join(when)})" if when else ""
    return [
        Fault(fault.path, (worded if isinstance(worded, str) else fault.message) + suffix)
        for fault in _keyword(keyword, error, node, path, root)
    ]


def _keyword(
    keyword: str,
    error: ValidationError,
    node: Mapping[str, Any],
    path: KeyPath,
    root: Mapping[str, Any],
) -> list[Fault]:
    value: Any = cast(Any, error.instance)
    expected: Any = cast(Any, error.validator_value)
    if keyword == "additionalProperties":
        return _unknown_keys(value, node, path)
    if keyword == "required":
        return [_missing(key, node, path) for key in expected if key not in value]
    if keyword == "dependentRequired":
        return [
            Fault((*path, key), f"needs {need}")
            for key, needs in expected.items()
            if key in value
            for need in needs
            if need not in value
        ]
    if keyword == "uniqueItems":
        index = next(i for i, item in enumerate(value) if _listed(value[:i], item))
        return [Fault((*path, index), f"{_shown(value[index])} is listed twice")]
    if keyword == "not":
        return _absent(value, expected, path)
    if keyword in ("anyOf", "oneOf"):
        return _any_of(error, node, path, root)
    return [Fault(path, _value_message(keyword, value, expected, node))]


def _unknown_keys(value: Mapping[str, Any], node: Mapping[str, Any], path: KeyPath) -> list[Fault]:
    known = node.get("properties", {})
    patterns = node.get("patternProperties", {})
    allowed = ", ".join([*sorted(known), *(f"keys matching {p}" for p in patterns)])
    return [
        Fault((*path, key), f"unknown key (allowed: {allowed})")
        for key in value
        if key not in known and not any(re.search(p, str(key)) for p in patterns)
    ]


def _missing(key: str, node: Mapping[str, Any], path: KeyPath) -> Fault:
    worded = node.get("x-messages", {}).get("required", {})
    if key in worded:
        return Fault((*path, key), worded[key])
    wanted = node.get("properties", {}).get(key, {})
    if "const" in wanted:  # a key with one possible value: say which
        return Fault((*path, key), f"must be {wanted['const']}")
    return Fault((*path, key), "is required")


def _value_message(keyword: str, value: Any, expected: Any, node: Mapping[str, Any]) -> str:
    title = node.get("title")
    if keyword == "type":
        if title:
            return f"must be {title}"
        kinds = [expected] if isinstance(expected, str) else expected
        if kinds == ["array"] and node.get("items", {}).get("type") == "string":
            return "must be a list of strings"
        return f"must be {' or '.join(_TYPES[kind] for kind in kinds)}"
    if keyword == "enum":
        return f"{_shown(value)} is not one of {', '.join(str(item) for item in expected)}"
    if keyword == "const":
        return f"must be {expected}"
    if keyword == "pattern":
        wanted = node.get("patternErrorMessage") or (f"is not {title}" if title else "")
        return f"{_shown(value)} {wanted or f'does not match {expected}'}"
    if keyword in ("minimum", "maximum") and title:
        return f"{_shown(value)} is not {title}"
    return _bound_message(keyword, value, expected)


def _bound_message(keyword: str, value: Any, expected: Any) -> str:
    if keyword == "minLength":
        return "must not be empty" if expected == 1 else f"is shorter than {expected} characters"
    if keyword == "maxLength":
        return f"is {len(value)} characters long (at most {expected})"
    if keyword == "minItems":
        return "must be a non-empty list" if expected == 1 else f"must list {expected} or more"
    if keyword == "maxItems":
        return "must be empty" if expected == 0 else f"must list at most {expected}"
    if keyword == "minProperties":
        return f"must have at least {expected} keys"
    if keyword == "minimum":
        return f"must be at least {expected}"
    if keyword == "maximum":
        return f"must be at most {expected}"
    if keyword == "contains":
        wanted = expected.get("const", expected.get("enum", ()))
        return f"must include {wanted if isinstance(wanted, str) else ' or '.join(wanted)}"
    return "is not allowed"  # the false schema


def _absent(value: Any, expected: Mapping[str, Any], path: KeyPath) -> list[Fault]:
    """``not`` as the schemas use it: keys that must be absent (``not: {required: [k]}``, or
    ``not: {anyOf: [{required: [k]}, …]}``), each named where it is written."""
    if not isinstance(value, dict):  # vacuous (an if/then on a mapping met another value):
        return []  # the value's type is refused on its own
    keys = [key for branch in expected.get("anyOf", [expected]) for key in branch["required"]]
    return [Fault((*path, key), "is not allowed") for key in keys if key in value]


def _any_of(
    error: ValidationError, node: Mapping[str, Any], path: KeyPath, root: Mapping[str, Any]
) -> list[Fault]:
    """No branch holds. For a mapping, the refusals of the branch that came closest (one for
    its type, then the fewest unknown keys, then the fewest refusals); for any other value,
    what the title says was wanted (else that closest branch too)."""
    value: Any = cast(Any, error.instance)
    if "title" in node and not isinstance(value, dict):
        return [Fault(path, f"{_shown(value)} is not {node['title']}")]
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)

    def distance(index: int) -> tuple[bool, int, int, int]:
        errors = branches[index]
        other_type = any(sub.validator == "type" and not sub.relative_path for sub in errors)
        unknown = sum(1 for sub in errors if sub.validator == "additionalProperties")
        return (other_type, unknown, len(errors), index)

    best = min(branches, key=distance)
    return [fault for sub in branches[best] for fault in _render(sub, root)]


def _conditions(root: Mapping[str, Any], schema_path: Iterable[Any]) -> list[str]:
    """The titles of the ``if`` schemas whose ``then`` holds the failed keyword."""
    node: Any = root
    found = []
    for step in schema_path:
        node = _through_refs(root, node, step)
        if step == "then" and "title" in node.get("if", {}):
            found.append(node["if"]["title"])
        node = node[step]
    return found


def _through_refs(root: Mapping[str, Any], node: Any, step: Any) -> Any:
    """The schema a step of a schema path is taken in: jsonschema's paths leave ``$ref`` out.
    (The schemas refer only inside themselves: ``#/$defs/<name>``.)"""
    while isinstance(node, dict) and step not in node and "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _listed(items: list[Any], item: Any) -> bool:
    """Whether ``item`` is in ``items`` by JSON equality (``true`` is not ``1``)."""
    return any(type(other) is type(item) and other == item for other in items)


def _shown(value: Any) -> str:
    """A value as a message shows it: strings quoted; true, false and null as YAML spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)
