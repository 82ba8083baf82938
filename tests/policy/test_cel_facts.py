"""What an expression reads comes from its checked tree, never from its text: a comment, a string,
an escape or a comprehension's own variable that spells ``oldObject`` or ``variables.x`` reads
nothing, and the admission-policy export renames only what the tree names."""

from __future__ import annotations

import pytest

from gatekeeper.policy.admissionpolicy import export_policy
from gatekeeper.policy.cel import CelRules, Program, Variable, compile_program
from gatekeeper.policy.cel._ast import NodeKind, read_checked
from gatekeeper.policy.cel._env import BUILT_INS
from gatekeeper.policy.cel._rewrite import references, rewrite
from gatekeeper.policyfile import parse_policy
from tests.policy.test_cel import POLICY

VARIABLES = {**BUILT_INS, "x": "string", "y": "dyn"}


def program(source: str) -> Program:
    return compile_program(source, "test", variables=VARIABLES, result="any")


@pytest.mark.parametrize(
    ("source", "stored"),
    [
        ("object.spec == oldObject.spec", True),
        ("oldObject == null", True),
        ("object.a == 'oldObject'", False),
        ('object.a == "oldObject.spec"', False),
        ("object.a == '''oldObject'''", False),
        ('object.a == r"\\oldObject"', False),
        ("object.a == 'it\\'s oldObject'", False),
        ('object.a == "a \\" oldObject"', False),
        ("object.a == b'oldObject'", False),
        ("object.a // oldObject is not read\n == 'x'", False),
        ("object.a // devices can't change once created\n == 'x' || oldObject == null", True),
        ("// it's\noldObject == null", True),
        ("[1].all(oldObject, oldObject > 0)", False),  # a comprehension's own variable
        ("[1].all(o, o > 0) && oldObject == null", True),
        ("object.a == 'x' // oldObject", False),
    ],
)
def test_whether_an_expression_reads_the_stored_object(source: str, stored: bool) -> None:
    """The issue this closes: with a regex that strips strings but not comments, an
    apostrophe in a comment hid ``oldObject`` after it, the update was planned without reading
    the stored object, and a rule ``oldObject == null || …`` held."""
    assert program(source).reads_stored is stored


@pytest.mark.parametrize(
    ("source", "read"),
    [
        ("variables.x == 'a'", {"x"}),
        ("variables.x == 'variables.y'", {"x"}),
        ("variables.x + \"variables.y\" == ''", {"x"}),
        ("variables.x == '' // variables.y\n", {"x"}),
        ("variables.x == ''\n// it's variables.y\n|| variables.node == ''", {"x", "node"}),
        ("[variables.y].all(variables, variables != null)", {"y"}),
        ("variables   .   x == ''", {"x"}),
        ("variables.\n// a comment between\nx == ''", {"x"}),
    ],
)
def test_which_variables_an_expression_reads(source: str, read: set[str]) -> None:
    assert program(source).variables == read


def test_the_checked_tree_is_the_runtimes() -> None:
    """The reader gives the tree the runtime checked: qualified names resolved, types."""
    compiled = program("variables.x.startsWith(object.spec.?pool.orValue('')) && 1u > 0u")
    checked = compiled.checked
    names = {checked.references.get(n.id) for n in checked.root.walk() if n.kind is NodeKind.IDENT}
    assert {"variables.x", "object"} <= names
    assert str(checked.type_of(checked.root)) == "bool"
    consts = [n.value for n in checked.root.walk() if n.kind is NodeKind.CONST]
    assert {1, "pool", ""} <= set(consts)
    again = read_checked(compiled.compiled.serialize())
    assert again.root == checked.root


@pytest.mark.parametrize(
    ("source", "renamed"),
    [
        ("object.a == 'object.a'", "oldObject.a == 'object.a'"),
        ("object.a == 'x' // object is renamed, not in here\n", None),
        ("[object].all(o, o.a == 'object')", "[oldObject].all(o, o.a == 'object')"),
        ("[1].all(object, object > 0) && object.a == ''", None),
        ("has(object.a) && object.?b.orValue('') == \"it's\"", None),
        ("object\n.a == ''", "oldObject\n.a == ''"),
    ],
)
def test_renaming_for_the_export_changes_only_what_the_tree_names(
    source: str, renamed: str | None
) -> None:
    compiled = program(source)
    out = rewrite(compiled, lambda name: ("oldObject", frozenset()) if name == "object" else None)
    if renamed is None:  # the same rewrite, checked against the tree
        expected = source
        for reference in reversed(references(compiled) or []):
            if reference.name == "object":
                expected = expected[: reference.start] + "oldObject" + expected[reference.end :]
        renamed = expected
    assert out == renamed
    assert "oldObject" not in compiled.names
    assert program(renamed).reads_stored


def test_qualified_names_are_placed_whole() -> None:
    compiled = program("variables . x == '' && request.userInfo.username == variables.node")
    found = [(r.name, compiled.source[r.start : r.end]) for r in references(compiled) or []]
    assert found == [
        ("variables.x", "variables . x"),
        ("request.userInfo.username", "request.userInfo.username"),
        ("variables.node", "variables.node"),
    ]


def test_an_inlined_variable_a_comprehension_would_capture_is_not_exported() -> None:
    """Inlining ``variables.v`` (which reads ``object``) inside ``.all(object, …)`` would bind
    it to the comprehension's own variable: that validation is left out of the export, named,
    instead of exported wrong."""
    keys = """\
    variables:
      - name: v
        expression: "object == null ? '' : object.spec.pool.name"
    validations:
      - name: captured
        expression: "[1].all(object, variables.v != '')"
      - name: fine
        expression: "variables.v != '' // object.spec is not read here\\n"
"""
    policy = parse_policy(POLICY.format(kind_keys=keys, version_keys=""), "p.yaml")
    export = export_policy(policy)
    skipped = [item.where for item in export.not_exported]
    assert skipped == ["resourceslices.resource.k8s.io v1beta2, v1 captured"]
    assert "comprehension variable" in export.not_exported[0].why
    fine = [e.expression for e in export.validations if "validation fine" in e.protects]
    assert fine and "(object == null ? '' : object.spec.pool.name) != ''" in fine[0]


def test_rules_analysed_when_made() -> None:
    x = program("object.spec.a")
    rules = CelRules((Variable("x", x),), ())
    assert rules.analysis is not None and not rules.reads_stored
