"""Bodies the apiserver decodes (protobuf, CBOR), table-driven through the pure engine: the
decision is the JSON decision on the dry run's answer, and what is forwarded is the driver's
bytes, pinned; no event loop."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from gatekeeper.codec.kubeproto import read_envelope
from gatekeeper.errors import Refusal
from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Decision, Engine
from gatekeeper.policy.model import Field
from gatekeeper.policy.plan import Plan
from gatekeeper.policy.stored import Stored, predict
from gatekeeper.policyfile import load_policy
from gatekeeper.request.encoded import CBOR, PROTOBUF, EncodedBody, read_encoded
from gatekeeper.request.requestinfo import parse_request
from tests.codec.test_kubeproto import META, SPEC, body, field

NODE = "node-a"
GPU = Identity(driver="gpu.example.com", transport="unix")
POLICY = load_policy(None).with_drivers(frozenset({"gpu.example.com", "nic.example.com"}))
ENGINE = Engine(POLICY, NODE)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIM = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"


def slice_json(driver: str = "gpu.example.com", node: str = NODE, pool: str = NODE, **meta: Any):
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s1", **meta},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool}, "devices": []},
    }


def stored(obj: dict[str, Any], rv: str = "7") -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(resourceVersion=rv, uid="uid-1")
    return obj


def encoded(rv: str = "", api: str = "resource.k8s.io/v1") -> EncodedBody:
    meta = META.replace(field(6, ""), field(6, rv))
    decoded = read_encoded(body(meta, rest=SPEC, api=api), PROTOBUF, "create")
    assert isinstance(decoded, EncodedBody)
    return decoded


def run(
    method: str,
    target: str,
    payload: EncodedBody,
    current: dict[str, Any] | None,
    answer: tuple[int, dict[str, Any]] | None,
) -> tuple[Decision, Any]:
    """Plan, preview (answered with ``answer`` as the apiserver would), decide. Returns the
    decision and the preview that would have been sent (None: nothing asked upstream)."""
    plan = ENGINE.plan(GPU, parse_request(method, target), payload.media_type)
    if isinstance(plan, Decision):
        return plan, None
    assert isinstance(plan, Plan)
    stored = predict(plan, payload, current)
    assert stored is None or isinstance(stored, Stored)
    preview = stored.preview if stored is not None else None
    if stored is not None and preview is not None and answer:
        stored = stored.answered(preview.answered(*answer))
    return ENGINE.decide(plan, payload, current, stored), preview


def test_create_is_decided_on_the_decoding_and_forwards_the_bytes() -> None:
    payload = encoded()
    decision, preview = run("POST", SLICES, payload, None, (201, stored(slice_json())))
    assert decision.forwards and decision.body == payload.raw
    assert decision.media_type == PROTOBUF
    assert preview.target.method == "POST" and preview.dry_run.query_value("dryRun") == "All"


@pytest.mark.parametrize(
    ("decoded", "message"),
    [
        (slice_json(driver="nic.example.com"), 'spec.driver "nic.example.com"'),
        (slice_json(node="node-b"), 'spec.nodeName "node-b"'),
        (slice_json(pool="node-a-b"), 'spec.pool.name "node-a-b"'),
    ],
)
def test_create_refused_on_what_the_apiserver_decoded(
    decoded: dict[str, Any], message: str
) -> None:
    decision, _ = run("POST", SLICES, encoded(), None, (201, stored(decoded)))
    assert (decision.allowed, decision.code) == (False, 403)
    assert message in decision.message


def test_update_without_resource_version_is_pinned_in_the_bytes() -> None:
    payload = encoded(rv="")
    current = stored(slice_json(), rv="42")
    decision, preview = run("PUT", f"{SLICES}/s1", payload, current, (200, current))
    assert read_envelope(preview.body).resource_version == "42"  # the dry run, pinned
    assert decision.forwards and decision.body == preview.body  # the same bytes, forwarded


def test_update_with_a_stale_resource_version_is_409_without_asking() -> None:
    current = stored(slice_json(), rv="42")
    decision, preview = run("PUT", f"{SLICES}/s1", encoded(rv="41"), current, (200, current))
    assert preview is None
    assert decision.code == 409


def test_update_of_another_drivers_object_asks_nothing() -> None:
    current = stored(slice_json(driver="nic.example.com"))
    decision, preview = run("PUT", f"{SLICES}/s1", encoded(), current, (200, current))
    assert preview is None
    assert decision.code == 403 and "stored object" in decision.message


@pytest.mark.parametrize(
    ("method", "target", "current", "reason"),
    [
        ("POST", SLICES, None, "the apiserver rejected the create preview"),
        ("PUT", f"{SLICES}/s1", stored(slice_json()), "the apiserver rejected the update preview"),
    ],
    ids=["create", "update"],
)
def test_a_rejected_dry_run_is_the_apiservers_answer_and_names_what_was_previewed(
    method: str, target: str, current: dict[str, Any] | None, reason: str
) -> None:
    status = {"kind": "Status", "code": 400, "message": "the object provided is unrecognized"}
    decision, preview = run(method, target, encoded(), current, (400, status))
    assert preview is not None and preview.target.method == method
    assert decision.allowed and decision.code == 400 and decision.response == status
    assert decision.reason == reason


def test_envelope_must_match_the_url() -> None:
    decision, preview = run("POST", SLICES, encoded(api="resource.k8s.io/v1beta2"), None, None)
    assert preview is None and decision.code == 400 and "envelope" in decision.message


def test_fill_is_not_applied_to_encoded_bodies() -> None:
    policy = load_policy(None).with_drivers(frozenset({"gpu.example.com"}))
    kinds = dict(policy.kinds)
    key = ("resource.k8s.io", "resourceslices")
    kinds[key] = replace(kinds[key], fill=frozenset({Field.DRIVER}))
    engine = Engine(replace(policy, kinds=kinds), NODE)
    plan = engine.plan(GPU, parse_request("POST", SLICES), PROTOBUF)
    assert isinstance(plan, Plan)
    payload = encoded()
    predicted = predict(plan, payload, None)
    assert isinstance(predicted, Stored) and predicted.preview is not None
    unfilled = slice_json(driver="")
    answer = predicted.answered(predicted.preview.answered(201, stored(unfilled)))
    decision = engine.decide(plan, payload, None, answer)
    assert decision.code == 403 and "filled only in JSON" in decision.message


def test_a_custom_resource_takes_no_protobuf() -> None:
    decision, preview = run("POST", POOLS, encoded(), None, None)
    assert preview is None and decision.code == 415


def test_cbor_create_is_previewed_and_cbor_update_refused() -> None:
    cbor = read_encoded(b"\xd9\xd9\xf7\xa0", CBOR, "create")
    assert isinstance(cbor, EncodedBody) and cbor.envelope is None
    decision, preview = run("POST", SLICES, cbor, None, (415, {"kind": "Status", "code": 415}))
    assert preview is not None and decision.code == 415  # the apiserver's answer, passed on
    with pytest.raises(Refusal) as refused:
        read_encoded(b"\xd9\xd9\xf7\xa0", CBOR, "update")
    assert refused.value.code == 415


def test_claim_status_update_is_decided_by_the_claim_rule() -> None:
    allocated = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default", "resourceVersion": "5", "uid": "u"},
        "spec": {},
        "status": {
            "allocation": {
                "devices": {"results": [{"driver": "gpu.example.com", "device": "g0"}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "devices": [{"driver": "nic.example.com", "pool": "p", "device": "e0"}],
        },
    }
    mine = copy.deepcopy(allocated)
    mine["status"]["devices"].append({"driver": "gpu.example.com", "pool": "p", "device": "g0"})
    theirs = copy.deepcopy(allocated)
    theirs["status"]["devices"][0]["data"] = {"vlan": 1}
    meta = field(1, "c1") + field(3, "default") + field(6, "")
    claim_body = read_encoded(
        b"k8s\x00"
        + field(1, field(1, "resource.k8s.io/v1") + field(2, "ResourceClaim"))
        + field(2, field(1, meta)),
        PROTOBUF,
        "update",
    )
    assert isinstance(claim_body, EncodedBody)
    ok, _ = run("PUT", f"{CLAIM}/status", claim_body, allocated, (200, mine))
    assert ok.forwards
    refused, _ = run("PUT", f"{CLAIM}/status", claim_body, allocated, (200, theirs))
    assert refused.code == 403 and "status.devices" in refused.message


# --- fields only the apiserver maintains (issue 39) -----------------------------------------------

MANAGED = field(17, field(1, "kubelet") + field(2, "Apply") + field(3, "v1"))


def test_a_protobuf_body_goes_upstream_without_managed_fields_or_generation() -> None:
    """ObjectMeta's managedFields (17) and generation (7) are cut from the bytes previewed and
    forwarded: the apiserver then keeps its own, as it does for a body that leaves them out."""
    plain = encoded()
    forged = read_encoded(
        body(META + MANAGED + field(7, b"\x09"), rest=SPEC), PROTOBUF, "create"
    )  # fmt: skip
    assert isinstance(forged, EncodedBody)
    decision, preview = run("POST", SLICES, forged, None, (201, stored(slice_json())))
    assert preview is not None and preview.body == plain.raw
    assert decision.forwards and decision.body == plain.raw
    # A body without them goes as the driver sent it, byte for byte.
    _, honest = run("POST", SLICES, plain, None, (201, stored(slice_json())))
    assert honest is not None and honest.body is plain.raw


def entry(manager: str) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "apiVersion": "resource.k8s.io/v1",
            "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {}}  # fmt: skip


@pytest.mark.parametrize(("entries", "allowed"), [(1, True), (2, False)], ids=["writer", "brought"])
def test_a_cbor_create_may_not_bring_managed_fields(entries: int, allowed: bool) -> None:
    """CBOR bytes have no codec here to cut them from: the dry run shows what the body brought."""
    payload = EncodedBody(b"\xd9\xd9\xf7\xa0", CBOR)
    answer = stored(slice_json())
    answer["metadata"]["managedFields"] = [entry(f"m{i}") for i in range(entries)]
    decision, preview = run("POST", SLICES, payload, None, (201, answer))
    assert preview is not None
    assert decision.allowed is allowed
    if not allowed:
        assert (
            decision.code == 403
            and "brings entries of its own (2 in its dry run" in decision.message
        )
