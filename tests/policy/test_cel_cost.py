"""CEL cost is bounded by construction: estimated at load from the checked tree (an expression too
costly on the largest object is refused, with its estimate), and bounded per request from the
sizes of the objects at hand before anything is evaluated (over the budget: refused, fail
closed). The bound counts what the runtime does, not only its loops: building lists (``map`` and
``filter`` copy their accumulator), strings, comparisons, regular expressions."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy.cel import COST_LIMIT, REQUEST_BUDGET, CelRules, Validation, compile_program
from gatekeeper.policy.cel._env import BUILT_INS
from gatekeeper.policyfile import parse_policy
from tests.policy.test_cel import POLICY, slice_v1
from tests.policy.test_cel import create as create_slice

DEVICES = "|object.spec.devices|"


def policy(*expressions: str) -> Any:
    """The policy of test_cel.py, each of ``expressions`` a validation of its kind."""
    validations = "".join(
        f"      - name: v{index}\n        expression: >-\n{textwrap.indent(e, ' ' * 10)}\n"
        for index, e in enumerate(expressions)
    )
    text = POLICY.format(kind_keys="    validations:\n" + validations, version_keys="")
    return parse_policy(text, "p.yaml")


def create(loaded: Any, **spec: Any) -> Any:
    """A create of a slice of ``spec`` (test_cel.py's slice, pool ``node-a``)."""
    pool = spec.pop("pool", {"name": "node-a"})["name"]
    return create_slice(loaded, slice_v1(pool=pool, **spec))


@pytest.mark.parametrize(
    ("expression", "grows"),
    [
        ("object.spec.devices.map(d, d.name).size() > 0", f"{DEVICES}·{DEVICES}"),
        ("object.spec.devices.filter(d, has(d.name)).size() >= 0", f"{DEVICES}·{DEVICES}"),
        ("object.spec.devices.all(a, object.spec.devices.exists(b, a == b))", DEVICES),
        ("object.spec.devices.all(d, d.name.matches(object.spec.pool.name))", "spec.pool.name"),
        ("object.spec.pool.name.contains(object.metadata.name)", "|object.metadata.name|"),
    ],
    ids=["map", "filter", "loop-in-loop", "regex-from-the-object", "contains"],
)  # fmt: skip
def test_an_expression_too_costly_on_the_largest_object_is_refused_at_load(
    expression: str, grows: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        policy(expression)
    message = str(caught.value)
    assert message.startswith("p.yaml:14:11: kinds[0].validations[0].expression: "), message
    assert f"over the limit of {COST_LIMIT:.3g} per expression" in message
    assert "may cost up to " in message and "on a 3 MiB object" in message
    assert grows in message


@pytest.mark.parametrize(
    "expression",
    [
        "object.spec.devices.all(d, d.name.startsWith('gpu-'))",
        "object.spec.devices.all(d, d.?attributes.orValue({}).all(k, k.size() < 64))",
        "object.spec.devices.exists_one(d, d.name == 'gpu-0')",
    ],
)
def test_a_loop_over_the_objects_own_parts_is_linear(expression: str) -> None:
    """A loop inside a loop over the element's own list is bounded by the object, not by the
    product of the two lengths: the elements' parts are disjoint."""
    policy(expression)


def test_every_function_of_the_runtime_has_a_cost() -> None:
    samples = [
        "'a' + 'b' == 'ab'", "[1] + [2] == [1, 2]", "1 - 2 * 3 / 4 % 5 < -1", "!true || false",
        "true ? 1 >= 2 : 1 <= 2", "[1][0] == 1 && 1 in [1] && size('a') == 'a'.size()",
        "'abc'.contains('b') && 'abc'.startsWith('a') && 'abc'.endsWith('c')",
        "'abc'.matches('a') && int('1') == 1 && uint('1') == 1u && double('1') == 1.0",
        "string(1) == '1' && bytes('a') == b'a' && bool('true') && type(1) == int && dyn(1) == 1",
        "timestamp('2020-01-01T00:00:00Z').getFullYear() == 2020",
        "duration('1s').getSeconds() == 1",
        "timestamp('2020-01-01T00:00:00Z').getMonth() + timestamp('2020-01-01T00:00:00Z')"
        ".getDayOfMonth() + timestamp('2020-01-01T00:00:00Z').getHours() >= 0",
        "'abc'.charAt(1) == 'b' && 'abc'.indexOf('b') == 1 && 'abc'.lastIndexOf('b', 2) == 1",
        "'AB'.lowerAscii() == 'ab'.upperAscii().lowerAscii() && 'abc'.replace('a', 'b', 1) != ''",
        "'a,b'.split(',').size() == 2 && 'abc'.substring(1, 2) == 'b' && ' a '.trim() == 'a'",
        "['a'].join(',') == 'a' && strings.quote('a') != '' && '%s'.format(['a']) == 'a'",
        "'abc'.reverse() == 'cba' && math.greatest([1, 2]) == math.least(2, 3)",
        "math.ceil(1.5) + math.floor(1.5) + math.round(1.5) + math.trunc(1.5) > 0.0",
        "math.abs(-1) + math.sign(-1) == 0 && !math.isInf(1.0) && !math.isNaN(1.0)",
        "math.isFinite(1.0) && math.bitAnd(1, 2) + math.bitOr(1, 2) + math.bitXor(1, 2) > 0",
        "math.bitNot(1) + math.bitShiftLeft(1, 2) + math.bitShiftRight(1, 2) != 0",
        "math.sqrt(4) == 2.0 && base64.decode(base64.encode(b'a')) == b'a'",
        "optional.of(1).hasValue() && optional.ofNonZeroValue(1).value() == 1",
        "optional.none().or(optional.of(1)).orValue(2) == 1 && {'a': 1}.?a.hasValue()",
        "{'a': 1}[?'a'].hasValue() && [1].exists_one(x, x > 0) && [1].map(x, x > 0, x) == [1]",
        "cel.bind(a, 1, a) == 1 && [1].filter(x, x > 0).size() == 1",
    ]  # fmt: skip
    for sample in samples:
        program = compile_program(sample, "sample", variables=BUILT_INS)
        rules = CelRules(validations=(Validation("s", program),))
        assert rules.analysis is not None, sample


def test_a_request_over_the_budget_is_refused_before_it_is_evaluated() -> None:
    """A linear rule on a legitimate slice holds; on a body with 5,000 devices its bound is over
    the budget and it is refused without being evaluated (the runtime's own iteration limit,
    10,000, is never what stops it)."""
    loaded = policy("object.spec.devices.all(d, d.name.startsWith('gpu-'))")
    devices = [{"name": f"gpu-{i}", "attributes": {"model": {"string": "x"}}} for i in range(128)]
    assert create(loaded, devices=devices).allowed
    refused = create(loaded, devices=[{"name": "gpu-0"}] * 5000)
    assert (refused.allowed, refused.code) == (False, 403)
    assert "v1 CEL cost: the CEL of this request may cost up to " in refused.message
    assert f"{REQUEST_BUDGET:.3g}" == "1e+06"
    assert " over the budget of 1e+06 per request, so it is not evaluated" in refused.message
    assert "a rule that cannot be evaluated refuses the request" in refused.message


def test_a_regular_expression_on_a_long_string_is_bounded_by_both_lengths() -> None:
    loaded = policy("object.spec.pool.name.matches('^node-a(/[a-z0-9-]+)*$')")
    assert create(loaded).allowed
    refused = create(loaded, pool={"name": "node-a/" + "a" * 100_000})
    assert not refused.allowed and "over the budget" in refused.message


def test_the_cost_of_the_objects_themselves_is_counted() -> None:
    """Converting an object into the runtime costs with its size: a rule comparing a large
    part whole is refused for a large body, even though the comparison itself is one call."""
    loaded = policy("object.spec.devices == object.spec.devices")
    assert create(loaded, devices=[{"name": "a"}]).allowed
    refused = create(loaded, devices=[{"name": "a" * 1000}] * 100)
    assert not refused.allowed and "over the budget" in refused.message
