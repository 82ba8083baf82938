"""What a CEL expression of the policy sees, as a ValidatingAdmissionPolicy would: ``request``
(an AdmissionRequest: kind, resource, name, namespace, operation, userInfo, dryRun) and the
built-in ``variables`` (docs/policy.md#cel-rules); and the one call that runs a kind's CEL on a
write, returning the refusal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.policy.cel import CelRules, in_scope, run_validations
from gatekeeper.policy.decision import Decision, deny, forbid
from gatekeeper.policy.model import KindSpec, Policy
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule
from gatekeeper.types import DRIVERS_GROUP, NODE_NAME_EXTRA, Identity, KubeObject

__all__ = [
    "CREATE",
    "DELETE",
    "UPDATE",
    "CelContext",
    "builtin_variables",
    "operation_of",
    "user_info",
]

CREATE, UPDATE, DELETE = "CREATE", "UPDATE", "DELETE"


def operation_of(verb: str, current: KubeObject | None) -> str:
    """The admission operation of a write: a patch or update is UPDATE, an apply that creates
    (nothing stored) CREATE, as the apiserver's admission sees them."""
    if verb == "delete":
        return DELETE
    if verb == "create" or current is None:
        return CREATE
    return UPDATE


class CelContext:
    """The CEL view of one request: built once per request, read by each expression."""

    __slots__ = ("_builtins", "_identity", "_info", "_kind", "_node")

    def __init__(
        self, identity: Identity, info: RequestInfo, kind: KindSpec, policy: Policy, node: str
    ) -> None:
        self._identity, self._info, self._kind, self._node = identity, info, kind, node
        self._builtins = builtin_variables(identity, policy, node)

    @property
    def builtins(self) -> Mapping[str, Any]:
        return self._builtins

    def request(self, operation: str, obj: KubeObject | None = None) -> dict[str, Any]:
        """The AdmissionRequest an apiserver would evaluate ``operation`` with."""
        info, kind = self._info, self._kind
        gvk = {"group": kind.group, "version": info.api_version, "kind": kind.kind}
        gvr = {"group": kind.group, "version": info.api_version, "resource": kind.resource}
        name = info.name or (get_field(obj, ("metadata", "name")) if obj else None)
        return {
            "kind": gvk,
            "resource": gvr,
            "subResource": info.subresource,
            "requestKind": gvk,
            "requestResource": gvr,
            "requestSubResource": info.subresource,
            "name": name if isinstance(name, str) else "",
            "namespace": info.namespace,
            "operation": operation,
            "userInfo": user_info(self._identity, self._node),
            "dryRun": info.query_value("dryRun") == "All",
            "options": _options(info),
        }

    def holds_scope(self, cel: CelRules, obj: Any, verb: str) -> bool:
        """Rule CEL's scope on one object read (``request.operation`` is the verb, upper case)."""
        request = self.request(verb.upper(), None) if cel.reads_request else {}
        return in_scope(cel, obj, request, self._builtins)

    def refusal(
        self, cel: CelRules, operation: str, obj: KubeObject | None, old: KubeObject | None, *,
        scoped: tuple[str, ...] = (),
    ) -> Decision | None:  # fmt: skip
        """Run the CEL of a write (``obj`` to be stored, ``old`` stored); the refusal of the
        first validation (or scope) that does not hold, or of one that cannot be evaluated."""
        if not cel:
            return None
        request = (
            self.request(operation, obj if obj is not None else old) if cel.reads_request else {}
        )
        outcome = run_validations(cel, obj, old, request, self._builtins, scoped=scoped)
        if outcome is None:
            return None
        what = f"{self._kind.qualified} {self._info.api_version}"
        if outcome.error:
            why = (
                f"{what} CEL {outcome.message} (a rule that cannot be evaluated refuses the "
                "request)"
            )
            refused = forbid(self._identity.driver, self._info, why, rule=Rule.CEL_VALIDATION)
            return _named(refused, outcome.name)
        why = f"{what} {outcome.name}: {outcome.message}"
        if outcome.code == 403:
            refused = forbid(self._identity.driver, self._info, why, rule=Rule.CEL_VALIDATION)
            return _named(refused, outcome.name)
        return _named(deny(outcome.code, why, rule=Rule.CEL_VALIDATION), outcome.name)


def _options(info: RequestInfo) -> dict[str, Any]:
    """``request.options``: the write's options as its query gives them (an apply's
    ``fieldManager`` and ``force``), as the apiserver's CreateOptions, UpdateOptions or
    PatchOptions would hold them."""
    options: dict[str, Any] = {}
    if (manager := info.query_value("fieldManager")) is not None:
        options["fieldManager"] = manager
    if (force := info.query_value("force")) is not None:
        options["force"] = force.lower() in ("1", "t", "true")
    if (dry_run := info.query_value("dryRun")) is not None:
        options["dryRun"] = [dry_run]
    return options


def _named(decision: Decision, validation: str) -> Decision:
    return replace(decision, validation=validation)


def user_info(identity: Identity, node: str) -> dict[str, Any]:
    """``request.userInfo``: a token's holder as the apiserver reviewed it; a socket or
    certificate caller as the gatekeeper's audit names it (the driver, its group, this node)."""
    user = identity.user
    if user is not None:
        return {
            "username": user.username,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {key: list(values) for key, values in user.extra.items()},
        }
    return {
        "username": identity.driver,
        "uid": "",
        "groups": [DRIVERS_GROUP],
        "extra": {NODE_NAME_EXTRA: [node]},
    }


def builtin_variables(identity: Identity, policy: Policy, node: str) -> dict[str, Any]:
    """``variables.node``, ``driver``, ``namespace``, ``serviceAccount``, ``pod``, ``podUID``
    (null where the caller's identity does not tell)."""
    account = identity.service_account
    pod = identity.pod
    namespace: str | None = account[0] if account else None
    if namespace is None:
        mapped = policy.namespaces_of(identity.driver)
        namespace = next(iter(mapped)) if len(mapped) == 1 else None
    return {
        "node": node,
        "driver": identity.driver,
        "namespace": namespace,
        "serviceAccount": account[1] if account else None,
        "pod": pod[0] if pod else None,
        "podUID": pod[1] if pod and pod[1] else None,
    }
