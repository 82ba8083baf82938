"""The engine's conversation driven offline over the patch policy (tests/corpus/patches): what it
decides, and which dry runs it asked for on the way. Shared by the prediction's tests, the
corpus replay and the real tier's patch oracle."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.patch_bench import doubling
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Decision, Engine
from gatekeeper.policy.conversation import conversation, converse
from gatekeeper.policy.plan import Preview
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.types import (
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    Identity,
    KubeObject,
    UserInfo,
)

__all__ = [
    "CLAIM_STATUS_PATH",
    "ENGINE",
    "GPU",
    "NODE",
    "NODE_PATH",
    "POD",
    "POD_PATH",
    "POD_UID",
    "POLICY_FILE",
    "SLICE_PATH",
    "TAINT_RULE_PATH",
    "Outcome",
    "decide",
    "node",
    "pod",
]

POLICY_FILE = Path(__file__).parents[1] / "corpus" / "patches" / "policy.yaml"
NODE = "node-a"
ENGINE = Engine(load_policy(str(POLICY_FILE)), NODE)
POD, POD_UID, POD_NAMESPACE = "gpu-driver-node-a", "9f0c-pod", "gpu-system"
GPU = Identity(
    "gpu.example.com",
    ListenerKind.TOKEN,
    user=UserInfo(
        "system:serviceaccount:gpu-system:gpu-driver",
        groups=("system:serviceaccounts",),
        extra={NODE_NAME_EXTRA: (NODE,), POD_NAME_EXTRA: (POD,), POD_UID_EXTRA: (POD_UID,)},
    ),
)
NODE_PATH = f"/api/v1/nodes/{NODE}"
POD_PATH = f"/api/v1/namespaces/{POD_NAMESPACE}/pods/{POD}"
SLICE_PATH = "/apis/resource.k8s.io/v1/resourceslices/{name}"
TAINT_RULE_PATH = "/apis/resource.k8s.io/v1beta2/devicetaintrules/{name}"
CLAIM_STATUS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status"


@dataclass
class Outcome:
    """What the engine decided, and the dry runs it asked for (with their answers)."""

    decision: Decision
    previews: list[Preview] = field(default_factory=list)

    @property
    def asked(self) -> bool:
        return bool(self.previews)


def decide(
    path: str,
    patch: Any,
    current: KubeObject | None,
    media_type: str,
    *,
    method: str = "PATCH",
    answer: KubeObject | None = None,
    code: int = 200,
    identity: Identity = GPU,
    engine: Engine = ENGINE,
) -> Outcome:
    """Decide ``patch`` (or an update body) on ``current`` as the proxy would; a dry run asked
    for is answered with ``answer`` (``code``), or left unanswered (as offline) when None."""
    outcome = Outcome(Decision(False, "undecided"))

    def preview(asked: Preview) -> Preview:
        answered = asked if answer is None else asked.answered(code, copy.deepcopy(answer))
        outcome.previews.append(answered)
        return answered

    talk = conversation(engine, identity, parse_request(method, path))
    outcome.decision = converse(
        talk,
        body=lambda: (media_type, copy.deepcopy(patch)),
        fetch=lambda _path: copy.deepcopy(current),
        preview=preview,
    )
    return outcome


def node(**labels: str) -> KubeObject:
    """node-a as the apiserver serves it, with ``labels`` and an annotation of another owner."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "uid": "2b1d-node",
            "resourceVersion": "41",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"kubernetes.io/hostname": NODE, **labels},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-01T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}}}},
                }
            ],
        },
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(**labels: str) -> KubeObject:
    """The caller's own pod (the one its token names), on node-a."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": POD_NAMESPACE,
            "uid": POD_UID,
            "resourceVersion": "52",
            "labels": {"app": "gpu-driver", **labels},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "plugin", "image": "driver:1"}]},
    }


def _entry(manager: str, api_version: str = "v1") -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "apiVersion": api_version,
            "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {}}}}  # fmt: skip


def resource_slice(**spec: Any) -> KubeObject:
    """The GPU driver's slice of pool node-a/oracle (``spec`` overrides)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "oracle-node-a", "resourceVersion": "7",
                     "managedFields": [_entry("dradriver", "resource.k8s.io/v1")]},
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": NODE,
            "pool": {"name": "node-a/oracle", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}},
                        {"name": "gpu-1"}],
            **spec,
        },
    }  # fmt: skip


def claim() -> KubeObject:
    """oracle-claim, allocated to the GPU and NIC drivers on node-a, with a status entry each."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}

    def entry(driver: str, device: str) -> dict[str, Any]:
        return {"driver": driver, "pool": "node-a/oracle", "device": device,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "message": "",
                                "lastTransitionTime": "2026-12-01T10:00:00Z"}]}  # fmt: skip

    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "oracle-claim", "namespace": "tenant", "resourceVersion": "30",
                     "labels": {"test": "realcluster"}},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {
                "devices": {"results": [
                    {"request": "gpu", "driver": d, "pool": "node-a/oracle", "device": dev}
                    for d, dev in (("gpu.example.com", "gpu-0"), ("nic.example.com", "nic-0"))]},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            },
            "devices": [entry("nic.example.com", "nic-0"), entry("gpu.example.com", "gpu-0")],
        },
    }  # fmt: skip


def taint_rule(driver: str = "gpu.example.com", pool: str = "node-a/oracle") -> KubeObject:
    """oracle-mine: a DeviceTaintRule in the GPU driver's scope on node-a (by default)."""
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "oracle-mine", "resourceVersion": "9"},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool},
            "taint": {"key": "gpu.example.com/unhealthy", "effect": "NoSchedule"},
        },
    }


TARGETS: dict[str, tuple[str, KubeObject]] = {
    "node": (NODE_PATH, node()),
    "pod": (POD_PATH, pod()),
    "slice": ("/apis/resource.k8s.io/v1/resourceslices/oracle-node-a", resource_slice()),
    "claim-status": (CLAIM_STATUS_PATH.format(namespace="tenant", name="oracle-claim"), claim()),
    "taint-rule": (TAINT_RULE_PATH.format(name="oracle-mine"), taint_rule()),
}
"""The stored objects the patch corpus and the real tier's oracle patch, by target name."""


CORPUS_ENTRIES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parents[1] / "corpus" / "patches" / "divergences.yaml").read_text()
)
"""The corpus of patches the gatekeeper once read otherwise than the apiserver stores them."""


def corpus_raw(entry: dict[str, Any]) -> bytes:
    """What is sent for a corpus entry, byte for byte."""
    if "raw" in entry:
        return str(entry["raw"]).encode()
    if entry.get("generate") == "doubling":
        return json.dumps(doubling(30), separators=(",", ":")).encode()
    return json.dumps(entry["patch"]).encode()


def value_at(obj: Any, path: Sequence[Any]) -> Any:
    """The value at ``path`` (member names and list indexes); None where there is none."""
    for step in path:
        if isinstance(obj, dict):
            obj = obj.get(step)
        elif isinstance(obj, list) and isinstance(step, int) and step < len(obj):
            obj = obj[step]
        else:
            return None
    return obj
