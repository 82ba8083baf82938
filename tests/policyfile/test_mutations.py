"""Adversarial: a policy or a policy test file edited anywhere, to anything, loads or is refused
with one line naming the file; the code after the schema never meets a value the schema let
through but cannot read (a crash), and the schema's wording never fails (bounded by the
hypothesis profile, docs/development.md#property-tests)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, note
from hypothesis import strategies as st

from gatekeeper.errors import ConfigError
from gatekeeper.policy import Policy
from gatekeeper.policyfile import parse_policy
from gatekeeper.policytest import MalformedTest, load_test_file
from tests.paths import REPO

BASES = [
    yaml.safe_load((REPO / "gatekeeper" / "policies" / "default.yaml").read_text()),
    yaml.safe_load((REPO / "tests" / "policy" / "rules" / "rules.yaml").read_text()),
]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from(["", "v1", "get", "spec.driver", "NodeLocal", "Cluster", "*", "a/b"])
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document, the top aside."""
    found = [at] if at else []
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(paths(value, (*at, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(paths(value, (*at, index)))
    return found


def edited(doc: Any, at: tuple[Any, ...], value: Any, delete: bool) -> Any:
    doc = yaml.safe_load(yaml.safe_dump(doc))  # a copy
    parent = doc
    for step in at[:-1]:
        parent = parent[step]
    if delete:
        del parent[at[-1]]
    else:
        parent[at[-1]] = value
    return doc


@st.composite
def mutations(draw: st.DrawFn) -> str:
    doc = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 3))):
        places = paths(doc)
        at = draw(st.sampled_from(places))
        doc = edited(doc, at, draw(VALUES), draw(st.booleans()))
    return yaml.safe_dump(doc, sort_keys=False)


@given(mutations())
def test_an_edited_policy_loads_or_is_refused_in_one_line(text: str) -> None:
    note(text)
    try:
        policy = parse_policy(text, "m.yaml", directory=str(REPO / "tests" / "policy" / "rules"))
    except ConfigError as exc:
        error = str(exc)  # this file, or one it includes (the packaged default, here)
        assert error.startswith("m.yaml") or error.endswith("(included by m.yaml)"), error
        assert "\n" not in error
        return
    assert isinstance(policy, Policy) and policy.kinds


TEST_BASE = yaml.safe_load((REPO / "policies" / "node-dash_test.yaml").read_text())


@st.composite
def edited_test_files(draw: st.DrawFn) -> str:
    doc = TEST_BASE
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(paths(doc)))
        doc = edited(doc, at, draw(VALUES), draw(st.booleans()))
    return yaml.safe_dump(doc, sort_keys=False)


@given(edited_test_files())
def test_an_edited_test_file_loads_or_is_malformed_in_one_line(text: str) -> None:
    note(text)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m_test.yaml"
        path.write_text(text)
        shutil.copy(REPO / "policies" / "node-dash.yaml", Path(folder) / "node-dash.yaml")
        try:
            load_test_file(str(path))
        except MalformedTest as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc), str(exc)
