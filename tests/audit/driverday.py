"""A whole driver's day as the kube-apiserver's audit log records it, before the gatekeeper: every
kind of call a GPU kubelet plugin makes from its node (its Node's labels, its own Pod's label,
pods on the node, events, a leader lease, an MPS Deployment, a DeviceTaintRule, its own CRD's
status and cluster-wide watch, slices and claims)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gatekeeper.testing.harness import GPU, NODE, SLICES, slice_body
from tests.audit.logs import SA_GPU, apiserver_event

__all__ = [
    "CLAIMS",
    "DOMAINS",
    "LEASES",
    "OWN_POD",
    "POD_UID",
    "RULES",
    "driver_day",
    "write_driver_day",
]

NS = "gpu-system"
OWN_POD = f"/api/v1/namespaces/{NS}/pods/driver-x7k2p"  # the pod the token names (logs.py)
POD_UID = "5b7f1a52-0c1e-4c7e-9b59-2b8f4e1c0d11"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
DOMAINS = "/apis/resource.nvidia.com/v1beta1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
_NODE_PATH = f"/api/v1/nodes/{NODE}"


def _node(labels: dict[str, str], version: str) -> dict[str, Any]:
    meta = {"name": NODE, "uid": "node-uid", "resourceVersion": version, "labels": labels}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {}}


def _pod(name: str, namespace: str, labels: dict[str, str], uid: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "20"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**meta, "labels": labels},
        "spec": {"nodeName": NODE, "serviceAccountName": "gpu-driver"},
    }


def _event() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "driver-x7k2p.17a", "namespace": NS},
        "involvedObject": {"kind": "Pod", "name": "driver-x7k2p", "namespace": NS},
        "reason": "DevicesPublished",
        "reportingComponent": GPU,
        "reportingInstance": NODE,
    }


def _lease(holder: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": f"gpu-driver-{NODE}", "namespace": NS, "resourceVersion": "30"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def _deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mps-control-daemon-cd-1", "namespace": NS},
        "spec": {"replicas": 1, "template": {"spec": {"nodeName": NODE}}},
    }


def _taint_rule() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"{NODE}-gpu-0-unhealthy"},
        "spec": {
            "deviceSelector": {"driver": GPU, "pool": f"{NODE}/gpus", "device": "gpu-0"},
            "taint": {"key": f"{GPU}/unhealthy", "effect": "NoExecute"},
        },
    }


def _domain_status() -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "cd-1", "namespace": "default", "resourceVersion": "40"},
        "spec": {"numNodes": 2},
        "status": {"nodes": [{"name": NODE, "cliqueID": "abc.1"}], "status": "Ready"},
    }


def _claim() -> dict[str, Any]:
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    result = {"request": "gpu", "driver": GPU, "pool": NODE, "device": "gpu-0"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "job-gpu", "namespace": "default", "resourceVersion": "50"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [selector]},
            }
        },
    }


def _calls() -> list[tuple[str, str, int, Any, Any]]:
    """(verb, uri, code, request body, response body) of the driver's day, in order."""
    clique = {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.clique": "abc.1"}
    domain = {**clique, "resource.nvidia.com/computeDomain": "cd-1"}
    own = _pod("driver-x7k2p", NS, {"app": "gpu-driver"}, POD_UID)
    ready = copy.deepcopy(own)
    ready["metadata"]["labels"]["nvidia.com/gpu.ready"] = "true"
    node_patch = {"metadata": {"labels": {"nvidia.com/gpu.clique": "abc.1"}}}
    domain_patch = {"metadata": {"labels": {"resource.nvidia.com/computeDomain": "cd-1"}}}
    on_node = "fieldSelector=spec.nodeName%3Dnode-a"
    created = slice_body(name=f"{NODE}-gpu")
    return [
        ("get", _NODE_PATH, 200, None, _node({"kubernetes.io/hostname": NODE}, "10")),
        ("patch", _NODE_PATH, 200, node_patch, _node(clique, "11")),
        ("patch", _NODE_PATH, 200, domain_patch, _node(domain, "12")),
        ("patch", OWN_POD, 200, {"metadata": {"labels": {"nvidia.com/gpu.ready": "true"}}}, ready),
        ("list", f"/api/v1/pods?{on_node}&limit=500", 200, None, None),
        ("watch", f"/api/v1/pods?{on_node}&watch=true&allowWatchBookmarks=true", 200, None, None),
        ("get", "/api/v1/namespaces/default/pods/job-0", 200, None,
         _pod("job-0", "default", {}, "job-uid")),
        ("create", f"/api/v1/namespaces/{NS}/events", 201, _event(), _event()),
        ("get", f"{LEASES}/gpu-driver-{NODE}", 404, None, None),
        ("create", LEASES, 201, _lease(NODE), _lease(NODE)),
        ("update", f"{LEASES}/gpu-driver-{NODE}", 200, _lease(NODE), _lease(NODE)),
        ("create", f"/apis/apps/v1/namespaces/{NS}/deployments", 201, _deployment(), None),
        ("create", RULES, 201, _taint_rule(), _taint_rule()),
        ("get", f"{RULES}/{NODE}-gpu-0-unhealthy", 200, None, _taint_rule()),
        ("list", RULES, 200, None, None),
        ("delete", f"{RULES}/{NODE}-gpu-0-unhealthy", 200, None, None),
        ("watch", f"{DOMAINS}/computedomains?watch=true", 200, None, None),
        ("update", f"{DOMAINS}/namespaces/default/computedomains/cd-1/status", 200,
         _domain_status(), _domain_status()),
        ("create", SLICES, 201, created, created),
        ("list", f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}", 200,
         None, None),
        ("get", f"{CLAIMS}/job-gpu", 200, None, _claim()),
    ]  # fmt: skip


def driver_day(level: str) -> list[dict[str, Any]]:
    """The day's audit events at ``level`` (Metadata, Request or RequestResponse)."""
    events = []
    for index, (verb, uri, code, request, response) in enumerate(_calls()):
        events.append(
            apiserver_event(
                verb,
                uri,
                SA_GPU,
                code=code,
                index=index,
                level=level,
                request_object=request if level != "Metadata" else None,
                response_object=response if level == "RequestResponse" else None,
            )
        )
    return events


def write_driver_day(path: Path, level: str) -> Path:
    path.write_text("".join(json.dumps(event) + "\n" for event in driver_day(level)))
    return path
