"""The exported admission policy in the real cluster: what ``dra-gatekeeper policy vap`` prints for
the tier's policy and a gatekeeper's ServiceAccount, applied by an admin and proven loaded (a
probe write that only it refuses is refused) before anything relies on it; and the check that
the apiserver refused none of what a gatekeeper forwarded for it (docs/admission-policy.md).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.realcluster.cluster import Api, ApiError, RealCluster, poll
from tests.realcluster.objects import GATEKEEPER_NS, GATEKEEPER_SA, bound_token, ensure

__all__ = [
    "ADMISSION",
    "SLICES",
    "admission_objects",
    "await_admission",
    "denied_by",
    "forwarded_but_denied",
    "install_admission",
    "node_slice",
]

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def admission_objects(
    policy: Path, drivers: Iterable[str], account: str, name: str
) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its Binding, as the command prints them."""
    args = [sys.executable, "-m", "gatekeeper", "policy", "vap", "--policy", str(policy)]
    args += ["--service-account", account, "--name", name]
    for driver in drivers:
        args += ["--driver", driver]
    printed = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    objects = [o for o in yaml.safe_load_all(printed) if o]
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], printed
    return objects


def denied_by(name: str) -> str:
    """Part of the apiserver's message when the policy ``name`` (and its binding of the
    same name) denies a request."""
    return f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: "


def node_slice(node: str, *, driver: str = "gpu.example.com", pool: str = "") -> dict[str, Any]:
    """A ResourceSlice of ``driver`` on ``node`` (pool: the node's name unless given)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"admission-{uuid.uuid4().hex[:10]}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


def install_admission(
    cluster: RealCluster,
    policy: Path,
    drivers: Iterable[str],
    *,
    namespace: str = GATEKEEPER_NS,
    service_account: str = GATEKEEPER_SA,
    name: str = "dra-gatekeeper",
) -> None:
    """Apply the export for ``namespace/service_account``, then poll until the apiserver
    enforces it: a dry-run create of node-b's slice with that account's node-a token is refused
    by it (the account's RBAC allows the create; only the admission policy refuses it).
    Admission policies become effective asynchronously, so the refusal is polled for."""
    vap, binding = admission_objects(policy, drivers, f"{namespace}/{service_account}", name)
    ensure(cluster.admin, f"{ADMISSION}/validatingadmissionpolicies", vap)
    ensure(cluster.admin, f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    await_admission(cluster, namespace, service_account, name)


def await_admission(cluster: RealCluster, namespace: str, service_account: str, name: str) -> None:
    """Poll until the admission policy ``name`` for ``namespace/service_account`` is enforced
    (the probe of :func:`install_admission`)."""
    token, _ = bound_token(cluster, namespace, service_account, "node-a")
    direct = Api(cluster.url, cluster.ca_file, token=token)
    probe = node_slice("node-b")

    def refused() -> bool:
        try:
            direct.create(f"{SLICES}?dryRun=All", probe)
        except ApiError as error:
            message = str(error.body.get("message", "")) if isinstance(error.body, dict) else ""
            if error.code == 403 and denied_by(name) in message:
                return True
            raise
        return False

    poll(f"the admission policy {name} to be enforced", refused, timeout=60, every=0.2)


def forwarded_but_denied(
    cluster_events: Iterable[dict[str, Any]], forwarded: set[str], name: str = "dra-gatekeeper"
) -> list[tuple[str, str, str]]:
    """The apiserver's events, among those of the Audit-IDs a gatekeeper ``forwarded``, that the
    admission policy ``name`` denied: (verb, requestURI, message)."""
    denied = []
    for event in cluster_events:
        if event["auditID"] not in forwarded:
            continue
        status = event.get("responseStatus") or {}
        if status.get("code") == 403 and denied_by(name) in str(status.get("message", "")):
            denied.append((event["verb"], event["requestURI"], str(status["message"])))
    return denied
