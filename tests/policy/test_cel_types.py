"""CEL is typed at load: the built-in variables (strings, or a string or null), ``request``'s
fields, the policy's own variables (the type their expression checks to), and the result a key
wants (a validation and a scope: bool; a messageExpression: string). A fault is a load error
naming the file, the line and column in the YAML file, the key path and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policyfile import load_policy, parse_policy
from tests.policy.test_cel import POLICY


def text_of(keys: str) -> str:
    """The policy of test_cel.py with ``keys`` (indented as a kind's) on its kind."""
    return POLICY.format(kind_keys=keys, version_keys="")


def load(keys: str) -> None:
    parse_policy(text_of(keys), "p.yaml")


def position(text: str, marker: str) -> str:
    """``line:column`` (1-based) of ``marker`` in ``text``."""
    index = text.index(marker)
    line = text.count("\n", 0, index) + 1
    return f"{line}:{index - (text.rfind(chr(10), 0, index) + 1) + 1}"


def refused(keys: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(keys)
    return str(caught.value)


@pytest.mark.parametrize(
    ("keys", "marker", "message"),
    [
        (
            "    validations:\n      - expression: variables.node + 6 == 'x'\n",
            "+ 6",
            "found no matching overload for '_+_' applied to '(string, int)'",
        ),
        (
            "    validations:\n      - expression: \"variables.node + '-x'\"\n",
            "variables.node + '-x'",
            "must evaluate to a bool, not string",
        ),
        (
            "    validations:\n      - expression: 'true'\n        messageExpression: '1 == 1'\n",
            "1 == 1",
            "must evaluate to a string, not bool",
        ),
        (
            "    variables:\n      - name: count\n        expression: size(object.spec.devices)\n"
            "    validations:\n      - expression: variables.count.startsWith('a')\n",
            "('a')",  # a call is placed at its parenthesis
            "found no matching overload for 'startsWith' applied to '(int, string)'",
        ),
        (
            "    validations:\n      - expression: request.operation + 1 == 'x'\n",
            "+ 1",
            "found no matching overload for '_+_' applied to '(string, int)'",
        ),
        (
            "    validations:\n      - expression: request.operaton == 'CREATE'\n",
            "request.operaton",
            "request has no field operaton (fields: dryRun, kind, name, namespace, operation, "
            "options, requestKind, requestResource, requestSubResource, resource, subResource, "
            "userInfo)",
        ),
        (
            "    validations:\n      - expression: request.kind.knd == 'x'\n",
            "request.kind",
            "request.kind has no field knd (fields: group, version, kind)",
        ),
        (
            "    validations:\n      - expression: request.userInfo == {}\n",
            "request.userInfo",
            "request.userInfo is read by its fields (fields: extra, groups, uid, username)",
        ),
        (
            "    validations:\n      - expression: variables[?'node'].hasValue()\n",
            "variables",
            "variables is read by name, as variables.<name>",
        ),
        (
            "    validations:\n      - expression: variables.pod + 1 == ''\n",
            "+ 1",
            "found no matching overload for '_+_' applied to '(wrapper(string), int)'",
        ),
        (
            "    validations:\n      - expression: request.userInfo.groups + 'x' == []\n",
            "+ 'x'",
            "found no matching overload for '_+_' applied to '(list(string), string)'",
        ),
    ],
    ids=["node-plus-int", "string-validation", "bool-message", "variable-typed", "request-field",
         "request-typo", "request-kind-typo", "user-info-whole", "variables-by-index",
         "nullable-plus-int", "groups-plus-string"],
)  # fmt: skip
def test_a_type_error_is_a_load_error_at_its_place_in_the_file(
    keys: str, marker: str, message: str
) -> None:
    text = text_of(keys)
    error = refused(keys)
    assert error.startswith(f"p.yaml:{position(text, marker)}: kinds[0]."), error
    assert error.endswith(f"resourceslices.resource.k8s.io: {message}"), error


@pytest.mark.parametrize(
    "expression",
    [
        "variables.pod == null || object.metadata.name == variables.pod",
        "variables.pod != null && variables.pod.startsWith('plugin-') && size(variables.pod) > 1",
        "variables.namespace in ['a', 'b'] || variables.serviceAccount == null",
        "(variables.podUID == null ? '' : variables.podUID) + 'x' != ''",
        "request.kind.kind == 'ResourceSlice' && request.dryRun == false",
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('') != 'x'",
        "'system:authenticated' in request.userInfo.groups",
        "request.options.?force.orValue(false) || true",
    ],
)
def test_the_built_ins_are_typed_as_they_are(expression: str) -> None:
    load(f"    validations:\n      - expression: >-\n          {expression}\n")


def test_a_policy_variable_is_declared_with_its_expressions_type() -> None:
    load(
        "    variables:\n"
        "      - name: prefix\n        expression: variables.node + '/fpga-'\n"
        "      - name: names\n        expression: '[variables.node, variables.driver]'\n"
        "    validations:\n"
        "      - expression: object.spec.pool.name.startsWith(variables.prefix)\n"
        "      - expression: variables.names.all(n, n.size() < 64)\n"
    )
    error = refused(
        "    variables:\n      - name: prefix\n        expression: variables.node + '/fpga-'\n"
        "    validations:\n      - expression: variables.prefix > 1\n"
    )
    assert "found no matching overload for '_>_' applied to '(string, int)'" in error


@pytest.mark.parametrize(
    ("written", "marker"),
    [
        (
            "expression: >-\n          object.spec.pool.name ==\n          variables.node + 6\n",
            "+ 6",
        ),
        (
            "expression: |\n          object.spec.pool.name ==\n            variables.node + 6\n",
            "+ 6",
        ),
        ('expression: "object.spec.pool.name ==\\n  \\"\\" + 6"\n', "+ 6"),
        ("expression: 'object.spec.pool.name == \"it''s\" + 6'\n", "+ 6"),
        ("expression: object.spec.pool.name ==\n          variables.node\n          + 6\n", "+ 6"),
        ("expression: \"object.spec.pool.name == '\\u00e9' + 6\"\n", "+ 6"),
    ],
    ids=["folded", "literal", "double-quoted", "single-quoted", "plain-multiline", "escape"],
)
def test_the_column_is_the_files_in_every_yaml_style(written: str, marker: str) -> None:
    keys = f"    validations:\n      - {written}"
    text = text_of(keys)
    error = refused(keys)
    assert error.startswith(f"p.yaml:{position(text, marker)}: "), (error, text)


def test_an_included_files_expression_is_placed_in_that_file(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        text_of(
            "    validations:\n      - name: bad\n        expression: >\n"
            "          object.spec.pool.name == variables.driver + 6\n"
        )
    )
    (tmp_path / "top.yaml").write_text(
        "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ninclude: [base.yaml]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_policy(str(tmp_path / "top.yaml"))
    base = (tmp_path / "base.yaml").read_text()
    expected = f"{tmp_path / 'base.yaml'}:{position(base, '+ 6')}: kinds[0].validations[0]"
    assert str(caught.value).startswith(expected)
    assert str(caught.value).endswith(f"(included by {tmp_path / 'top.yaml'})")
