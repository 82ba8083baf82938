"""The CEL keys of a policy kind and its versions (``variables``, ``validations``, ``scope``),
compiled and type-checked when the policy loads: a fault names the file, the line and column of
the expression in it, the key, the kind and the version, and what was expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from gatekeeper.policy.cel import (
    BUILT_INS,
    MAX_EXPRESSIONS,
    CelError,
    CelRules,
    Program,
    ProgramError,
    StatusReason,
    Validation,
    Variable,
    compile_program,
    signature,
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


class _Reader:
    """One rule set being read: the variables defined so far (with their types) and where each
    expression was written."""

    def __init__(self, base: CelRules, what: str) -> None:
        self.what = what
        self.declared: dict[str, str] = dict(BUILT_INS)
        for variable in base.variables:
            self.declared[variable.name] = signature(variable.program.result)
        self.written: dict[int, Located] = {}

    def compile(self, loc: Located, result: str) -> Program:
        try:
            program = compile_program(loc.value, loc.where, variables=self.declared, result=result)
        except CelError as exc:
            self.fail(loc, exc)
        self.written[id(program)] = loc
        return program

    def fail(self, loc: Located, exc: CelError) -> NoReturn:
        if exc.offset is None:
            loc.fail(f"{self.what}: {exc}")
        loc.fail_at(exc.offset, f"{self.what}: {exc}")


def _read(
    variables: Located | None,
    validations: Located | None,
    scope: Located | None,
    base: CelRules,
    what: str,
) -> CelRules:
    reader = _Reader(base, what)
    read_variables = list(base.variables)
    for loc in _entries(variables):
        name = loc.value["name"]
        if name in reader.declared:
            loc.fail(f"{name!r} is defined already (built in: {', '.join(BUILT_INS)})", "name")
        program = reader.compile(loc.at("expression"), "any")
        read_variables.append(Variable(name, program))
        reader.declared[name] = signature(program.result)
    scope_program = reader.compile(scope, "bool") if scope is not None else base.scope
    read_validations = list(base.validations)
    names = {validation.name for validation in read_validations}
    for index, loc in enumerate(_entries(validations)):
        read_validations.append(_validation(loc, len(base.validations) + index, reader, names))
    count = len(read_variables) + len(read_validations) + (scope_program is not None)
    count += sum(v.message_expression is not None for v in read_validations)
    if count > MAX_EXPRESSIONS:
        where = validations or variables or scope
        assert where is not None
        where.fail(f"{what} has {count} CEL expressions (at most {MAX_EXPRESSIONS} per version)")
    try:
        return CelRules(tuple(read_variables), tuple(read_validations), scope_program)
    except ProgramError as exc:
        written = reader.written.get(id(exc.program))
        if written is not None:
            reader.fail(written, exc)
        # An expression of the kind: its cost does not change with the version's, so it was
        # refused with the kind's own rules already; named here all the same.
        where = validations or variables or scope
        assert where is not None, exc
        where.fail(f"{what}: {exc.program.where}: {exc}")


def _entries(loc: Located | None) -> list[Located]:
    return [] if loc is None else [loc.at(index) for index in range(len(loc.value))]


def _validation(loc: Located, index: int, reader: _Reader, names: set[str]) -> Validation:
    raw = loc.value
    name = raw.get("name", f"validations[{index}]")
    if name in names:
        loc.fail(f"{name!r} names another validation of {reader.what} already", "name")
    names.add(name)
    message_expression = None
    if "messageExpression" in raw:
        message_expression = reader.compile(loc.at("messageExpression"), "string")
    reason = StatusReason(raw.get("reason", StatusReason.FORBIDDEN.value))
    program = reader.compile(loc.at("expression"), "bool")
    return Validation(name, program, raw.get("message", "").strip(), message_expression, reason)
