"""``audit generate`` writes a policy-test file with the policy: every distinct allowed request of
the log is a case the policy allows, and for each kind and verb the oversteps a reviewer wants
refused are cases too, each refused for the overstep it makes (the rule the gatekeeper's audit
event names), never by accident. ``dra-gatekeeper test`` passes on the pair as generated."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.audit import AuditLevel
from gatekeeper.audit.event import RULE_ANNOTATION
from gatekeeper.audit.tools.cli import TEST_FILE_SUFFIX, run_audit_command
from gatekeeper.audit.tools.generate import Examples, generate_policy, generate_tests
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.policytest import TEST_FILE_SUFFIX as RUNNERS_SUFFIX
from gatekeeper.policytest import Harness, compare, load_test_file
from gatekeeper.testing.harness import GPU, NODE, PINNED, SLICES, slice_body
from tests.audit.driverday import write_driver_day
from tests.audit.logs import SA_GPU
from tests.audit.records import record
from tests.audit.ruleslog import RULES_POLICY, rules_events

# What each overstep must be refused for: the rule in the gatekeeper's audit event.
OVERSTEP_RULES = {
    "naming another node": "node-mismatch",
    "naming another driver": {"driver-mismatch", "cel-validation"},
    "with a pool outside the node's prefix": "pool-prefix",
    "naming another node's pool": "cel-validation",
    "of an object of another node": "node-mismatch",
    "of another driver's object": "driver-mismatch",
    "of an object naming another driver": {"not-in-scope", "cel-validation"},
    "of an object on another node": {"node-mismatch", "not-in-scope"},
    "pinned to another node": {"node-mismatch", "selector-required"},
    "pinned to another driver": {"driver-mismatch", "selector-required"},
    "without a field selector": "selector-required",
    "allocated to another driver": "not-in-scope",
    "allocated on another node": "not-in-scope",
    "changing another driver's status entry": "status-entries",
    "of another node": "own-object-only",
    "of another pod": "own-object-only",
    "setting a label key outside mayChange": "may-change",
    "in another namespace": "namespace-not-allowed",
    "with a token of a pod on another node": "node-mismatch",
}


def _audit(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = run_audit_command(args)
    return code, out.getvalue()


async def _run(path: Path) -> list[tuple[str, bool, str, str]]:
    """(case, passed, decision, the refusing rule) of every case of the test file."""
    test_file = load_test_file(str(path))
    results = []
    async with Harness(test_file) as harness:
        for case in test_file.cases:
            outcome = await harness.run(case)
            event = next(e for e in harness.events if e["stage"] == "ResponseComplete")
            rule = event["annotations"].get(RULE_ANNOTATION, "")
            passed = not list(compare(case.expect, outcome))
            results.append((case.name, passed, outcome.decision, rule))
    return results


def _overstep(name: str) -> str:
    return next(end for end in sorted(OVERSTEP_RULES, key=len, reverse=True) if name.endswith(end))


async def _generated(log: Path, *args: str) -> tuple[str, list[tuple[str, bool, str, str]]]:
    policy = log.with_name("generated.yaml")
    code, out = _audit(["generate", *args, "-o", str(policy), str(log)])
    assert code == 0, out
    tests = log.with_name("generated" + TEST_FILE_SUFFIX)
    return tests.read_text(), await _run(tests)


def _check(text: str, results: list[tuple[str, bool, str, str]]) -> set[str]:
    """Every case passes; each refused one for its overstep. The oversteps made."""
    assert [name for name, passed, _, _ in results if not passed] == [], text
    made = set()
    for name, _, decision, rule in results:
        if name.startswith("refused: "):
            overstep = _overstep(name)
            wanted = OVERSTEP_RULES[overstep]
            assert rule in ({wanted} if isinstance(wanted, str) else wanted), (name, rule)
            made.add(overstep)
        else:
            assert name.startswith("allowed: ") and decision == "allow", name
    return made


@pytest.mark.parametrize("level", list(AuditLevel), ids=[level.value for level in AuditLevel])
@pytest.mark.parametrize("based", [True, False], ids=["base", "no-base"])
async def test_every_rule_the_gatekeepers_log_shows(
    level: AuditLevel, based: bool, tmp_path: Path
) -> None:
    """The events of every rule of the language (tests/policy/rules): the generated tests pass,
    with or without the recording policy as the base."""
    log = tmp_path / "audit.log"
    log.write_text("".join(json.dumps(e) + "\n" for e in await rules_events(level)))
    text, results = await _generated(log, *(["--base", str(RULES_POLICY)] if based else []))
    made = _check(text, results)
    assert "of another node" in made, text
    if level is not AuditLevel.METADATA:
        # With the bodies: the namespaces, the CEL scopes and the token callers of the log.
        expected = {"in another namespace", "naming another driver", "naming another node's pool"}
        assert expected | {"with a token of a pod on another node"} <= made, (made, text)


@pytest.mark.parametrize("level", ["Metadata", "Request", "RequestResponse"])
async def test_a_whole_drivers_kube_apiserver_log(level: str, tmp_path: Path) -> None:
    """Before the gatekeeper: a GPU plugin's day in the kube-apiserver's log. Every kind it
    used has its oversteps, as far as the log holds the objects they need."""
    log = write_driver_day(tmp_path / "kube-audit.log", level)
    text, results = await _generated(log, "--driver-user", f"{SA_GPU}={GPU}")
    made = _check(text, results)
    expected = {
        "of another node",  # its Node
        "pinned to another node",  # pods on the node, slices
        "pinned to another driver",
        "without a field selector",
        "with a token of a pod on another node",
    }
    if level != "Metadata":  # the bodies of writes
        expected |= {
            "in another namespace",  # events, leases, deployments
            "naming another node",  # slices
            "naming another driver",
            "with a pool outside the node's prefix",
            "naming another node's pool",  # DeviceTaintRules (CEL)
            "of an object naming another driver",
        }
    if level == "RequestResponse":  # the objects read
        expected |= {
            "setting a label key outside mayChange",  # its Node, read before it is labelled
            "allocated to another driver",
            "allocated on another node",
            "of an object on another node",  # a pod
        }
    assert made == expected, (made, text)


def test_each_allowed_request_is_a_case_and_what_is_not_says_why() -> None:
    body = slice_body()
    records = [
        record("list", f"{SLICES}?{PINNED}"),
        record("list", f"{SLICES}?{PINNED}"),  # the same request again: one case
        record("create", SLICES, code=201, request_object=body, response_object=body),
        record("delete", f"{SLICES}/{body['metadata']['name']}"),
        record("delete", f"{SLICES}/never-seen"),
        record("create", SLICES, code=201),  # Metadata level: no body
    ]
    examples = Examples()
    policy = parse_policy(generate_policy(examples.tap(records), load_policy(None)))
    text = generate_tests(examples, policy, policy_ref="p.yaml", source="test.log")
    doc = yaml.safe_load(text)
    assert (doc["policy"], doc["node"]) == ("p.yaml", NODE)
    allowed = [c["name"] for c in doc["cases"] if c["name"].startswith("allowed")]
    assert allowed == [
        "allowed: list resourceslices.resource.k8s.io v1",
        "allowed: create resourceslices.resource.k8s.io v1",
        f"allowed: delete resourceslices.resource.k8s.io v1 {body['metadata']['name']}",
    ]
    deleted = doc["cases"][2]
    assert deleted["existing"] == [body]  # the object the log showed created
    notes = [line for line in text.splitlines() if line.startswith("# NOT A CASE")]
    assert notes == [
        "# NOT A CASE: delete /apis/resource.k8s.io/v1/resourceslices/never-seen: the log holds "
        "no object",
        "# NOT A CASE: create /apis/resource.k8s.io/v1/resourceslices: the log holds no body "
        "(record at",
    ]


def test_the_test_file_goes_beside_the_policy(tmp_path: Path) -> None:
    assert TEST_FILE_SUFFIX == RUNNERS_SUFFIX  # as dra-gatekeeper test finds test files
    log = tmp_path / "audit.log"
    events = [_gatekeeper_event("list", f"{SLICES}?{PINNED}")]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, out = _audit(["generate", "-o", str(tmp_path / "mine.yaml"), str(log)])
    assert code == 0, out
    tests = yaml.safe_load((tmp_path / "mine_test.yaml").read_text())
    assert tests["policy"] == "mine.yaml"
    (tmp_path / "elsewhere").mkdir()
    elsewhere = tmp_path / "elsewhere" / "t.yaml"
    code, out = _audit(["generate", "-o", str(log.with_name("p.yaml")), "--tests",
                        str(elsewhere), str(log)])  # fmt: skip
    assert code == 0, out
    assert yaml.safe_load(elsewhere.read_text())["policy"] == "../p.yaml"
    assert asyncio.run(_run(elsewhere))[0][1]  # the case passes from there
    code, out = _audit(["generate", "--tests", str(elsewhere), str(log)])
    assert code == 2 and "--tests needs -o FILE" in out, out
    # A log whose requests no case can be made of (Metadata: a create without its body): the
    # policy, and no test file, said so.
    bodiless = tmp_path / "bodiless"
    bodiless.mkdir()
    log.write_text(json.dumps(_gatekeeper_event("create", SLICES)) + "\n")
    code, out = _audit(["generate", "-o", str(bodiless / "p.yaml"), str(log)])
    assert code == 0, out
    assert sorted(p.name for p in bodiless.iterdir()) == ["p.yaml"]
    assert "no tests written" in out, out


def _gatekeeper_event(verb: str, uri: str) -> dict[str, Any]:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": "a",
        "stage": "ResponseComplete",
        "requestURI": uri,
        "verb": verb,
        "user": {
            "username": GPU,
            "groups": ["dra-gatekeeper:drivers"],
            "extra": {"authentication.kubernetes.io/node-name": [NODE]},
        },
        "objectRef": {
            "resource": "resourceslices",
            "apiGroup": "resource.k8s.io",
            "apiVersion": "v1",
        },
        "responseStatus": {"code": 200},
        "annotations": {"authorization.k8s.io/decision": "allow"},
    }


async def test_an_update_that_re_sends_what_it_read_is_a_case_the_policy_allows(
    tmp_path: Path,
) -> None:
    """client-go re-sends the object it read, managedFields and resourceVersion included, and
    the apiserver's log shows that body: the case sends what a fresh cluster can take (the
    gatekeeper refuses managedFields that differ from what is stored)."""
    stored = slice_body()
    stored["metadata"] |= {
        "resourceVersion": "41",
        "uid": "0f6e3a3c-1111-4c8e-9d2b-5a3f0f3b7a01",
        "creationTimestamp": "2026-12-03T06:59:00Z",
        "generation": 1,
        "managedFields": [
            {"manager": "gpu-plugin", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
             "time": "2026-12-03T06:59:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}
        ],
    }  # fmt: skip
    sent = json.loads(json.dumps(stored))
    sent["spec"]["devices"] = [{"name": "gpu-1"}]
    name = stored["metadata"]["name"]
    records = [
        record("create", SLICES, code=201, request_object=slice_body(), response_object=stored),
        record("update", f"{SLICES}/{name}", request_object=sent, response_object=sent),
    ]
    examples = Examples()
    policy_text = generate_policy(examples.tap(records), load_policy(None))
    (tmp_path / "p.yaml").write_text(policy_text)
    text = generate_tests(examples, parse_policy(policy_text), policy_ref="p.yaml", source="t")
    update = next(c for c in yaml.safe_load(text)["cases"] if c["name"].startswith("allowed: upd"))
    assert "managedFields" not in update["request"]["body"]["metadata"]
    (tmp_path / "p_test.yaml").write_text(text)
    results = await _run(tmp_path / "p_test.yaml")
    assert [name for name, passed, _, _ in results if not passed] == [], text
