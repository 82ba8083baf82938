"""The JSON Schemas (gatekeeper/policyfile/*.schema.json, linked from schemas/ for editors and
CI) are the one definition of both file formats: the loaders validate with them. Every file of
the repo passes; the values the code reads as Enums are the schema's; every keyword and pattern
the schemas use is worded by the loader; and every refusal of the loader's tables is a refusal
of the schema too, or is named below as one a schema cannot express."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gatekeeper.policy.build import ALLOCATION_KEYS
from gatekeeper.policy.cel import StatusReason
from gatekeeper.policy.model import (
    ALL_VERBS,
    ALLOCATED_VERBS,
    ENCODINGS,
    OWN_NODE_VERBS,
    POOL_SEPARATORS,
    RULE_VERBS,
    Field,
    KindRule,
    ListSelectorMode,
    Scope,
    UnboundTokens,
)
from gatekeeper.policyfile import API_VERSION, schema
from gatekeeper.policyfile._schema import KEYWORDS
from tests.policy import test_loader_immutable
from tests.policyfile import test_policy_files as test_loader

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


def test_the_repository_links_the_schemas_the_gatekeeper_ships() -> None:
    """schemas/ (what editors and the files' first lines name) is the packaged schema itself."""
    for name in ("policy", "policytest"):
        link = REPO / "schemas" / f"{name}.schema.json"
        assert link.is_symlink()
        assert link.resolve() == REPO / "gatekeeper" / "policyfile" / f"{name}.schema.json"
        assert json.loads(link.read_text()) == schema(name)


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


def enum(node: dict[str, Any]) -> set[str]:
    return set(node["enum"]) if "enum" in node else {node["const"]}


def rule_branch(rule: KindRule) -> dict[str, Any]:
    (branch,) = [
        b
        for b in POLICY_SCHEMA["$defs"]["kind"]["allOf"]
        if b["if"]["properties"]["rule"]["const"] == rule.value
    ]
    return branch["then"]


def rule_verbs(rule: KindRule) -> set[str]:
    """The verbs the schema allows a kind under ``rule`` (all, where it narrows none)."""
    for part in rule_branch(rule).get("allOf", []):
        if "verbs" in part.get("properties", {}):
            return enum(part["properties"]["verbs"]["items"])
    return set(ALL_VERBS)


def test_the_values_the_code_reads_as_enums_are_the_schemas() -> None:
    defs = POLICY_SCHEMA["$defs"]
    props = defs["kind"]["properties"]
    assert POLICY_SCHEMA["properties"]["apiVersion"]["const"] == API_VERSION
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
    reason = defs["celValidations"]["items"]["properties"]["reason"]
    assert enum(reason) == {r.value for r in StatusReason}
    assert set(defs["allocatedVersion"]["required"]) == {"names", *ALLOCATION_KEYS}
    assert rule_verbs(KindRule.ALLOCATED_TO_DRIVER) == ALLOCATED_VERBS
    assert rule_verbs(KindRule.OWN_NODE) == rule_verbs(KindRule.OWN_POD) == OWN_NODE_VERBS
    for rule in KindRule:
        assert rule_verbs(rule) == RULE_VERBS[rule], rule


def keywords(node: Any) -> Iterator[str]:
    """Every keyword a schema uses (the values of enum, const and the like aside)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            if key in ("properties", "$defs", "patternProperties", "dependentRequired"):
                for sub in value.values():
                    yield from keywords(sub)
            elif key not in ("enum", "const", "required", "x-messages"):
                yield from keywords(value)
    elif isinstance(node, list):
        for item in node:
            yield from keywords(item)


def subschemas(node: Any, worded: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every schema object, and whether an ``anyOf`` above it has a title (which words the
    refusal of a scalar in any of its branches)."""
    if isinstance(node, dict):
        yield node, worded
        for key, value in node.items():
            if key not in ("enum", "const", "required", "x-messages"):
                yield from subschemas(value, worded or (key == "anyOf" and "title" in node))
    elif isinstance(node, list):
        for item in node:
            yield from subschemas(item, worded)


@pytest.mark.parametrize("schema", [POLICY_SCHEMA, TEST_SCHEMA], ids=["policy", "policytest"])
def test_every_keyword_and_pattern_the_schemas_use_is_worded(schema: dict[str, Any]) -> None:
    """A keyword the loader does not word would reach users as jsonschema's own text; a pattern
    without a title or patternErrorMessage as a regular expression."""
    used = set(keywords(schema)) - {"description", "title", "patternErrorMessage", "x-messages"}
    assert used - KEYWORDS == set()
    for node, worded in subschemas(schema):
        if "pattern" in node:
            assert worded or "patternErrorMessage" in node or "title" in node, node
        if "then" in node and "x-messages" not in node["then"]:
            assert "title" in node["if"], node["if"]


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
    "no-kinds": "kinds may be defined by included files",
}
REFUSALS = [
    *((case[0], case[1]) for case in test_loader.INVALID),
    *((case[0], case[1]) for case in test_loader_immutable.REFUSED),
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
        test_loader_immutable.policy("resource.k8s.io"),
        test_loader_immutable.policy(
            "example.com", extra="    apiserverImmutableConfirmed: widgets.example.com\n"
        ),
    ):
        assert errors(POLICY_SCHEMA, yaml.safe_load(text)) == []
