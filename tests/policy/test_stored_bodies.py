"""What a JSON create or update body stores (gatekeeper/policy/stored.py): a body holding a null
the apiserver may store otherwise (its field's zero value, or nothing) is decided on the
apiserver's dry run of that body, and the same body is forwarded; labels, annotations and the
fields the apiserver maintains are read here as Go reads them (client-go's JSON sends
``metadata.creationTimestamp: null`` in every create); and nothing is asked about an object that
is not the caller's, nor for a kind under the driver's own credentials."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.policy.decision import Credentials
from gatekeeper.policy.plan import Plan
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.rule import Rule
from tests.policy.stored_cases import (
    ENGINE,
    GPU,
    NODE_PATH,
    TARGETS,
    decide,
    node,
    resource_slice,
    taint_rule,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
CONFIGMAPS = "/api/v1/namespaces/gpu-system/configmaps"
CLAIM_STATUS, STORED_CLAIM = TARGETS["claim-status"]
JSON = "application/json"
NIC = "nic.example.com"


def new(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    """``obj`` as a create body: without what the apiserver set, with ``meta`` added."""
    body = copy.deepcopy(obj)
    for key in ("resourceVersion", "managedFields", "uid"):
        body["metadata"].pop(key, None)
    body["metadata"].update(meta)
    return body


def with_null(obj: dict[str, Any], *path: Any) -> dict[str, Any]:
    """A copy of ``obj`` with null at ``path`` (member names and list indexes)."""
    body = copy.deepcopy(obj)
    parent: Any = body
    for step in path[:-1]:
        parent = parent[step] if isinstance(parent, list) else parent.setdefault(step, {})
    parent[path[-1]] = None
    return body


def new_rule(
    name: str = "made", driver: str = GPU.driver, pool: str = "node-a/oracle"
) -> dict[str, Any]:
    return new(taint_rule(driver, pool), name=name)


def claim_with_own_null() -> dict[str, Any]:
    """The claim's status with the GPU driver's own entry's message null."""
    body = copy.deepcopy(STORED_CLAIM)
    body["status"]["devices"][1]["conditions"][0]["message"] = None
    return body


# (id, method, path, body, stored object): a null the apiserver may store otherwise, in an
# object that is the caller's.
ASKED = [
    ("rule-create-null-in-the-taint", "POST", RULES,
     with_null(new_rule(), "spec", "taint", "value"), None),
    ("rule-create-null-in-the-selector", "POST", RULES,
     with_null(new_rule(), "spec", "deviceSelector", "device"), None),
    ("rule-update-null", "PUT", f"{RULES}/oracle-mine",
     with_null(taint_rule(), "spec", "taint", "timeAdded"), taint_rule()),
    ("slice-create-null-attribute", "POST", SLICES,
     with_null(new(resource_slice()), "spec", "devices", 0, "attributes", "model"), None),
    ("slice-create-null-device", "POST", SLICES,
     with_null(new(resource_slice()), "spec", "devices", 1), None),
    ("slice-update-null-generation", "PUT", f"{SLICES}/oracle-node-a",
     with_null(resource_slice(), "spec", "pool", "generation"), resource_slice()),
    ("claim-status-null-in-own-entry", "PUT", CLAIM_STATUS, claim_with_own_null(),
     STORED_CLAIM),
]  # fmt: skip


def _stored_as(body: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver answers a dry run of ``body`` with: its nulls gone (a pointer left
    nil, a zero value omitted), its own metadata set."""

    def without_nulls(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_nulls(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [without_nulls(v) for v in value if v is not None]
        return value

    answer = without_nulls(body)
    answer["metadata"].setdefault("uid", "0000-dry-run")
    answer["metadata"].setdefault("creationTimestamp", "2026-12-07T10:00:00Z")
    return answer


@pytest.mark.parametrize(
    ("method", "path", "body", "stored"), [c[1:] for c in ASKED], ids=[c[0] for c in ASKED]
)
def test_a_null_is_decided_on_the_dry_run_and_the_same_body_forwarded(
    method: str, path: str, body: dict[str, Any], stored: Any
) -> None:
    answer = _stored_as(body)
    outcome = decide(path, body, stored, JSON, method=method, answer=answer,
                     code=201 if method == "POST" else 200)  # fmt: skip
    decision = outcome.decision
    assert decision.forwards, decision.message
    [preview] = outcome.previews
    assert preview.dry_run.query_value("dryRun") == "All"
    assert preview.target.method == method and preview.target.path == decision.target.path
    # One body: the one the apiserver decoded is the one forwarded, nulls and pin included.
    assert preview.body is decision.body
    if stored is not None:
        assert decision.body["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("method", "path", "body", "stored"), [c[1:] for c in ASKED], ids=[c[0] for c in ASKED]
)
def test_what_the_apiserver_answers_is_what_is_decided(
    method: str, path: str, body: dict[str, Any], stored: Any
) -> None:
    """An answer the rules refuse is refused (the local body would have passed); a dry run the
    apiserver refuses is its own answer; offline (no answer) the body is read here."""
    answer = _stored_as(body)
    if "claims" in path:
        answer["status"]["devices"][0]["device"] = "nic-9"  # another driver's entry changed
    elif "devicetaintrules" in path:
        answer["spec"]["deviceSelector"]["driver"] = NIC
    else:
        answer["spec"]["driver"] = NIC
    refused = decide(path, body, stored, JSON, method=method, answer=answer).decision
    assert (refused.allowed, refused.code) == (False, 403), refused.message
    invalid = {"kind": "Status", "code": 422, "reason": "Invalid", "message": "spec: Invalid"}
    rejected = decide(path, body, stored, JSON, method=method, answer=invalid, code=422).decision
    assert (rejected.allowed, rejected.code, rejected.forwards) == (True, 422, False)
    assert rejected.response == invalid
    assert (
        rejected.reason == f"the apiserver rejected the {parse_request(method, path).verb} preview"
    )
    offline = decide(path, body, stored, JSON, method=method)
    assert offline.asked and offline.decision.forwards


# (id, method, path, body, stored object): read here exactly as the apiserver stores it.
AS_SENT = [
    ("client-go-creation-timestamp", "POST", RULES, new_rule() | {
        "metadata": {"name": "made", "creationTimestamp": None}}, None),
    ("label-null-is-empty", "POST", RULES,
     with_null(new_rule(), "metadata", "labels", "example.org/x"), None),
    ("annotation-null-is-empty", "POST", SLICES,
     with_null(new(resource_slice()), "metadata", "annotations", "example.org/x"), None),
    ("null-where-stored", "PUT", f"{RULES}/oracle-mine",
     with_null(taint_rule(), "spec", "taint", "value"),
     with_null(taint_rule(), "spec", "taint", "value")),
    ("no-null", "POST", SLICES, new(resource_slice()), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "body", "stored"), [c[1:] for c in AS_SENT], ids=[c[0] for c in AS_SENT]
)
def test_what_is_read_as_go_reads_it_asks_nothing(
    method: str, path: str, body: dict[str, Any], stored: Any
) -> None:
    outcome = decide(path, body, stored, JSON, method=method)
    assert outcome.decision.forwards, outcome.decision.message
    assert not outcome.asked
    assert outcome.decision.body["metadata"] == {
        **body["metadata"],
        **({"resourceVersion": stored["metadata"]["resourceVersion"]} if stored else {}),
    }  # forwarded as sent (pinned): the apiserver stores "" for a null label itself


def test_a_kind_under_the_drivers_credentials_asks_nothing() -> None:
    meta = {"name": "settings", "namespace": "gpu-system", "labels": {"x": None}}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": None}, "metadata": meta}
    for method, path in (("POST", CONFIGMAPS), ("PUT", f"{CONFIGMAPS}/settings")):
        outcome = decide(path, body, None, JSON, method=method)
        assert outcome.decision.forwards and not outcome.asked
        assert outcome.decision.credentials is Credentials.DRIVER


# (id, method, path, body, stored object, code, rule): refused on what is known before asking.
REFUSED_FIRST = [
    ("rule-create-out-of-scope", "POST", RULES,
     with_null(new_rule(driver=NIC), "spec", "taint", "value"), None, 403, Rule.CEL_VALIDATION),
    ("rule-update-of-another-drivers-object", "PUT", f"{RULES}/oracle-mine",
     with_null(taint_rule(), "spec", "taint", "value"), taint_rule(driver=NIC), 404,
     Rule.NOT_IN_SCOPE),
    ("slice-create-another-driver", "POST", SLICES,
     with_null(new(resource_slice(driver=NIC)), "spec", "devices", 1), None, 403,
     Rule.DRIVER_MISMATCH),
    ("slice-update-of-another-drivers-object", "PUT", f"{SLICES}/oracle-node-a",
     with_null(resource_slice(), "spec", "pool", "generation"), resource_slice(driver=NIC), 403,
     Rule.DRIVER_MISMATCH),
    ("node-update-null-outside-may-change", "PUT", NODE_PATH,
     with_null(node(), "spec", "unschedulable"), node(), 403, Rule.MAY_CHANGE),
    ("claim-status-null-in-another-drivers-entry", "PUT", CLAIM_STATUS,
     with_null(STORED_CLAIM, "status", "devices", 0, "conditions", 0, "message"), STORED_CLAIM,
     403, Rule.STATUS_ENTRIES),
    ("managed-fields-cleared-beside-a-null", "PUT", f"{RULES}/oracle-mine",
     with_null(taint_rule(), "spec", "taint", "value") | {"metadata": {
         "name": "oracle-mine", "resourceVersion": "9", "managedFields": []}}, taint_rule(), 403,
     Rule.FORBIDDEN_FIELD),
    ("stale-update", "PUT", f"{RULES}/oracle-mine",
     with_null(taint_rule(), "spec", "taint", "value") | {"metadata": {
         "name": "oracle-mine", "resourceVersion": "8"}}, taint_rule(), 409, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "body", "stored", "code", "rule"),
    [c[1:] for c in REFUSED_FIRST],
    ids=[c[0] for c in REFUSED_FIRST],
)
def test_nothing_is_asked_about_what_is_not_the_callers(
    method: str, path: str, body: dict[str, Any], stored: Any, code: int, rule: Rule | None
) -> None:
    outcome = decide(path, body, stored, JSON, method=method, answer=_stored_as(body))
    decision = outcome.decision
    assert not outcome.asked
    assert (decision.allowed, decision.code) == (False, code), decision.message
    if rule is not None:
        assert decision.rule is rule, decision.message


def test_an_update_with_a_null_is_read_first() -> None:
    """An update decided without a read (docs/security.md, "Updates without a read") names an
    object it may not own: one with a null is read first, so that its dry run is asked only
    about an object known to be the caller's."""
    body = resource_slice()
    del body["metadata"]["managedFields"]  # restated, they would need the read too
    plan = ENGINE.screen(GPU, parse_request("PUT", f"{SLICES}/oracle-node-a"))
    assert isinstance(plan, Plan)
    unread = ENGINE.accept(plan, JSON, body)
    assert isinstance(unread, Plan) and unread.unread and unread.fetch is None
    read = ENGINE.accept(plan, JSON, with_null(body, "spec", "pool", "generation"))
    assert isinstance(read, Plan) and not read.unread and read.fetch is not None


def test_an_apply_that_creates_is_asked_as_what_it_is_forwarded_as() -> None:
    body = with_null(new_rule(name="applied"), "spec", "taint", "value")
    outcome = decide(f"{RULES}/applied", body, None, "application/apply-patch+yaml",
                     answer=_stored_as(body), code=201)  # fmt: skip
    [preview] = outcome.previews
    decision = outcome.decision
    assert decision.forwards, decision.message
    assert (preview.target.method, preview.target.path) == ("POST", RULES)
    assert (decision.target.method, decision.target.path) == ("POST", RULES)
    assert preview.body is decision.body


def test_a_dry_run_the_apiserver_refuses_is_the_gatekeepers_own_refusal_where_it_has_one() -> None:
    """The write fails either way; where the policy refuses the object read here too, the
    refusal is the gatekeeper's (its rule and CEL validation reach the audit), as without the
    dry run: the exported admission policy refuses the same object at the apiserver."""
    body = with_null(taint_rule(driver=NIC), "spec", "taint", "value")
    denied = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "denied by policy"}
    outcome = decide(f"{RULES}/oracle-mine", body, taint_rule(), JSON, method="PUT",
                     answer=denied, code=403)  # fmt: skip
    assert outcome.asked  # its own object: asked, its scope read on what the apiserver stores
    decision = outcome.decision
    assert (decision.allowed, decision.code, decision.rule) == (False, 403, Rule.CEL_VALIDATION)
    assert decision.validation == "scope"
    stored = _stored_as(body)
    refused = decide(f"{RULES}/oracle-mine", body, taint_rule(), JSON, method="PUT",
                     answer=stored).decision  # fmt: skip
    assert (refused.allowed, refused.validation) == (False, "scope")
