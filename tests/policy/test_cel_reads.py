"""An object is given to the runtime cut to what the expressions read of it (a 2 KB slice converts
in a fraction of the time): checked differentially against the runtime itself, every expression
gives on the cut object exactly what it gives on the whole one (a value, or an error); and
numbers are read as Go's JSON reads them at the apiserver."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gatekeeper.policy.cel import (
    CelRules,
    EvaluationError,
    Validation,
    Variable,
    activation,
    compile_program,
    evaluate,
)
from gatekeeper.policy.cel._cut import ReadError, go_numbers
from gatekeeper.policy.cel._env import BUILT_INS
from gatekeeper.policy.cel._run import _direct_hold, _projected, bindings

EXPRESSIONS = [
    "object.spec.name",
    "object.spec.?name.orValue('none')",
    "has(object.spec.a) && object.spec.a != null",
    "object.spec.items.size()",
    "object.spec.items.all(i, has(i.name) ? i.name != '' : true)",
    "object.spec.items.exists(i, i.?a.?b.orValue(0) == 1)",
    "object.spec.items.map(i, i.name)",
    "object.spec.items.filter(i, has(i.a))",
    "object.spec.items[0]",
    "object.spec.items[0].name",
    "'x' in object.spec.items",
    "object.spec == oldObject.spec",
    "(object.spec.a == 1 ? object : oldObject).spec.name",
    "cel.bind(s, object.spec, s.name + s.?a.orValue(''))",
    "object.spec.a.all(k, k.startsWith('n'))",
    "object.spec.a[object.spec.name]",
    "variables.spec.name",
    "variables.spec.items.exists_one(i, i == variables.spec.name)",
    "type(object.spec.a) == map",
    "type(object.spec.items)",
    "object.spec.a == null ? 'none' : object.spec.name",
    "null != object.spec.items && object.spec.b != null",
    "object.spec.a.name.b",
]
_KEYS = st.sampled_from(["spec", "name", "a", "b", "items", "x"])
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", "name", "n1"]),
)
_JSON = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=25,
)
_OBJECTS = st.fixed_dictionaries(
    {"spec": st.dictionaries(_KEYS, _JSON, max_size=5)}, optional={"metadata": _JSON}
)


def _rules() -> CelRules:
    variables = {**BUILT_INS, "spec": "dyn"}
    spec = compile_program("object.spec", "v", variables=BUILT_INS, result="any")
    validations = tuple(
        Validation(f"v{index}", compile_program(source, source, variables=variables, result="any"))
        for index, source in enumerate(EXPRESSIONS)
    )
    return CelRules((Variable("spec", spec),), validations)


# map() and filter() over a list of the object cost its square: refused at load, on their own.
with patch("gatekeeper.policy.cel._analysis.COST_LIMIT", float("inf")):
    RULES = _rules()


def _outcome(program: Any, data: dict[str, Any]) -> Any:
    try:
        return ("value", evaluate(program, activation(data)))
    except EvaluationError:
        return ("error", None)


def _evaluate_all(obj: Any, old: Any) -> list[Any]:
    assert RULES.analysis is not None
    names = RULES.analysis.names
    data = bindings(names, obj, old, {}, {"node": "n"})
    spec = _outcome(RULES.variables[0].program, data)
    if spec[0] == "value":
        data["variables.spec"] = spec[1]
    return [_outcome(validation.program, data) for validation in RULES.validations]


@given(_OBJECTS, _OBJECTS)
def test_every_expression_gives_the_same_on_the_cut_objects(obj: Any, old: Any) -> None:
    assert RULES.analysis is not None
    try:
        whole = go_numbers(obj), go_numbers(old)
    except ReadError:
        return  # a number beyond a float64: refused before anything is evaluated
    with patch("gatekeeper.policy.cel._run.REQUEST_BUDGET", float("inf")):
        cut, _ = _projected(
            RULES.analysis, RULES.analysis.plan, {"object": obj, "oldObject": old}, []
        )
    assert _evaluate_all(cut["object"], cut["oldObject"]) == _evaluate_all(*whole)


def test_a_cut_slice_keeps_only_what_is_read() -> None:
    rules = CelRules(
        validations=(
            Validation(
                "names",
                compile_program(
                    "object.spec.devices.all(d, d.name.startsWith('gpu-')) && "
                    "has(object.metadata.labels) && object.spec.pool.name != ''",
                    "names",
                    variables=BUILT_INS,
                ),
            ),
        )
    )
    assert rules.analysis is not None
    body = {
        "metadata": {"name": "s", "labels": {"a": "b" * 1000}},
        "spec": {
            "pool": {"name": "p", "generation": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": {"x": {"int": i}}} for i in range(3)],
            "driver": "d" * 10_000,
        },
    }
    cut, _ = _projected(
        rules.analysis, rules.analysis.plan, {"object": body, "oldObject": None}, []
    )
    assert cut["object"] == {
        "metadata": {"labels": {}},
        "spec": {"devices": [{"name": "gpu-0"}, {"name": "gpu-1"}, {"name": "gpu-2"}],
                 "pool": {"name": "p"}},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2**63 - 1, 2**63 - 1),
        (-(2**63), -(2**63)),
        (2**63, float(2**63)),  # Go: does not fit int64, a float64
        (2**100, float(2**100)),
        ({"a": [1, 2**64, {"b": -(2**70)}]}, {"a": [1, float(2**64), {"b": float(-(2**70))}]}),
        (True, True),
        (1.5, 1.5),
    ],
)
def test_numbers_are_read_as_gos_json_reads_them(value: Any, expected: Any) -> None:
    converted = go_numbers(value)
    assert converted == expected and type(converted) is type(expected)


def test_a_number_beyond_a_float64_is_refused() -> None:
    with pytest.raises(ReadError, match="beyond a float64"):
        go_numbers({"a": [10**400]})


DIRECT = CelRules(
    validations=tuple(
        Validation(f"v{index}", compile_program(source, source, variables=BUILT_INS))
        for index, source in enumerate(
            [
                "object.spec.items.all(i, i.name.startsWith('n') || i.name == 1)",
                "object.spec.items.size() < 4",
                "object.spec.items.exists(item, item.name != '')",
                "has(object.spec.a) ? object.spec.a != 'x' : true",
                "object.spec.?b.orValue(1) != 2",
                "object.metadata == null || object.metadata != oldObject.?metadata.orValue(1)",
                "variables.node == 'n' && (oldObject == null || oldObject.spec != object.spec.b)",
            ]
        )
    )
)
"""Validations the fast path binds the values of: chains of selects, a list read through one
field of its elements, ``has()``, an optional select, whole objects."""


_ITEMS = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"name": st.one_of(st.sampled_from(["n1", "name", "", "x"]), _LEAVES)},
            optional={"a": _JSON},
        ),
        _JSON,
    ),
    max_size=5,
)
_NAMED = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["n1", "name", "", 1, 2**70])}, optional={"a": _JSON}
    ),
    max_size=4,
)
_FITTING = st.fixed_dictionaries(
    {
        "metadata": _JSON,
        "spec": st.fixed_dictionaries({"items": _NAMED | _ITEMS, "a": _LEAVES, "b": _JSON}),
    }
)


@given(_FITTING | _OBJECTS, st.none() | _FITTING | _OBJECTS)
def test_the_values_read_bound_on_their_own_give_what_the_whole_objects_give(
    obj: Any, old: Any
) -> None:
    """The fast path binds each value the validations read on its own (``object.spec.items``
    cut to its elements' names, the validations reading ``i`` for ``i.name``): they all hold
    there exactly when they all hold on the whole objects (objects it does not fit, a path that
    is not there, are cut as usual)."""
    analysis = DIRECT.analysis
    assert analysis is not None and analysis.direct is not None
    together = analysis.direct.together.source
    assert "i.name" not in together and "object." not in together, together
    try:
        whole = go_numbers(obj), go_numbers(old)
    except ReadError:
        return
    data = bindings(analysis.names, *whole, {}, {"node": "n"})
    holds = all(_outcome(v.program, data) == ("value", True) for v in DIRECT.validations)
    with patch("gatekeeper.policy.cel._run.REQUEST_BUDGET", float("inf")):
        objects = {"object": obj, "oldObject": old}
        held = _direct_hold(analysis, analysis.direct, objects, {}, {"node": "n"})
    if held is not None:
        assert held is holds
