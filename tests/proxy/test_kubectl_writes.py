"""kubectl's writes through the gatekeeper: patch (merge, json, strategic), server-side apply,
replace and delete — allowed and refused, with kubectl printing the gatekeeper's Status."""

from __future__ import annotations

import json

import pytest
import yaml

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import NIC, Kubectl, slice_manifest

pytestmark = pytest.mark.kubectl
NAME = "node-a-gpu-0"


def stored(apiserver: APIServer, name: str = NAME) -> dict:
    obj = apiserver.get("resource.k8s.io", "resourceslices", name)
    assert obj is not None
    return obj


def real_writes(apiserver: APIServer) -> list[str]:
    return [
        e.method
        for e in apiserver.journal
        if e.method != "GET" and "dryRun=All" not in e.query_string
    ]


ALLOWED_PATCHES = [
    pytest.param("merge", {"metadata": {"labels": {"tier": "a"}}}, id="merge"),
    pytest.param(
        "json", [{"op": "add", "path": "/metadata/labels", "value": {"tier": "a"}}], id="json"
    ),
    pytest.param("strategic", {"metadata": {"labels": {"tier": "a"}}}, id="strategic"),
]


@pytest.mark.parametrize(("kind", "patch"), ALLOWED_PATCHES)
async def test_kubectl_patch_allowed(kubectl: Kubectl, apiserver: APIServer, kind, patch) -> None:
    apiserver.add(slice_manifest(NAME))
    code, out, err = await kubectl(
        "patch", "resourceslice", NAME, "--type", kind, "-p", json.dumps(patch)
    )
    assert code == 0, err
    assert "patched" in out
    assert stored(apiserver)["metadata"]["labels"] == {"tier": "a"}


REFUSED_PATCHES = [
    pytest.param("merge", {"spec": {"pool": {"name": "shared"}}}, id="merge"),
    pytest.param(
        "json", [{"op": "replace", "path": "/spec/pool/name", "value": "shared"}], id="json"
    ),
    pytest.param("strategic", {"spec": {"pool": {"name": "shared"}}}, id="strategic"),
]


@pytest.mark.parametrize(("kind", "patch"), REFUSED_PATCHES)
async def test_kubectl_patch_refused(kubectl: Kubectl, apiserver: APIServer, kind, patch) -> None:
    apiserver.add(slice_manifest(NAME))
    code, _, err = await kubectl(
        "patch", "resourceslice", NAME, "--type", kind, "-p", json.dumps(patch)
    )
    assert code != 0
    assert 'after the patch, spec.pool.name "shared" is not prefixed by node name "node-a"' in err
    assert real_writes(apiserver) == []
    assert stored(apiserver)["spec"]["pool"]["name"] == "node-a"


async def test_kubectl_patch_of_another_drivers_slice(
    kubectl: Kubectl, apiserver: APIServer
) -> None:
    apiserver.add(slice_manifest("node-a-nic-0", driver=NIC))
    code, _, err = await kubectl(
        "patch",
        "resourceslice",
        "node-a-nic-0",
        "--type",
        "merge",
        "-p",
        '{"metadata":{"labels":{"x":"y"}}}',
    )
    assert code != 0 and "the stored object's spec.driver" in err
    assert real_writes(apiserver) == []


async def test_kubectl_server_side_apply(kubectl: Kubectl, apiserver: APIServer) -> None:
    manifest = slice_manifest(NAME)
    code, out, err = await kubectl(
        "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert code == 0, err
    assert "serverside-applied" in out
    manifest["metadata"]["labels"] = {"tier": "b"}
    code, out, err = await kubectl(
        "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert code == 0, err
    assert stored(apiserver)["metadata"]["labels"] == {"tier": "b"}
    manifest["spec"]["pool"]["name"] = "shared"
    code, _, err = await kubectl(
        "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert code != 0 and 'is not prefixed by node name "node-a"' in err
    assert stored(apiserver)["spec"]["pool"]["name"] == "node-a"


async def test_kubectl_apply_of_another_drivers_slice(
    kubectl: Kubectl, apiserver: APIServer
) -> None:
    manifest = slice_manifest("node-a-nic-0", driver=NIC)
    code, _, err = await kubectl(
        "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert code != 0 and "does not match the calling driver" in err
    assert real_writes(apiserver) == []


async def test_kubectl_replace(kubectl: Kubectl, apiserver: APIServer) -> None:
    apiserver.add(slice_manifest(NAME))
    manifest = slice_manifest(NAME)
    manifest["spec"]["devices"].append({"name": "gpu-1"})
    code, _out, err = await kubectl("replace", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert code == 0, err
    assert len(stored(apiserver)["spec"]["devices"]) == 2
    manifest["spec"]["pool"]["name"] = "shared"
    code, _, err = await kubectl("replace", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert code != 0 and 'spec.pool.name "shared" is not prefixed' in err
    assert stored(apiserver)["spec"]["pool"]["name"] == "node-a"


async def test_kubectl_delete(kubectl: Kubectl, apiserver: APIServer) -> None:
    apiserver.add(slice_manifest(NAME))
    apiserver.add(slice_manifest("node-b-gpu-0", node="node-b", pool="node-b"))
    code, _, err = await kubectl("delete", "resourceslice", "node-b-gpu-0")
    assert code != 0 and 'the stored object\'s spec.nodeName "node-b"' in err
    code, _out, err = await kubectl("delete", "resourceslice", NAME)
    assert code == 0, err
    assert apiserver.get("resource.k8s.io", "resourceslices", NAME) is None
    assert apiserver.get("resource.k8s.io", "resourceslices", "node-b-gpu-0") is not None
