"""The CEL keys of a policy kind and its versions (``variables``, ``validations``, ``scope``),
compiled when the policy loads: a fault names the file, the key, the kind and the version."""

from __future__ import annotations

from collections.abc import Mapping

from gatekeeper.policy.cel import (
    BUILT_IN_VARIABLES,
    MAX_EXPRESSIONS,
    CelError,
    CelRules,
    Program,
    StatusReason,
    Validation,
    Variable,
    compile_program,
)
from gatekeeper.policy.draft import Located

__all__ = ["KIND_CEL_KEYS", "read_kind_cel", "read_version_cel"]

KIND_CEL_KEYS = frozenset({"variables", "validations"})
"""CEL keys of a kind: they apply to every version."""


def read_kind_cel(keys: Mapping[str, Located], what: str) -> CelRules:
    """The kind-level ``variables`` and ``validations`` (``what``: the kind, for messages)."""
    return _read(keys.get("variables"), keys.get("validations"), None, CelRules(), what)


def read_version_cel(entry: Located, kind_rules: CelRules, what: str) -> CelRules:
    """A version's CEL keys after the kind's (``entry``: the version's entry as written)."""
    return _read(
        entry.get("variables"), entry.get("validations"), entry.get("scope"), kind_rules, what
    )


def _read(
    variables: Located | None,
    validations: Located | None,
    scope: Located | None,
    base: CelRules,
    what: str,
) -> CelRules:
    known = [*BUILT_IN_VARIABLES, *(variable.name for variable in base.variables)]
    read_variables = list(base.variables)
    for loc in _entries(variables):
        name = loc.value["name"]
        if name in known:
            loc.fail(
                f"{name!r} is defined already (built in: {', '.join(BUILT_IN_VARIABLES)})", "name"
            )
        read_variables.append(Variable(name, _compile(loc.at("expression"), known, what, "any")))
        known.append(name)
    scope_program = _compile(scope, known, what, "bool") if scope is not None else base.scope
    read_validations = list(base.validations)
    names = {validation.name for validation in read_validations}
    for index, loc in enumerate(_entries(validations)):
        read_validations.append(_validation(loc, len(base.validations) + index, known, what, names))
    rules = CelRules(tuple(read_variables), tuple(read_validations), scope_program)
    count = sum(1 for _ in rules.programs())
    if count > MAX_EXPRESSIONS:
        where = validations or variables or scope
        assert where is not None
        where.fail(f"{what} has {count} CEL expressions (at most {MAX_EXPRESSIONS} per version)")
    return rules


def _entries(loc: Located | None) -> list[Located]:
    return [] if loc is None else [loc.at(index) for index in range(len(loc.value))]


def _validation(
    loc: Located, index: int, known: list[str], what: str, names: set[str]
) -> Validation:
    raw = loc.value
    name = raw.get("name", f"validations[{index}]")
    if name in names:
        loc.fail(f"{name!r} names another validation of {what} already", "name")
    names.add(name)
    message_expression = None
    if "messageExpression" in raw:
        message_expression = _compile(loc.at("messageExpression"), known, what, "string")
    reason = StatusReason(raw.get("reason", StatusReason.FORBIDDEN.value))
    program = _compile(loc.at("expression"), known, what, "bool")
    return Validation(name, program, raw.get("message", "").strip(), message_expression, reason)


def _compile(loc: Located, known: list[str], what: str, result: str) -> Program:
    try:
        return compile_program(loc.value, loc.where, known=known, result=result)
    except CelError as exc:
        loc.fail(f"{what}: {exc}")
