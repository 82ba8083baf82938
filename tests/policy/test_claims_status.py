"""Claim status writes compared by what the apiserver stores, not as text:
times by instant, null as absent, opaque data exactly; and the official Python client's
re-send of a claim it read passes."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
import pytest

from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Engine
from gatekeeper.policy.changes import first_difference, same_instant
from gatekeeper.policy.claims import status_change_violation
from gatekeeper.policy.patching import MERGE_PATCH
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline
from tests.recorded import recording

POLICY = load_policy(None)
CLAIM_PATHS = POLICY.kinds[("resource.k8s.io", "resourceclaims")].versions["v1"].allocation
assert CLAIM_PATHS is not None
GPU = Identity(driver="gpu.example.com", transport="unix")
ENGINE = Engine(POLICY.with_drivers(frozenset({GPU.driver, "nic.example.com"})), "node-a")
STATUS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/rec2-claim-1/status"

# (id, stored, proposed, same)
INSTANTS = [
    ("identical", "2026-12-02T21:14:02Z", "2026-12-02T21:14:02Z", True),
    ("plus-zero", "2026-12-02T21:14:02Z", "2026-12-02T21:14:02+00:00", True),
    ("minus-zero", "2026-12-02T21:14:02Z", "2026-12-02T21:14:02-00:00", True),
    ("offset-and-fraction-186", "2026-12-02T21:30:00Z", "2026-12-02T23:30:00.5+02:00", True),
    ("fraction-cut-not-rounded", "2026-12-02T21:30:00Z", "2026-12-02T21:30:00.999999999Z", True),
    ("negative-offset-day-back", "2026-12-02T01:00:00Z", "2026-12-01T20:00:00-05:00", True),
    ("leap-day", "2024-02-29T00:00:00Z", "2024-02-29T01:00:00+01:00", True),
    ("micro-time", "2026-12-02T21:14:02.123456Z", "2026-12-02T21:14:02.123456+00:00", True),
    ("micro-time-cut", "2026-12-02T21:14:02.123456Z", "2026-12-02T21:14:02.1234569Z", True),
    ("micro-time-zero", "2026-12-02T21:14:02.000000Z", "2026-12-02T21:14:02+00:00", True),
    ("other-second", "2026-12-02T21:14:02Z", "2026-12-02T21:14:03+00:00", False),
    ("other-micro", "2026-12-02T21:14:02.123456Z", "2026-12-02T21:14:02.123457Z", False),
    ("offset-not-applied", "2026-12-02T21:30:00Z", "2026-12-02T21:30:00+02:00", False),
    ("stored-not-canonical", "2026-12-02T21:14:02+00:00", "2026-12-02T21:14:02Z", False),
    ("stored-fraction-not-canonical", "2026-12-02T21:14:02.5Z", "2026-12-02T21:14:02.5Z", False),
    ("proposed-not-rfc3339-space", "2026-12-02T21:14:02Z", "2026-12-02 21:14:02Z", False),
    ("proposed-lowercase", "2026-12-02T21:14:02Z", "2026-12-02t21:14:02z", False),
    ("proposed-no-zone", "2026-12-02T21:14:02Z", "2026-12-02T21:14:02", False),
    ("proposed-bad-day", "2026-02-29T00:00:00Z", "2026-02-29T00:00:00+00:00", False),
    ("proposed-second-60", "2026-12-02T21:14:59Z", "2026-12-02T21:14:60+00:00", False),
    ("proposed-bad-offset", "2026-12-02T21:14:02Z", "2026-12-02T21:14:02+24:00", False),
    ("not-times", "gpu-0", "gpu-0+00:00", False),
    # Year 0000 is RFC 3339 (Go reads it); 9999 with a negative offset is in year 10000 in UTC.
    ("year-zero", "0000-01-01T00:00:00Z", "0000-01-01T01:00:00+01:00", True),
    ("year-zero-day-back", "0000-12-31T23:00:00Z", "0001-01-01T00:00:00+01:00", True),
    ("year-9999-offset", "9999-12-31T23:00:00Z", "9999-12-31T22:00:00-01:00", True),
    ("year-10000-in-utc", "9999-12-31T23:00:00Z", "9999-12-31T23:30:00-01:00", False),
    ("non-ascii-digits", "2026-12-02T21:14:02Z", "\uff12\uff10\uff12\uff16-12-02T21:14:02Z", False),
    ("hour-24", "2026-12-03T00:00:00Z", "2026-12-02T24:00:00Z", False),
    ("offset-minutes-60", "2026-12-02T21:14:02Z", "2026-12-02T22:14:02+00:60", False),
]


@pytest.mark.parametrize(
    ("stored", "proposed", "same"), [c[1:] for c in INSTANTS], ids=[c[0] for c in INSTANTS]
)
def test_same_instant(stored: str, proposed: str, same: bool) -> None:
    assert same_instant(stored, proposed) is same


OPAQUE = (("status", "devices", "data"),)
TIMES = (("t",), ("status", "devices", "data", "t"), ("status", "devices", "conditions", "at"))

# (id, stored, proposed, first difference by meaning)
MEANING = [
    ("equal", {"a": 1}, {"a": 1}, None),
    ("time-respelled", {"t": "2026-12-02T21:14:02Z"}, {"t": "2026-12-02T21:14:02+00:00"}, None),
    ("time-changed", {"t": "2026-12-02T21:14:02Z"}, {"t": "2026-12-02T21:14:03Z"}, "t"),
    ("stored-null-left-out", {"c": None, "d": 1}, {"d": 1}, None),
    ("stored-null-sent-null", {"c": None}, {"c": None}, None),
    ("null-added", {"d": 1}, {"c": None, "d": 1}, "c"),
    ("null-replaced-by-value", {"c": None}, {"c": []}, "c"),
    ("value-removed", {"c": [], "d": 1}, {"d": 1}, "c"),
    ("true-is-not-1", {"n": 1}, {"n": True}, "n"),
    ("1-is-not-1.0", {"n": 1}, {"n": 1.0}, "n"),
    ("list-length", {"l": [1]}, {"l": [1, 2]}, "l[1]"),
    (
        "opaque-null-removed",
        {"status": {"devices": [{"data": {"vlan": None, "mtu": 9000}}]}},
        {"status": {"devices": [{"data": {"mtu": 9000}}]}},
        "status.devices[0].data.vlan",
    ),
    (
        "opaque-time-respelled",
        {"status": {"devices": [{"data": {"t": "2026-12-02T21:14:02Z"}}]}},
        {"status": {"devices": [{"data": {"t": "2026-12-02T21:14:02+00:00"}}]}},
        "status.devices[0].data.t",
    ),
    (
        "time-respelled-off-a-time-path",
        {"m": "2026-12-02T21:14:02Z"},
        {"m": "2026-12-02T21:14:02+00:00"},
        "m",
    ),
    (
        "time-respelled-in-a-list-item",
        {"status": {"devices": [{"conditions": [{"at": "2026-12-02T21:14:02Z"}]}]}},
        {"status": {"devices": [{"conditions": [{"at": "2026-12-02T23:14:02+02:00"}]}]}},
        None,
    ),
    (
        "time-beside-a-time-path-respelled",
        {"status": {"devices": [{"conditions": [{"message": "up since 2026-12-02T21:14:02Z"}]}]}},
        {
            "status": {
                "devices": [{"conditions": [{"message": "up since 2026-12-02T21:14:02+00:00"}]}]
            }
        },
        "status.devices[0].conditions[0].message",
    ),
    (
        "beside-opaque-null-left-out",
        {"status": {"devices": [{"conditions": None, "data": {"x": 1}}]}},
        {"status": {"devices": [{"data": {"x": 1}}]}},
        None,
    ),
]


@pytest.mark.parametrize(
    ("stored", "proposed", "where"), [c[1:] for c in MEANING], ids=[c[0] for c in MEANING]
)
def test_first_difference_by_meaning(stored: Any, proposed: Any, where: str | None) -> None:
    assert first_difference(stored, proposed, opaque=OPAQUE, times=TIMES) == where


def test_the_default_policy_names_the_time_paths_of_every_claim_version() -> None:
    kind = POLICY.kinds[("resource.k8s.io", "resourceclaims")]
    for version, spec in kind.versions.items():
        assert spec.allocation is not None
        assert ("status", "devices", "conditions", "lastTransitionTime") in spec.allocation.times
        assert ("metadata", "creationTimestamp") in spec.allocation.times, version


CLAIM_WITH_CONDITIONS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "name": "rec2-claim-1",
        "namespace": "default",
        "resourceVersion": "7",
        "creationTimestamp": "2026-12-02T21:00:00Z",
    },
    "spec": {"devices": {"requests": [{"name": "req"}]}},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "req", "driver": GPU.driver, "pool": "node-a", "device": "g"},
                    {
                        "request": "req",
                        "driver": "nic.example.com",
                        "pool": "node-a",
                        "device": "n",
                    },
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                        ]
                    }
                ]
            },
        },
        "devices": [
            {
                "driver": "nic.example.com",
                "pool": "node-a",
                "device": "n",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "LinkUp",
                        "message": "link up since 2026-12-02T21:30:00Z",
                        "lastTransitionTime": "2026-12-02T21:30:00Z",
                    }
                ],
            }
        ],
    },
}


def _gpu_write(change: Any) -> Any:
    stored = copy.deepcopy(CLAIM_WITH_CONDITIONS)
    sent = copy.deepcopy(stored)
    sent["status"]["devices"].append(
        {"driver": GPU.driver, "pool": "node-a", "device": "g", "data": {"uuid": "G"}}
    )
    change(sent["status"]["devices"][0]["conditions"][0], sent["metadata"])
    return decide_offline(ENGINE, GPU, parse_request("PUT", STATUS), sent, stored)


def test_another_drivers_condition_message_is_compared_exactly() -> None:
    """A time written into another driver's condition message is text: re-spelled, it is a
    change to that driver's entry, refused, even though it denotes the same instant."""

    def respell(condition: dict[str, Any], _: dict[str, Any]) -> None:
        condition["message"] = "link up since 2026-12-02T21:30:00.000+00:00"

    decision = _gpu_write(respell)
    assert not decision.allowed
    assert "status.devices[0].conditions[0].message differs" in decision.message
    assert 'driver "nic.example.com"' in decision.message


def test_times_at_time_paths_may_be_respelled() -> None:
    def respell(condition: dict[str, Any], metadata: dict[str, Any]) -> None:
        condition["lastTransitionTime"] = "2026-12-02T23:30:00.000+02:00"
        metadata["creationTimestamp"] = "2026-12-02T21:00:00+00:00"

    decision = _gpu_write(respell)
    assert decision.allowed, decision.message


def test_exact_comparison_without_opaque_paths() -> None:
    assert first_difference({"c": None}, {}) == "c"
    assert first_difference({"t": "2026-12-02T21:14:02Z"}, {"t": "2026-12-02T21:14:02+00:00"})
    assert first_difference({"n": 1}, {"n": True}) == "n"


def python_client_resend(obj: dict[str, Any]) -> dict[str, Any]:
    """What the official Python client sends when it re-sends ``obj`` it read: deserialized
    into its model and serialized back by its own ApiClient (no hand-written differences)."""
    client = kubernetes.client.ApiClient()
    model = client.deserialize(json.dumps(obj), "ResourceV1ResourceClaim", "application/json")
    sent = client.sanitize_for_serialization(model)
    assert isinstance(sent, dict)
    return sent


@pytest.mark.parametrize("number", [181, 183, 187])
def test_the_python_clients_resend_changes_nothing(number: int) -> None:
    stored = recording(number)["response_body"]
    sent = python_client_resend(stored)
    assert sent != stored, "the client re-spells what it read (times, nulls)"
    assert status_change_violation(CLAIM_PATHS, stored, sent, GPU.driver) is None


def test_the_python_clients_read_modify_write_of_its_own_entry_is_allowed() -> None:
    stored = recording(187)["response_body"]
    sent = python_client_resend(stored)
    gpu = next(e for e in sent["status"]["devices"] if e["driver"] == GPU.driver)
    gpu["data"] = {"uuid": "GPU-0000", "temperature": 40}
    decision = decide_offline(ENGINE, GPU, parse_request("PUT", STATUS), sent, stored)
    assert decision.allowed, decision.message
    nic = next(e for e in sent["status"]["devices"] if e["driver"] != GPU.driver)
    nic["conditions"][0]["lastTransitionTime"] = "2026-12-02T21:30:01+00:00"
    decision = decide_offline(ENGINE, GPU, parse_request("PUT", STATUS), sent, stored)
    assert not decision.allowed
    assert "status.devices[0].conditions[0].lastTransitionTime differs" in decision.message


def test_a_merge_patch_echoing_a_null_is_refused_like_the_put() -> None:
    """Recording 181 holds the nic entry with data {"vlan": null, "mtu": 9000}. Echoing it in
    a PUT keeps it (allowed); echoing it in a merge patch stores {"mtu": 9000} (182-183), a
    change to another driver's entry (refused)."""
    stored = recording(181)["response_body"]
    nic = copy.deepcopy(stored["status"]["devices"][0])
    assert nic["data"] == {"vlan": None, "mtu": 9000}
    own = {"driver": GPU.driver, "pool": "node-a", "device": "gpu-0", "data": {"uuid": "G"}}
    body = copy.deepcopy(stored)
    body["status"]["devices"] = [nic, own]
    decision = decide_offline(ENGINE, GPU, parse_request("PUT", STATUS), body, stored)
    assert decision.allowed, decision.message
    patch = {"status": {"devices": [nic, own]}}
    decision = decide_offline(
        ENGINE, GPU, parse_request("PATCH", STATUS), patch, stored, media_type=MERGE_PATCH
    )
    assert not decision.allowed
    assert "status.devices[0].data.vlan differs from the stored object" in decision.message
