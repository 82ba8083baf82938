"""The published JSON Schemas (schemas/*.schema.json, for editors and CI) say what the loaders
check: every file of the repo passes, they know exactly the loaders' keys and values, and every
refusal of the loader's tables is a refusal of the schema too, or is named below as one a schema
cannot express."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gatekeeper.policy import loader, parse_policy
from gatekeeper.policy._expressions import CEL_KEYS, KIND_CEL_KEYS
from gatekeeper.policy._kinds import KIND_KEYS, OVERRIDE_KEYS
from gatekeeper.policy._versions import ALLOCATION_KEYS, VERSION_KEYS
from gatekeeper.policy.model import (
    ALL_VERBS,
    ALLOCATED_VERBS,
    ENCODINGS,
    POOL_SEPARATORS,
    Field,
    KindRule,
    ListSelectorMode,
    Scope,
    UnboundTokens,
)
from gatekeeper.policytest import _model as test_model
from tests.policy import test_loader, test_loader_immutable

REPO = Path(__file__).resolve().parents[2]
POLICY_SCHEMA = json.loads((REPO / "schemas" / "policy.schema.json").read_text())
TEST_SCHEMA = json.loads((REPO / "schemas" / "policytest.schema.json").read_text())
POLICIES = sorted(
    [
        *(REPO / "gatekeeper" / "policies").glob("*.yaml"),
        *(p for p in (REPO / "policies").glob("*.yaml") if not p.name.endswith("_test.yaml")),
        REPO / "deploy" / "policy.yaml",
    ]
)
TEST_FILES = sorted((REPO / "policies").glob("*_test.yaml"))


def errors(schema: dict[str, Any], doc: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@pytest.mark.parametrize("schema", [POLICY_SCHEMA, TEST_SCHEMA], ids=["policy", "policytest"])
def test_the_schemas_are_draft_2020_12(schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", POLICIES, ids=[str(p.relative_to(REPO)) for p in POLICIES])
def test_every_policy_of_the_repo_validates_and_names_the_schema(path: Path) -> None:
    text = path.read_text()
    assert errors(POLICY_SCHEMA, yaml.safe_load(text)) == []
    relative = Path("../" * (len(path.relative_to(REPO).parts) - 1)) / "schemas"
    assert text.startswith(
        f"# yaml-language-server: $schema={relative / 'policy.schema.json'}\n"
    ), "the first line lets editors find the schema"


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_every_policy_test_file_of_the_repo_validates(path: Path) -> None:
    assert errors(TEST_SCHEMA, yaml.safe_load(path.read_text())) == []
    assert path.read_text().startswith(
        "# yaml-language-server: $schema=../schemas/policytest.schema.json\n"
    )


def keys(schema: dict[str, Any], *where: str) -> set[str]:
    node = schema
    for step in where:
        node = node[step]
    return set(node["properties"])


def enum(node: dict[str, Any]) -> set[str]:
    return set(node["enum"]) if "enum" in node else {node["const"]}


def test_the_policy_schema_knows_exactly_the_loaders_keys_and_values() -> None:
    defs = POLICY_SCHEMA["$defs"]
    props = defs["kind"]["properties"]
    assert keys(POLICY_SCHEMA) == loader._TOP_KEYS
    assert keys(defs, "kind") == KIND_KEYS
    assert keys(defs, "override") == OVERRIDE_KEYS
    cel = set(KIND_CEL_KEYS)
    assert keys(defs, "nodeLocalVersion") == VERSION_KEYS | {"names"} | cel
    assert (
        keys(defs, "allocatedVersion") == set(ALLOCATION_KEYS) | {"names", "opaque", "times"} | cel
    )
    assert keys(defs, "ownObjectVersion") == {"names", "mayChange"} | cel
    assert keys(defs, "onNodeVersion") == {"names", "node", "fieldSelectors"} | cel
    assert keys(defs, "namespaceVersion") == {"names"} | cel
    assert keys(defs, "celVersion") == {"names"} | set(CEL_KEYS)
    assert keys(defs, "credentialsVersion") == {"names"}
    assert POLICY_SCHEMA["properties"]["apiVersion"]["const"] == loader.API_VERSION
    assert enum(props["scope"]) == {s.value for s in Scope}
    assert enum(props["rule"]) == {r.value for r in KindRule}
    assert enum(props["listSelector"]) == {m.value for m in ListSelectorMode}
    assert enum(props["verbs"]["items"]) == ALL_VERBS
    assert enum(props["fill"]["items"]) == {f.value for f in Field}
    assert enum(props["poolSeparators"]["items"]) == set(POOL_SEPARATORS)
    assert enum(props["encodings"]["items"]) == set(ENCODINGS)
    assert enum(POLICY_SCHEMA["properties"]["unboundTokens"]) == {u.value for u in UnboundTokens}
    immutable = defs["nodeLocalVersion"]["properties"]["apiserverImmutable"]["items"]
    assert enum(immutable) == {f.value for f in Field}
    allocated = defs["kind"]["allOf"][1]["then"]["allOf"][1]["properties"]["verbs"]["items"]
    assert enum(allocated) == ALLOCATED_VERBS


def test_the_test_schema_knows_exactly_the_test_loaders_keys() -> None:
    defs = TEST_SCHEMA["$defs"]
    assert keys(TEST_SCHEMA) == test_model._FILE_KEYS
    assert keys(defs, "case") == test_model._CASE_KEYS
    assert keys(defs, "request") == test_model._REQUEST_KEYS
    assert keys(defs, "expect") == test_model._EXPECT_KEYS
    forwarded = defs["expect"]["properties"]["forwarded"]["anyOf"][1]
    assert set(forwarded["properties"]) == test_model._FORWARDED_KEYS


# Refusals of the loader that a JSON Schema cannot express, and why.
BEYOND_A_SCHEMA = {
    "kind-twice": "a kind is unique by (group, resource) across list items",
    "duplicate-yaml-key": "YAML itself: a parser keeps the last key before any schema sees it",
    "not-yaml": "YAML syntax",
    "service-account-twice": "an account unique across the lists of every driver",
    "version-named-twice-across-entries": "a version name unique across list items",
    "custom-unconfirmed": "whether a group is built in, and across keys",
    "k8s-io-suffix-is-not-built-in": "whether a group is built in, and across keys",
    "confirmation-of-a-copied-kind": "the confirmation equal to <resource>.<group> of its kind",
    "confirmation-of-nothing": "a key of the kind against keys of its versions",
    "confirmation-in-a-built-in-group": "whether a group is built in",
    "override-adds-it-to-a-custom-kind": "the rule of a kind in another file",
}
REFUSALS = [
    *((case_id, text) for case_id, text, _ in test_loader.INVALID),
    *((case_id, text) for case_id, text, _ in test_loader_immutable.REFUSED),
]


@pytest.mark.parametrize("text", [c[1] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_every_refusal_of_the_loader_is_one_of_the_schema(
    request: pytest.FixtureRequest, text: str
) -> None:
    case_id = request.node.callspec.id
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        assert case_id in BEYOND_A_SCHEMA
        return
    refused = bool(errors(POLICY_SCHEMA, doc))
    assert refused != (case_id in BEYOND_A_SCHEMA), (
        "the schema accepts what the loader refuses" if not refused else "listed needlessly"
    )


def test_the_documents_the_refusals_are_made_from_validate() -> None:
    """Each refusal above is one edit of one of these: the schema refuses that edit."""
    for text in (
        test_loader.GOOD,
        test_loader.CURRENT,
        test_loader_immutable.policy("resource.k8s.io"),
        test_loader_immutable.policy(
            "example.com", extra="    apiserverImmutableConfirmed: widgets.example.com\n"
        ),
    ):
        assert errors(POLICY_SCHEMA, yaml.safe_load(text)) == []


def readme_policies() -> list[str]:
    """The policy examples of README.md's "The policy file"."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## The policy file\n") : readme.index("## Choices where")]
    blocks = section.split("```yaml\n")[1:]
    return [block.split("```")[0] for block in blocks if "kind: Policy" in block]


def test_the_readme_policy_examples_load_and_validate() -> None:
    examples = readme_policies()
    assert len(examples) == 2
    for text in examples:
        policy = parse_policy(text, "README.md")
        assert policy.kinds, text
        assert errors(POLICY_SCHEMA, yaml.safe_load(text)) == [], text
