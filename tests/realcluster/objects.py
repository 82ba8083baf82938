"""What the real cluster holds before a test: nodes, namespaces, the gatekeeper's service account
bound to its pod on node-a with the ClusterRole ``dra-gatekeeper policy rbac`` prints (and nothing
more), the DevicePool CRD, and the objects tests make (claims allocated by an admin, as the
scheduler would)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from tests.realcluster.cluster import NODES, Api, ApiError, RealCluster, poll

__all__ = [
    "GATEKEEPER_NS",
    "GATEKEEPER_SA",
    "allocate_claim",
    "bootstrap",
    "bound_token",
    "create_claim",
    "ensure",
    "rbac_objects",
    "signed_token",
    "token_claims",
]

GATEKEEPER_NS = "dra-gatekeeper"
GATEKEEPER_SA = "dra-gatekeeper"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"

_DEVICEPOOL_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "devicepools.devmgmtproto.k8s.io",
        # *.k8s.io groups are protected: the prototype says it is not an approved API.
        "annotations": {"api-approved.kubernetes.io": "unapproved, experimental prototype"},
    },
    "spec": {
        "group": "devmgmtproto.k8s.io",
        "scope": "Cluster",
        "names": {
            "plural": "devicepools",
            "singular": "devicepool",
            "kind": "DevicePool",
            "listKind": "DevicePoolList",
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "selectableFields": [
                    {"jsonPath": ".spec.driver"},
                    {"jsonPath": ".spec.nodeName"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["driver", "nodeName"],
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "driver": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {"rule": "self == oldSelf", "message": "immutable"}
                                        ],
                                    },
                                    "nodeName": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {"rule": "self == oldSelf", "message": "immutable"}
                                        ],
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def ensure(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create ``body`` at the collection ``path``; an existing object of that name is kept."""
    try:
        return dict(api.create(path, body))
    except ApiError as error:
        if error.code != 409:
            raise
        name = body["metadata"]["name"]
        return dict(api.get(f"{path}/{name}"))


def rbac_objects(policy: Path, drivers: tuple[str, ...]) -> dict[str, Any]:
    """The ClusterRole ``dra-gatekeeper policy rbac`` prints for ``policy`` and ``drivers``."""
    args = [sys.executable, "-m", "gatekeeper", "policy", "rbac", "--policy", str(policy)]
    for driver in drivers:
        args += ["--driver", driver]
    printed = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    role = next(yaml.safe_load_all(printed))  # then its ClusterRoleBinding, made below
    assert role["kind"] == "ClusterRole", printed
    return dict(role)


def bootstrap(cluster: RealCluster, policy: Path, drivers: tuple[str, ...]) -> None:
    """Nodes, namespaces, the gatekeeper's RBAC and service account, the DevicePool CRD."""
    admin = cluster.admin
    for node in NODES:
        ensure(
            admin,
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            },
        )
    for namespace in (GATEKEEPER_NS, "gpu-system", "nic-system", "tenant"):
        ensure(
            admin,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    role = rbac_objects(policy, drivers)
    ensure(admin, "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    ensure(
        admin,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role["metadata"]["name"]},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": GATEKEEPER_SA, "namespace": GATEKEEPER_NS}
            ],
        },
    )
    ensure(
        admin,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        _DEVICEPOOL_CRD,
    )
    poll(
        "the DevicePool CRD to be served",
        lambda: admin.get("/apis/devmgmtproto.k8s.io/v1alpha1/devicepools") is not None,
        timeout=60,
    )


def bound_token(
    cluster: RealCluster,
    namespace: str,
    service_account: str,
    node: str,
    *,
    pod: str | None = None,
    seconds: int = 7200,
    audiences: list[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """A token of ``namespace/service_account`` bound to a Pod on ``node`` (created here; no
    kubelet runs it), as the kubelet would project it: the token and the Pod."""
    admin = cluster.admin
    ensure(
        admin,
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": service_account}},
    )
    pod_name = pod or f"{service_account}-{node}"
    pod_object = ensure(
        admin,
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name},
            "spec": {
                "nodeName": node,
                "serviceAccountName": service_account,
                "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    spec: dict[str, Any] = {
        "expirationSeconds": seconds,
        "boundObjectRef": {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod_name,
            "uid": pod_object["metadata"]["uid"],
        },
    }
    if audiences:
        spec["audiences"] = audiences
    answer = admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"]), pod_object


def create_claim(
    admin: Api, namespace: str, name: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return dict(
        admin.create(
            CLAIMS.format(ns=namespace),
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "labels": labels or {"test": "realcluster"}},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
                        ]
                    }
                },
            },
        )
    )


def allocate_claim(
    admin: Api,
    claim: dict[str, Any],
    results: list[tuple[str, str, str]],
    node: str = "node-a",
) -> dict[str, Any]:
    """Write an allocation as the scheduler would: ``results`` are (driver, pool, device)."""
    body = dict(claim)
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": d, "pool": p, "device": dev}
                    for d, p, dev in results
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
    return dict(admin.call("PUT", f"{CLAIMS.format(ns=ns)}/{name}/status", body))


def signed_token(cluster: RealCluster, claims: dict[str, Any]) -> str:
    """A token signed with the cluster's service-account key, as the recorder made the expired
    and legacy tokens (recordings 247, 249): TokenRequest issues neither."""
    key = serialization.load_pem_private_key((cluster.workdir / "sa.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = ".".join(
        b64(json.dumps(part, separators=(",", ":")).encode())
        for part in ({"alg": "ES256", "typ": "JWT"}, claims)
    )
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def token_claims(
    cluster: RealCluster, namespace: str, service_account: str, pod: dict[str, Any], **changes: Any
) -> dict[str, Any]:
    """The claims TokenRequest writes for a token of ``service_account`` bound to ``pod``."""
    account = cluster.admin.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}")
    node_name = pod["spec"]["nodeName"]
    node = cluster.admin.get(f"/api/v1/nodes/{node_name}")
    now = int(time.time())
    claims = {
        "aud": ["https://kubernetes.default.svc.cluster.local"],
        "exp": now + 3600,
        "iat": now,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "jti": str(uuid.uuid4()),
        "kubernetes.io": {
            "namespace": namespace,
            "node": {"name": node_name, "uid": node["metadata"]["uid"]},
            "pod": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            "serviceaccount": {"name": service_account, "uid": account["metadata"]["uid"]},
        },
        "nbf": now,
        "sub": f"system:serviceaccount:{namespace}:{service_account}",
    }
    claims.update(changes)
    return claims
