"""The engine's plan: what to read before deciding, and the patch preview built once."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.apiserver import resource_slice
from gatekeeper.policy import Decision, Engine
from gatekeeper.policy.patching import APPLY, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.policy.stored import Stored, predict
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import GPU, NIC, NODE
from gatekeeper.types import Identity

ENGINE = Engine(load_policy(None).with_drivers(frozenset({GPU, NIC})), NODE)
CALLER = Identity(driver=GPU, transport="unix")
SLICE = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu"
CLAIM = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"


def plan(method: str, target: str, media_type: str = "application/json") -> Plan:
    planned = ENGINE.plan(CALLER, parse_request(method, target), media_type)
    assert isinstance(planned, Plan), planned
    return planned


def stored(driver: str = GPU) -> dict[str, Any]:
    obj = resource_slice("node-a-gpu", driver=driver, node=NODE, pool="node-a/gpus")
    obj["metadata"]["resourceVersion"] = "7"
    return obj


@pytest.mark.parametrize(
    ("method", "target", "fetch"),
    [
        ("GET", SLICE, SLICE),
        ("PUT", SLICE, SLICE),
        ("DELETE", SLICE, SLICE),
        ("PUT", f"{CLAIM}/status", CLAIM),
        ("POST", "/apis/resource.k8s.io/v1/resourceslices", None),
    ],
    ids=["get", "update", "delete", "status-of-stored-object", "create"],
)
def test_the_plan_reads_the_stored_object_of_object_verbs(
    method: str, target: str, fetch: str | None
) -> None:
    assert plan(method, target).fetch == fetch


def test_requests_settled_on_their_own_need_no_plan() -> None:
    refused = ENGINE.plan(Identity("evil.example.com", "mtls"), parse_request("GET", SLICE))
    assert isinstance(refused, Decision) and refused.code == 403
    discovery = ENGINE.plan(CALLER, parse_request("GET", "/apis"))
    assert isinstance(discovery, Decision) and discovery.forwards


@pytest.mark.parametrize("media_type", [STRATEGIC_MERGE, APPLY])
def test_a_previewed_patch_is_pinned_once(media_type: str) -> None:
    patch = {"metadata": {"labels": {"a": "b"}}}
    planned = plan("PATCH", SLICE, media_type)
    predicted = predict(planned, patch, stored())
    assert isinstance(predicted, Stored)
    preview = predicted.preview
    assert isinstance(preview, Preview)
    assert preview.body == {"metadata": {"labels": {"a": "b"}, "resourceVersion": "7"}}
    assert preview.media_type == media_type
    assert preview.target.target == SLICE
    assert preview.dry_run.target == f"{SLICE}?dryRun=All"
    assert patch == {"metadata": {"labels": {"a": "b"}}}


@pytest.mark.parametrize(
    ("media_type", "patch", "current"),
    [
        (MERGE_PATCH, {}, stored()),
        (JSON_PATCH, [], stored()),
        (STRATEGIC_MERGE, {}, None),
        (STRATEGIC_MERGE, {}, stored(NIC)),
    ],
    ids=["merge-computed", "json-computed", "absent", "not-the-callers"],
)
def test_no_preview_where_none_is_needed_or_allowed(
    media_type: str, patch: Any, current: Any
) -> None:
    predicted = predict(plan("PATCH", SLICE, media_type), patch, current)
    assert predicted is None or (isinstance(predicted, Stored) and predicted.preview is None)


@pytest.mark.parametrize(
    ("patch", "code"), [([], 400), ({"metadata": "x"}, 422)], ids=["not-an-object", "unpinnable"]
)
def test_a_patch_that_cannot_be_pinned_is_refused_before_any_dry_run(patch: Any, code: int) -> None:
    refused = predict(plan("PATCH", SLICE, STRATEGIC_MERGE), patch, stored())
    assert isinstance(refused, Decision) and (refused.allowed, refused.code) == (False, code)


def test_a_preview_carries_the_upstreams_answer() -> None:
    preview = Preview(parse_request("PATCH", SLICE), {}, STRATEGIC_MERGE)
    assert (preview.code, preview.result, preview.rejected) == (0, None, False)
    conflict = preview.answered(409, {"kind": "Status", "code": 409})
    assert conflict.rejected and conflict.result == {"kind": "Status", "code": 409}
    planned = plan("PATCH", SLICE, STRATEGIC_MERGE)
    predicted = predict(planned, {}, stored())
    assert isinstance(predicted, Stored)
    decision = ENGINE.decide(planned, {}, stored(), predicted.answered(conflict))
    assert (decision.allowed, decision.code, decision.forwards) == (True, 409, False)
    assert decision.response == {"kind": "Status", "code": 409}


def test_a_rejected_preview_of_another_drivers_object_is_still_refused() -> None:
    conflict = Preview(parse_request("PATCH", SLICE), {}, STRATEGIC_MERGE).answered(409, {})
    answered = Stored({}, None, conflict)
    decision = ENGINE.decide(plan("PATCH", SLICE, STRATEGIC_MERGE), {}, stored(NIC), answered)
    assert (decision.allowed, decision.code) == (False, 403)
