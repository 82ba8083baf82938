"""The engine's conversation driven offline over the patch policy (tests/corpus/patches): what it
decides, and which dry runs it asked for on the way. Shared by the prediction's tests, the
corpus replay and the real tier's patch oracle."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
