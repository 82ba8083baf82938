"""Delete options, purely: the client's options (query or body) carried into the body the
gatekeeper sends with its preconditions, and DeleteOptions bodies checked (recordings 149-166)."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.policy.decision import Decision
from gatekeeper.policy.integrity import checked_delete_options, delete_options, pin_delete
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request

SLICES = load_policy(None).kinds[("resource.k8s.io", "resourceslices")]
PATH = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu"
STORED = {"metadata": {"name": "node-a-gpu", "uid": "u1", "resourceVersion": "7"}}
PINNED = {"uid": "u1", "resourceVersion": "7"}

# (id, query, body, options the apiserver acts on, before the gatekeeper's preconditions)
OPTIONS: list[tuple[str, str, Any, dict[str, Any]]] = [
    ("none", "", None, {}),
    ("query-dry-run", "?dryRun=All", None, {"dryRun": ["All"]}),
    (
        "query-all",
        "?gracePeriodSeconds=0&propagationPolicy=Foreground&dryRun=All",
        None,
        {"gracePeriodSeconds": 0, "propagationPolicy": "Foreground", "dryRun": ["All"]},
    ),
    ("query-orphan-true", "?orphanDependents=true", None, {"orphanDependents": True}),
    ("query-orphan-false", "?orphanDependents=0", None, {"orphanDependents": False}),
    ("query-grace-signed", "?gracePeriodSeconds=-1", None, {"gracePeriodSeconds": -1}),
    ("query-others-ignored", "?pretty=true", None, {}),
    ("body-dry-run", "", {"dryRun": ["All"]}, {"dryRun": ["All"]}),
    # With a body the apiserver ignores the query (recordings 149, 154).
    ("body-wins-over-query", "?dryRun=All", {"gracePeriodSeconds": 5}, {"gracePeriodSeconds": 5}),
    ("empty-body-wins", "?propagationPolicy=Orphan", {}, {}),
    (
        "body-typed",
        "",
        {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "orphanDependents": False},
        {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "orphanDependents": False},
    ),
    (
        "body-group-version",
        "",
        {"apiVersion": "resource.k8s.io/v1"},
        {"apiVersion": "resource.k8s.io/v1"},
    ),
    (
        "body-nulls",
        "",
        {"dryRun": None, "preconditions": None},
        {"dryRun": None, "preconditions": None},
    ),
]


@pytest.mark.parametrize(
    ("query", "body", "expected"), [c[1:] for c in OPTIONS], ids=[c[0] for c in OPTIONS]
)
def test_delete_options_are_what_the_apiserver_acts_on(
    query: str, body: Any, expected: dict[str, Any]
) -> None:
    info = parse_request("DELETE", PATH + query)
    assert delete_options(info, SLICES, body) == expected
    decision = pin_delete(info, SLICES, body, STORED)
    assert decision.allowed, decision.message
    sent = {k: v for k, v in decision.body.items() if k not in ("kind", "apiVersion")}
    assert sent == {
        **{k: v for k, v in expected.items() if k not in ("kind", "apiVersion")},
        "preconditions": PINNED,
    }
    assert decision.body["kind"] == "DeleteOptions"


def test_the_clients_body_is_not_modified() -> None:
    body = {"preconditions": {"uid": "u1"}, "dryRun": ["All"]}
    decision = pin_delete(parse_request("DELETE", PATH), SLICES, body, STORED)
    assert decision.allowed and decision.body["preconditions"] == PINNED
    assert body == {"preconditions": {"uid": "u1"}, "dryRun": ["All"]}


@pytest.mark.parametrize(
    "preconditions",
    [{"uid": "other"}, {"resourceVersion": "6"}],
    ids=["uid", "resourceVersion"],
)
def test_a_contradicting_precondition_is_409(preconditions: dict[str, str]) -> None:
    decision = pin_delete(
        parse_request("DELETE", PATH), SLICES, {"preconditions": preconditions}, STORED
    )
    assert (decision.allowed, decision.code) == (False, 409)
    assert "Precondition failed" in decision.message


# (id, body, part of the 400's message)
BAD_BODIES: list[tuple[str, Any, str]] = [
    ("list", [], "must be a JSON object"),
    ("string", "x", "must be a JSON object"),
    ("unknown-field", {"dryrun": ["All"]}, 'DeleteOptions has no field "dryrun"'),
    ("other-kind", {"kind": "ResourceSlice"}, 'body kind "ResourceSlice" is not DeleteOptions'),
    ("other-version", {"apiVersion": "apps/v1"}, 'apiVersion "apps/v1"'),
    ("dry-run-string", {"dryRun": "All"}, "DeleteOptions.dryRun: must be a list of strings"),
    ("dry-run-items", {"dryRun": [1]}, "DeleteOptions.dryRun: must be a list of strings"),
    ("grace-string", {"gracePeriodSeconds": "0"}, "gracePeriodSeconds: must be of type int64"),
    ("grace-bool", {"gracePeriodSeconds": True}, "gracePeriodSeconds: must be of type int64"),
    ("grace-float", {"gracePeriodSeconds": 1.5}, "gracePeriodSeconds: must be of type int64"),
    ("orphan-string", {"orphanDependents": "true"}, "orphanDependents: must be of type bool"),
    ("policy-number", {"propagationPolicy": 1}, "propagationPolicy: must be of type string"),
    ("preconditions-list", {"preconditions": []}, "preconditions: must be an object"),
    ("preconditions-field", {"preconditions": {"name": "x"}}, 'Preconditions has no field "name"'),
    ("preconditions-type", {"preconditions": {"uid": 1}}, "uid must be a string"),
]


@pytest.mark.parametrize(
    ("body", "message"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
def test_a_body_that_is_no_delete_options_is_400(body: Any, message: str) -> None:
    for method_path in (PATH, "/apis/resource.k8s.io/v1/resourceslices"):
        info = parse_request("DELETE", method_path)
        checked = checked_delete_options(info, SLICES, body)
        assert isinstance(checked, Decision)
        assert (checked.allowed, checked.code) == (False, 400)
        assert message in checked.message, checked.message
    decision = pin_delete(parse_request("DELETE", PATH), SLICES, body, STORED)
    assert (decision.allowed, decision.code) == (False, 400)


def test_a_bad_query_grace_period_is_400() -> None:
    decision = pin_delete(
        parse_request("DELETE", PATH + "?gracePeriodSeconds=soon"), SLICES, None, STORED
    )
    assert (decision.allowed, decision.code) == (False, 400)
    assert "gracePeriodSeconds" in decision.message
