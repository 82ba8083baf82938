"""The CEL keys of a policy kind and its versions (``variables``, ``validations``, ``scope``), read
and compiled when the policy loads: a fault names the file, the key, the kind and the version."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gatekeeper.policy._context import Located, join_key, parse_enum
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

__all__ = ["CEL_KEYS", "KIND_CEL_KEYS", "read_kind_cel", "read_version_cel"]

KIND_CEL_KEYS = frozenset({"variables", "validations"})
"""CEL keys of a kind: they apply to every version."""
CEL_KEYS = KIND_CEL_KEYS | {"scope"}
"""CEL keys of a version (``scope``: rule CEL only)."""
_VALIDATION_KEYS = {"expression", "message", "messageExpression", "reason", "name"}
_VARIABLE_KEYS = {"name", "expression"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_kind_cel(keys: Mapping[str, Located], what: str) -> CelRules:
    """The kind-level ``variables`` and ``validations`` (``what``: the kind, for messages)."""
    return _read(keys.get("variables"), keys.get("validations"), None, CelRules(), what)


def read_version_cel(
    rules: Located, kind_rules: CelRules, what: str, *, scope_required: bool
) -> CelRules:
    """A version's CEL keys after the kind's (``rules``: the version's rule set as written)."""
    spec = rules.value if isinstance(rules.value, dict) else {}

    def located(name: str) -> Located | None:
        return Located(spec[name], rules.ctx, join_key(rules.key, name)) if name in spec else None

    scope = located("scope")
    if scope_required and scope is None:
        rules.fail(
            "is required by rule CEL: the expression that holds for the caller's objects "
            "(e.g. object.spec.driver == variables.driver)",
            "scope",
        )
    if scope is not None and not scope_required:
        scope.fail("is used by rule CEL only")
    return _read(located("variables"), located("validations"), scope, kind_rules, what)


def _read(
    variables: Located | None,
    validations: Located | None,
    scope: Located | None,
    base: CelRules,
    what: str,
) -> CelRules:
    known = [*BUILT_IN_VARIABLES, *(variable.name for variable in base.variables)]
    read_variables = list(base.variables)
    for loc in _entries(variables, _VARIABLE_KEYS):
        name = loc.ctx.string(loc.value.get("name"), join_key(loc.key, "name"), _IDENTIFIER)
        if name in known:
            loc.fail(
                f"{name!r} is defined already (built in: {', '.join(BUILT_IN_VARIABLES)})", "name"
            )
        read_variables.append(Variable(name, _compile(loc, "expression", known, what, "dyn")))
        known.append(name)
    scope_program = (
        _compile_located(scope, known, what, "bool") if scope is not None else base.scope
    )
    read_validations = list(base.validations)
    names = {validation.name for validation in read_validations}
    for index, loc in enumerate(_entries(validations, _VALIDATION_KEYS)):
        read_validations.append(_validation(loc, len(base.validations) + index, known, what, names))
    rules = CelRules(tuple(read_variables), tuple(read_validations), scope_program)
    count = sum(1 for _ in rules.programs())
    if count > MAX_EXPRESSIONS:
        where = validations or variables or scope
        assert where is not None
        where.fail(f"{what} has {count} CEL expressions (at most {MAX_EXPRESSIONS} per version)")
    return rules


def _entries(loc: Located | None, allowed: set[str]) -> list[Located]:
    if loc is None:
        return []
    if not isinstance(loc.value, list) or not loc.value:
        loc.fail("must be a non-empty list when given")
    entries = []
    for index, raw in enumerate(loc.value):
        key = f"{loc.key}[{index}]"
        loc.ctx.mapping(raw, key, allowed)
        if "expression" not in raw:
            loc.ctx.fail(join_key(key, "expression"), "is required (a CEL expression)")
        entries.append(Located(raw, loc.ctx, key))
    return entries


def _validation(
    loc: Located, index: int, known: list[str], what: str, names: set[str]
) -> Validation:
    raw = loc.value
    name = f"validations[{index}]"
    if "name" in raw:
        name = loc.ctx.string(raw["name"], join_key(loc.key, "name"))
        if not name or name in names:
            loc.fail(f"{name!r} names another validation of {what} already", "name")
    names.add(name)
    message = ""
    if "message" in raw:
        message = loc.ctx.string(raw["message"], join_key(loc.key, "message"))
        if "\n" in message.strip():
            loc.fail("must be one line (it is a Status message)", "message")
        message = message.strip()
    message_expression = None
    if "messageExpression" in raw:
        message_expression = _compile(loc, "messageExpression", known, what, "string")
    reason = StatusReason.FORBIDDEN
    if "reason" in raw:
        reason = parse_enum(loc.ctx, StatusReason, raw["reason"], join_key(loc.key, "reason"))
    program = _compile(loc, "expression", known, what, "bool")
    return Validation(name, program, message, message_expression, reason)


def _compile(loc: Located, key: str, known: list[str], what: str, result: str) -> Program:
    return _compile_located(
        Located(loc.value[key], loc.ctx, join_key(loc.key, key)), known, what, result
    )


def _compile_located(loc: Located, known: list[str], what: str, result: str) -> Program:
    try:
        if result == "dyn":
            return compile_program(loc.value, loc.where, known=known, result="any")
        return compile_program(loc.value, loc.where, known=known, result=result)
    except CelError as exc:
        loc.fail(f"{what}: {exc}")
