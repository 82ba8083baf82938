"""The exported admission policy evaluated here, as the apiserver would evaluate it on one of the
gatekeeper's writes: what ``audit check`` reports per event and the differential tests compare
with the gatekeeper's own decision (docs/admission-policy.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.policy.admissionpolicy import Exported, PolicyExport, export_policy
from gatekeeper.policy.cel import (
    CelError,
    EvaluationError,
    Program,
    activation,
    bindings,
    compile_program,
    evaluate,
)
from gatekeeper.policy.model import Policy
from gatekeeper.types import NODE_NAME_EXTRA, KubeObject

__all__ = ["AdmissionRefusal", "ExportedPolicy", "Write"]

_OPERATIONS = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE",
               "deletecollection": "DELETE"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Write:
    """One write as the apiserver's admission sees it: what the gatekeeper forwarded (its
    verb and target) and the objects after and before."""

    verb: str
    group: str
    version: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    object: KubeObject | None = None
    old_object: KubeObject | None = None


@dataclass(frozen=True, slots=True)
class AdmissionRefusal:
    """The validation that refused (or could not be evaluated: failurePolicy Fail)."""

    validation: Exported
    error: str = ""


class ExportedPolicy:
    """:func:`~gatekeeper.policy.admissionpolicy.export_policy` compiled with the gatekeeper's own
    CEL runtime; :meth:`refusal` of a write by the gatekeeper of ``node``."""

    def __init__(self, policy: Policy) -> None:
        self.export: PolicyExport = export_policy(policy)
        self._variables = [
            (name, _compiled(expression, name, _EXPORTED))
            for name, expression in self.export.variables
        ]
        self._validations = [
            (item, _compiled(item.expression, item.protects, _EXPORTED))
            for item in self.export.validations
        ]
        self._names = frozenset(
            name for _, program in (*self._variables, *self._validations) for name in program.names
        )
        self._rules = [
            (rule["apiGroups"][0], rule["resources"][0], frozenset(rule["operations"]))
            for rule in self.export.resource_rules
        ]

    def matches(self, write: Write) -> bool:
        """Whether the admission policy's resource rules match ``write`` at all."""
        operation = _OPERATIONS.get(write.verb)
        resource = f"{write.resource}/{write.subresource}" if write.subresource else write.resource
        return any(
            group == write.group and name == resource and operation in ops
            for group, name, ops in self._rules
        )

    def refusal(self, write: Write, node: str, username: str = "") -> AdmissionRefusal | None:
        """The refusal the apiserver would give the gatekeeper of ``node`` for ``write``; None
        when the policy allows it or does not match it."""
        if not self.matches(write):
            return None
        request = _request(write, node, username)
        values: dict[str, Any] = {}
        for name, program in self._variables:  # literals, the node
            data = bindings(self._names, write.object, write.old_object, request, values)
            values[name] = evaluate(program, activation(data))
        bound = activation(bindings(self._names, write.object, write.old_object, request, values))
        for item, program in self._validations:
            try:
                holds = evaluate(program, bound)
            except EvaluationError as exc:  # an error denies (failurePolicy: Fail)
                return AdmissionRefusal(item, str(exc))
            if holds is not True:
                return AdmissionRefusal(item)
        return None


_EXPORTED = {"node": "string", "drivers": "list(string)", "namespaces": "list(string)"}
"""The admission policy's variables and their types (:func:`export_policy`)."""


def _compiled(expression: str, where: str, variables: Mapping[str, str]) -> Program:
    try:
        return compile_program(expression, where, variables=variables, result="any")
    except CelError as exc:  # a bug of the export, never of the policy (it compiled at load)
        raise AssertionError(
            f"the exported expression for {where!r} does not compile: {exc}"
        ) from exc


def _request(write: Write, node: str, username: str) -> Mapping[str, Any]:
    resource = {"group": write.group, "version": write.version, "resource": write.resource}
    return {
        "resource": resource,
        "requestResource": resource,
        "subResource": write.subresource,
        "operation": _OPERATIONS[write.verb],
        "namespace": write.namespace,
        "name": write.name,
        "userInfo": {"username": username, "extra": {NODE_NAME_EXTRA: [node]} if node else {}},
    }
