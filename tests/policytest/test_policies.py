"""The shipped policies and their tests: one default policy, the packaged one, tested from
``policies/`` by name; every rule of it has an allowed and a refused case; every policy for a
real driver covers what it writes itself; and ``dra-gatekeeper test policies/`` passes."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from gatekeeper.cli.main import main
from gatekeeper.errors import Refusal
from gatekeeper.policy import KindRule
from gatekeeper.policy.model import ALL_VERBS, KindSpec
from gatekeeper.policyfile import load_policy
from gatekeeper.policytest import TestFile, load_test_file
from gatekeeper.request.requestinfo import parse_request

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
# The policies for real drivers (docs/policy.md, "Policies for real drivers"), each with its
# <name>_test.yaml.
DRIVER_POLICIES = (
    "dra-example-driver",
    "nvidia-gpu",
    "dranet",
    "intel-gaudi",
    "node-owned-slices",
    "fpga-pools",
)


def test_the_default_policy_exists_once_and_its_tests_name_it() -> None:
    """No copy of the packaged default to keep equal: the policies that build on it include
    it, and its tests name it (``packaged:default``)."""
    environment = Path(sys.prefix).resolve()  # the running venv may be in the clone
    defaults = [
        p for p in REPO.rglob("default.yaml") if not p.resolve().is_relative_to(environment)
    ]
    assert defaults == [REPO / "gatekeeper" / "policies" / "default.yaml"]
    assert load_test_file(str(POLICIES / "default_test.yaml")).policy_path == "packaged:default"
    for name in (
        "node-dash.yaml",
        "new-kind-example.yaml",
        *(f"{d}.yaml" for d in DRIVER_POLICIES),
    ):
        assert "include: [packaged:default]" in (POLICIES / name).read_text(), name
    assert "include: [packaged:default]" in (REPO / "deploy" / "policy.yaml").read_text()
    assert load_policy("packaged:default") == load_policy(None)


def _pattern_text(pattern: re.Pattern[str] | None) -> str:
    return "" if pattern is None else pattern.pattern.replace("\\", "")


def uncovered(test_file: TestFile) -> list[str]:
    """The rules of the test file's policy that lack an allowed or a refused case.

    Rules: each kind x version x verb (allowed and refused when the kind allows the verb,
    refused otherwise); each ownership and forbidden path of each NodeLocal version named by a
    refusal; for AllocatedToDriver versions an out-of-scope 404 and a refused foreign-entry
    write; discovery allowed and refused.
    """
    outcomes: dict[tuple[str, str, str, str], set[bool]] = defaultdict(set)
    reasons: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    codes: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    discovery: set[bool] = set()
    for case in test_file.cases:
        try:
            info = parse_request(case.request.method, case.request.target)
        except Refusal:
            continue  # refused before any rule: not a rule's case
        if not info.is_resource_request:
            discovery.add(case.expect.allowed)
            continue
        key = (info.api_group, info.resource, info.api_version)
        outcomes[(*key, info.verb)].add(case.expect.allowed)
        if not case.expect.allowed:
            reasons[key].append(_pattern_text(case.expect.reason))
            if case.expect.code is not None:
                codes[key].add(case.expect.code)
    missing: list[str] = []
    for kind in test_file.policy.kinds.values():
        for version, spec in kind.versions.items():
            key = (kind.group, kind.resource, version)
            where = f"{kind.qualified} {version}"
            for verb in sorted(ALL_VERBS):
                wanted = {True, False} if verb in kind.verbs else {False}
                for allowed in sorted(wanted - outcomes[(*key, verb)]):
                    missing.append(f"{where} {verb}: no {'allowed' if allowed else 'refused'} case")
            if kind.rule is KindRule.ALLOCATED_TO_DRIVER:
                if 404 not in codes[key]:
                    missing.append(f"{where}: no out-of-scope (404) case")
                if not any("differs from the stored object" in r for r in reasons[key]):
                    missing.append(f"{where}: no refused write of another driver's entry")
                continue
            for path in (*spec.paths.values(), *spec.forbidden):
                dotted = ".".join(path)
                if not any(dotted in reason for reason in reasons[key]):
                    missing.append(f"{where}: no refusal names {dotted}")
    for allowed in sorted({True, False} - discovery):
        missing.append(f"discovery: no {'allowed' if allowed else 'refused'} case")
    return missing


def test_every_rule_of_the_default_policy_has_an_allowed_and_a_refused_case() -> None:
    test_file = load_test_file(str(POLICIES / "default_test.yaml"))
    assert test_file.policy.kinds == load_policy(None).kinds
    assert uncovered(test_file) == []


@pytest.mark.parametrize(
    ("dropped", "reported"),
    [
        (r"^slice v1beta2 delete own", "resourceslices.resource.k8s.io v1beta2 delete: no allowed"),
        (r"^pool watch pinned to", "devicepools.devmgmtproto.k8s.io v1alpha1 watch: no refused"),
        (
            r"^claim v1 (update status of another|patch of its spec)",
            "claims.resource.k8s.io v1: no",
        ),
        (
            r"^slice v1alpha2 (create for|delete|watch of) another node",
            "v1alpha2: no refusal names nodeName",
        ),
        (r"^discovery (GET|HEAD)", "discovery: no allowed case"),
    ],
)
def test_the_coverage_check_reports_a_rule_without_cases(dropped: str, reported: str) -> None:
    test_file = load_test_file(str(POLICIES / "default_test.yaml"))
    kept = tuple(c for c in test_file.cases if not re.search(dropped, c.name))
    assert len(kept) < len(test_file.cases)
    missing = uncovered(dataclasses.replace(test_file, cases=kept))
    assert any(line.startswith(reported) or reported in line for line in missing), missing


def test_the_policies_folder_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", str(POLICIES)])
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"[1-9][0-9]* passed, 0 failed", out[-1]), out[-5:]
    assert code == 0
    files = {line.split()[1].rsplit(":", 1)[0] for line in out if line.startswith("PASS")}
    assert {Path(f).name for f in files} == {
        "default_test.yaml",
        "node-dash_test.yaml",
        "new-kind-example_test.yaml",
        *(f"{name}_test.yaml" for name in DRIVER_POLICIES),
    }


def written_entries(test_file: TestFile) -> list[KindSpec]:
    """The kind entries the test file's policy file writes itself (its ``kinds`` and
    ``overrides``); what it includes unchanged is covered by that file's own tests."""
    raw = yaml.safe_load(Path(test_file.policy_path).read_text())
    entries: list[KindSpec] = []
    for item in (*(raw.get("kinds") or ()), *(raw.get("overrides") or ())):
        kind = test_file.policy.kinds[(item["group"], item["resource"])]
        rule = item.get("rule")
        entries += [e for e in kind.entries if rule is None or e.rule.value == rule]
    return entries


_WRITES = frozenset({"create", "update", "patch", "delete"})


def _validation_names(entry: KindSpec) -> set[str]:
    """The validations that can refuse a request of ``entry``: its named ones, and rule CEL's
    scope where it allows a write (a read out of scope is filtered, or absent: a 404)."""
    names = {v.name for spec in entry.versions.values() for v in spec.cel.validations}
    if entry.rule is KindRule.CEL and entry.verbs & _WRITES:
        names.add("scope")
    return names


def uncovered_written(test_file: TestFile) -> list[str]:
    """What the entries the policy file writes lack: an allowed case for each verb an entry
    allows, a refused case for each entry (its rule refusing one of its own verbs), a refused
    case for a verb the resource does not allow, and a case refused by each named validation
    (``scope`` for rule CEL)."""
    allowed: set[tuple[str, str, str, str]] = set()
    refused: set[tuple[str, str, str]] = set()
    refused_outside: set[tuple[str, str]] = set()
    validations: dict[tuple[str, str], set[str]] = defaultdict(set)
    for case in test_file.cases:
        try:
            info = parse_request(case.request.method, case.request.target)
        except Refusal:
            continue
        kind = test_file.policy.kind_for(info.api_group, info.resource) if info.resource else None
        if kind is None:
            continue
        entry = kind.for_verb(info.verb)
        key = (kind.group, kind.resource)
        if info.verb not in entry.verbs:
            if not case.expect.allowed:
                refused_outside.add(key)
        elif case.expect.allowed:
            allowed.add((*key, entry.rule.value, info.verb))
        else:
            refused.add((*key, entry.rule.value))
            if case.expect.validation:
                validations[key].add(case.expect.validation)
    missing: list[str] = []
    entries = written_entries(test_file)
    for entry in entries:
        key, where = (entry.group, entry.resource), f"{entry.qualified} ({entry.rule.value})"
        for verb in sorted(entry.verbs):
            if (*key, entry.rule.value, verb) not in allowed:
                missing.append(f"{where} {verb}: no allowed case")
        if entry.verbs and (*key, entry.rule.value) not in refused:
            missing.append(f"{where}: no refused case")
        for name in sorted(_validation_names(entry) - validations[key]):
            missing.append(f"{where}: no case refused by validation {name}")
    for key in dict.fromkeys((entry.group, entry.resource) for entry in entries):
        kind = test_file.policy.kinds[key]
        if kind.all_verbs != ALL_VERBS and key not in refused_outside:
            missing.append(f"{kind.qualified}: no refused case of a verb it does not allow")
    return missing


@pytest.mark.parametrize("name", DRIVER_POLICIES)
def test_a_driver_policy_covers_what_it_writes(name: str) -> None:
    test_file = load_test_file(str(POLICIES / f"{name}_test.yaml"))
    assert test_file.policy_path == str(POLICIES / f"{name}.yaml")
    text = (POLICIES / f"{name}.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=../schemas/policy.schema.json\n")
    assert "include: [packaged:default]" in text
    assert uncovered_written(test_file) == []


@pytest.mark.parametrize(
    ("name", "dropped", "reported"),
    [
        (
            "nvidia-gpu",
            r"^the daemon applies its entry",
            "computedomaincliques.resource.nvidia.com (DriverCredentials) patch: no allowed case",
        ),
        ("nvidia-gpu", r"^an MPS control daemon mounting", "validation host-paths"),
        ("nvidia-gpu", r"^the daemon (changes|labels another)", "pods (OwnPod): no refused"),
        (
            "intel-gaudi",
            r"^(an empty|no) selector|^another driver|a device of|a pool (of|that)",
            "devicetaintrules.resource.k8s.io (CEL): no case refused by validation scope",
        ),
        (
            "dra-example-driver",
            r"^(claims listed|claim status patched)",
            "resourceclaims.resource.k8s.io: no refused case of a verb it does not allow",
        ),
    ],
)
def test_the_driver_coverage_check_reports_what_is_missing(
    name: str, dropped: str, reported: str
) -> None:
    test_file = load_test_file(str(POLICIES / f"{name}_test.yaml"))
    kept = tuple(c for c in test_file.cases if not re.search(dropped, c.name))
    assert len(kept) < len(test_file.cases)
    missing = uncovered_written(dataclasses.replace(test_file, cases=kept))
    assert any(reported in line for line in missing), missing
