"""The fields a policy's CEL reads of ``object`` and ``oldObject``, checked against the schema the
apiserver publishes for the kind's group and version (OpenAPI v3), as the apiserver type-checks an
admission policy: a field the schema does not have is named when the policy loads, as a warning
(the expression still loads: ``.?`` and ``has()`` may test a field on purpose, and a schema may
change under a running policy). Pure: the documents are read by ``gatekeeper.server``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gatekeeper.policy.cel import EACH, CelRules, Path
from gatekeeper.policy.model import KindSpec, Policy

__all__ = ["field_warnings", "schema_path", "schema_targets"]

_SCALARS = frozenset({"string", "integer", "number", "boolean"})


def schema_path(group: str, version: str) -> str:
    """Where the apiserver publishes the OpenAPI v3 document of ``group``/``version``."""
    return f"/openapi/v3/apis/{group}/{version}" if group else f"/openapi/v3/api/{version}"


def schema_targets(policy: Policy) -> list[tuple[str, str]]:
    """The group versions whose kinds have CEL that reads the objects."""
    found = {
        (entry.group, version)
        for entry, version, paths in _reads(policy)
        if any(steps for _, steps in paths)
    }
    return sorted(found)


def field_warnings(
    policy: Policy, documents: Mapping[tuple[str, str], Mapping[str, Any]]
) -> list[str]:
    """One line per field an expression reads that the schema of its kind (in ``documents``, by
    group and version) does not have; kinds without a document are not checked."""
    warnings: dict[str, None] = {}
    for spec in policy.kinds.values():
        for entry in spec.entries:
            for version, spec_version in entry.versions.items():
                document = documents.get((entry.group, version))
                schema = _kind_schema(document, entry, version) if document is not None else None
                if document is None or schema is None or spec_version.cel.analysis is None:
                    continue
                schemas = document.get("components", {}).get("schemas", {})
                for where, root, steps in _by_program(spec_version.cel):
                    missing = _missing(schemas, schema, steps)
                    if missing is not None:
                        warnings[
                            f"{where}: {entry.qualified} {version}: {_shown(root, missing)} is "
                            f"not a field of {entry.kind} in the apiserver's schema "
                            f"({entry.group or 'core'}/{version})"
                        ] = None
    return list(warnings)


def _reads(policy: Policy) -> Iterator[tuple[KindSpec, str, frozenset[Path]]]:
    for spec in policy.kinds.values():
        for entry in spec.entries:
            for version, spec_version in entry.versions.items():
                analysis = spec_version.cel.analysis
                if analysis is not None:
                    yield entry, version, frozenset().union(*analysis.paths.values())


def _by_program(cel: CelRules) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(where the expression is written, root, steps) of each object path it reads, in order."""
    assert cel.analysis is not None
    for program in cel.programs():
        for root, steps in sorted(cel.analysis.paths.get(id(program), frozenset())):
            if steps:
                yield program.where, root, steps


def _kind_schema(document: Mapping[str, Any], entry: KindSpec, version: str) -> Any:
    for schema in document.get("components", {}).get("schemas", {}).values():
        for gvk in schema.get("x-kubernetes-group-version-kind", ()):
            if (gvk.get("group"), gvk.get("version"), gvk.get("kind")) == (
                entry.group,
                version,
                entry.kind,
            ):
                return schema
    return None


def _resolve(schemas: Mapping[str, Any], node: Any) -> Any:
    """A schema with its ``$ref`` (or a lone ``allOf`` of one) followed."""
    for _ in range(64):
        if not isinstance(node, Mapping):
            return None
        ref = node.get("$ref")
        if ref is None and len(node.get("allOf", ())) == 1:
            ref = node["allOf"][0].get("$ref")
        if ref is None:
            return node
        node = schemas.get(str(ref).rsplit("/", 1)[-1])
    return None


def _missing(
    schemas: Mapping[str, Any], schema: Any, steps: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The steps up to the first one the schema does not have; None when it has them all (or
    cannot tell: a field of any shape, a value it does not describe)."""
    node = schema
    for index, step in enumerate(steps):
        node = _resolve(schemas, node)
        if node is None or node.get("x-kubernetes-preserve-unknown-fields"):
            return None
        if node.get("x-kubernetes-int-or-string"):
            return None
        if step == EACH:
            if isinstance(node.get("items"), Mapping):
                node = node["items"]
            elif isinstance(node.get("additionalProperties"), Mapping):
                node = node["additionalProperties"]
            else:
                return None  # a loop over a mapping's keys: nothing below is a field
            continue
        properties = node.get("properties")
        if isinstance(properties, Mapping) and step in properties:
            node = properties[step]
        elif isinstance(node.get("additionalProperties"), Mapping):
            node = node["additionalProperties"]
        elif properties or node.get("type") in _SCALARS | {"array"}:
            return steps[: index + 1]
        else:
            return None
    return None


def _shown(root: str, steps: tuple[str, ...]) -> str:
    return root + "".join("[*]" if step == EACH else f".{step}" for step in steps)
