"""Audit logs for the offline tools: one recorded from a real run, one in kube-apiserver format."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import GPU, NIC, NODE, PINNED, SLICES, Audited, seed, slice_body

__all__ = ["SA_GPU", "SA_NIC", "apiserver_event", "record_run", "write_apiserver_log"]

SA_GPU = "system:serviceaccount:gpu-system:gpu-driver"
SA_NIC = "system:serviceaccount:nic-system:nic-driver"
WIDGETS = "/apis/example.com/v1/nodewidgets"  # a kind no policy knows yet


async def record_run(audited: Audited, apiserver: APIServer) -> Path:
    """A driver's day: list/watch, create, update, delete; and some refused requests."""
    seed(apiserver, name="node-a-nic", driver=NIC)
    async with audited.unix_session(GPU) as gpu, audited.unix_session(NIC) as nic:
        listed = await gpu.get(f"{SLICES}?{PINNED}")
        assert listed.status == 200
        watch = await gpu.get(f"{SLICES}?{PINNED}&watch=true&timeoutSeconds=1")
        created = await gpu.post(SLICES, json=slice_body(name="node-a-gpu-0"))
        obj = await created.json()
        assert created.status == 201, obj
        obj["spec"]["devices"].append({"name": "gpu-1"})
        updated = await gpu.put(f"{SLICES}/node-a-gpu-0", json=obj)
        assert updated.status == 200
        patched = await gpu.patch(
            f"{SLICES}/node-a-gpu-0",
            data=json.dumps({"metadata": {"labels": {"a": "b"}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status == 200, await patched.text()
        assert (await gpu.get(f"{SLICES}/node-a-gpu-0")).status == 200
        assert (await gpu.delete(f"{SLICES}/node-a-gpu-0")).status == 200
        assert (await gpu.post(SLICES, json=slice_body(pool="other-gpus"))).status == 403
        assert (await gpu.get(f"{SLICES}/node-a-nic")).status == 403
        assert (await gpu.get(SLICES)).status == 403
        assert (await nic.get("/apis/resource.k8s.io/v1")).status == 200
        await asyncio.wait_for(watch.read(), 5)
    await audited.stop()
    return audited.log_path


def apiserver_event(
    verb: str,
    uri: str,
    user: str,
    *,
    code: int = 200,
    node: str | None = NODE,
    request_object: Any = None,
    response_object: Any = None,
    stage: str = "ResponseComplete",
    index: int = 0,
    level: str = "Request",
) -> dict[str, Any]:
    """An event as the kube-apiserver writes it for a bound service account token."""
    path = uri.split("?")[0].split("/")
    object_ref: dict[str, str] = {}
    if path[1] == "apis" and len(path) > 4:
        object_ref = {"resource": path[4], "apiGroup": path[2], "apiVersion": path[3]}
        if len(path) > 5:
            object_ref["name"] = path[5]
    elif path[1] == "api" and len(path) > 3:
        object_ref = {"resource": path[3], "apiVersion": path[2]}
        if len(path) > 4:
            object_ref["name"] = path[4]
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/credential-id": ["JTI=0b8e1c2d"],
        "authentication.kubernetes.io/pod-name": ["driver-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["5b7f1a52-0c1e-4c7e-9b59-2b8f4e1c0d11"],
    }
    if node:
        extra["authentication.kubernetes.io/node-name"] = [node]
    ns = user.split(":")[2] if user.startswith("system:serviceaccount:") else ""
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": level,
        "auditID": f"3c5e1f9a-0000-4000-8000-{index:012d}",
        "stage": stage,
        "requestURI": uri,
        "verb": verb,
        "user": {
            "username": user,
            "uid": "9a1c6a50-6a2f-4f52-8d0e-4f0a1c2b3d4e",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{ns}",
                "system:authenticated",
            ],
            "extra": extra,
        },
        "sourceIPs": ["10.244.1.7"],
        "userAgent": "gpu-kubeletplugin/v0.0.0 (linux/amd64) kubernetes/$Format",
        "objectRef": object_ref,
        "responseStatus": {"metadata": {}, "code": code},
        "requestReceivedTimestamp": f"2025-06-01T10:00:{index % 60:02d}.000000Z",
        "stageTimestamp": f"2025-06-01T10:00:{index % 60:02d}.004000Z",
        "annotations": {
            "authorization.k8s.io/decision": "allow" if code != 403 else "forbid",
            "authorization.k8s.io/reason": 'RBAC: allowed by ClusterRoleBinding "dra-driver"',
        },
    }
    if not object_ref:
        del event["objectRef"]
    if request_object is not None:
        event["requestObject"] = request_object
    if response_object is not None:
        event["responseObject"] = response_object
    return event


def widget_body(name: str, driver: str = GPU, node: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "NodeWidget",
        "metadata": {"name": name, "labels": {"tier": "gpu"}},
        "spec": {"owner": {"driverName": driver}, "node": node, "size": "large"},
    }


def write_apiserver_log(path: Path) -> Path:
    """Today's traffic, before the gatekeeper: some of it the gatekeeper would refuse."""
    lines = [
        apiserver_event("create", SLICES, SA_GPU, stage="RequestReceived", index=0,
                        request_object=slice_body()),
        apiserver_event("create", SLICES, SA_GPU, code=201, index=0, request_object=slice_body()),
        apiserver_event("list", f"{SLICES}?{PINNED}&limit=500", SA_GPU, index=1),
        apiserver_event("watch", f"{SLICES}?{PINNED}&watch=true", SA_GPU, index=2),
        # Allowed by RBAC, refused by the gatekeeper: no field selector, another node's slice.
        apiserver_event("list", SLICES, SA_GPU, index=3),
        apiserver_event("create", SLICES, SA_GPU, code=201, index=4,
                        request_object=slice_body(name="node-b-gpu", node="node-b", pool="node-b")),
        apiserver_event("create", WIDGETS, SA_NIC, code=201, index=5,
                        request_object=widget_body("node-a-widget", driver=NIC)),
        apiserver_event("get", "/api/v1/nodes/node-a", "system:node:node-a", index=6),
        apiserver_event("get", "/apis/resource.k8s.io/v1", SA_GPU, index=7),
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
