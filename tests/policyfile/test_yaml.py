"""The one strict YAML loader serves policy files and policy test files alike: lines kept,
duplicate keys refused, merge keys read as YAML defines them (the mapping's own keys win), and
documents that would make later steps crash or hang refused with their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policyfile import (
    MAX_NODES,
    LineDict,
    LineList,
    YamlError,
    line_at,
    load_policy,
    load_yaml,
    parse_policy,
)
from gatekeeper.policytest import MalformedTest, load_test_file
from tests.paths import REPO

HEAD = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\n"
# Two kinds: the second takes the first's keys through a merge key, and overrides three.
MERGED = (
    HEAD
    + """\
kinds:
  - &widgets
    group: example.com
    resource: widgets
    kind: Widget
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch]
    versions: [{names: [v1], driver: spec.driver, node: spec.nodeName}]
  - <<: *widgets
    resource: gadgets
    kind: Gadget
    verbs: [get]
"""
)


def test_lines_are_kept_for_keys_and_items() -> None:
    doc = load_yaml("a:\n  - x\n  - {b: 1}\nc: 2\n")
    assert isinstance(doc, LineDict) and isinstance(doc["a"], LineList)
    assert line_at(doc, ("a",)) == 1 and line_at(doc, ("a", 1)) == 3
    assert line_at(doc, ("a", 1, "b")) == 3 and line_at(doc, ("c",)) == 4
    assert line_at(doc, ("a", 7)) == 1  # absent: the deepest step that exists
    assert line_at(doc, ("nope", "deeper")) == 1


def test_a_key_that_overrides_a_merged_one_is_read_as_yaml_says_in_both_file_kinds(
    tmp_path: Path,
) -> None:
    """A merge key (``<<: *base``) gives the anchor's keys; the mapping's own keys win. The
    policy loader once refused this as a duplicate key while the test loader took it."""
    kinds = parse_policy(MERGED, "p.yaml").kinds
    assert kinds["example.com", "gadgets"].kind == "Gadget"  # its own key over the merged one
    assert kinds["example.com", "gadgets"].verbs == {"get"}
    assert kinds["example.com", "gadgets"].scope.value == "Cluster"  # merged
    assert kinds["example.com", "widgets"].verbs == {"get", "list", "watch"}
    # A test file: the same rule (x- keys are allowed there).
    suite = tmp_path / "merged_test.yaml"
    suite.write_text(
        "policy: packaged:default\nnode: node-a\nx-case: &case\n  driver: gpu.example.com\n"
        "  request: {method: GET, path: /api}\n  expect: {allowed: true}\ncases:\n"
        "  - <<: *case\n    name: one\n  - <<: *case\n    name: two\n"
        "    expect: {allowed: false}\n"
    )
    cases = load_test_file(str(suite)).cases
    assert [(c.name, c.expect.allowed, c.driver) for c in cases] == [
        ("one", True, "gpu.example.com"),
        ("two", False, "gpu.example.com"),
    ]


def test_a_test_file_with_merge_keys_given_as_a_policy_is_named_a_test_file() -> None:
    """``serve --policy policies/node-dash_test.yaml``: once "duplicate key 'spec'"."""
    path = REPO / "policies" / "node-dash_test.yaml"
    assert "<<: *" in path.read_text()
    line = path.read_text().splitlines().index("cases:") + 1
    with pytest.raises(ConfigError) as caught:
        load_policy(str(path))
    assert str(caught.value) == (
        f"{path}:{line}: cases: this is a policy test file (it lists cases), not a policy: a "
        "policy says `kind: Policy`; run a test file with `dra-gatekeeper test`"
    )


# (id, text, line, message): refused alike in a policy and in a test file.
REFUSED = [
    ("duplicate-key", "a: 1\nb: 2\na: 3\n", 3, "not valid YAML: duplicate key 'a'"),
    ("duplicate-merge-key", "a: &a {x: 1}\nb:\n  <<: *a\n  <<: *a\n", 4, "duplicate key '<<'"),
    ("list-as-key", "? [a, b]\n: 1\n", 1, "a key must be a plain value"),
    ("recursive-alias", "a: &a\n  - *a\n", 1, "a value contains itself (a recursive alias)"),
    (
        "alias-bomb",
        "".join(
            f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10) if i else '0'}]\n" for i in range(7)
        ),
        6,
        f"holds more than {MAX_NODES} values once its aliases are expanded",
    ),
    ("python-tag", "a: !!python/object:os.system x\n", 1, "could not determine a constructor"),
    ("two-documents", "a: 1\n---\nb: 2\n", 2, "expected a single document in the stream"),
    ("syntax", "a: [\n", 2, "not valid YAML: while parsing a flow node"),
]


@pytest.mark.parametrize(
    ("text", "line", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_document_yaml_guesses_at_is_refused_in_both_file_kinds(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    with pytest.raises(YamlError) as raised:
        load_yaml(text)
    assert raised.value.line == line and message in raised.value.message
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_policy(str(policy))
    assert str(refused.value).startswith(f"{policy}:{line}: ")
    assert message in str(refused.value)
    suite = tmp_path / "x_test.yaml"
    suite.write_text(text)
    with pytest.raises(MalformedTest) as malformed:
        load_test_file(str(suite))
    assert str(malformed.value) == str(refused.value).replace(str(policy), str(suite))


def test_an_empty_file_is_not_a_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("# nothing\n")
    with pytest.raises(ConfigError) as caught:
        load_policy(str(policy))
    assert str(caught.value) == (
        f"{policy}: must be a dra-gatekeeper policy (apiVersion: dra-gatekeeper.io/v1alpha1, "
        "kind: Policy)"
    )
