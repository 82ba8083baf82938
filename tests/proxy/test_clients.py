"""Real clients, unchanged, through the gatekeeper's mTLS listener: kubectl 1.32 (client-go)
and the official `kubernetes` Python client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    SELECTOR,
    Kubectl,
    Running,
    slice_manifest,
    write_kubeconfig,
)


@pytest.mark.kubectl
async def test_kubectl_get_with_field_selector(kubectl: Kubectl, apiserver: APIServer) -> None:
    apiserver.add(slice_manifest("node-a-gpu-0"))
    apiserver.add(slice_manifest("node-a-nic-0", driver=NIC))
    apiserver.add(slice_manifest("node-b-gpu-0", node="node-b", pool="node-b"))
    code, out, err = await kubectl("get", "resourceslices", "--field-selector", SELECTOR)
    assert code == 0, err
    assert "node-a-gpu-0" in out
    assert "node-a-nic-0" not in out and "node-b-gpu-0" not in out
    table_requests = [e for e in apiserver.journal if "as=Table" in e.headers.get("Accept", "")]
    assert table_requests, "kubectl negotiates a Table and the gatekeeper passes it through"


@pytest.mark.kubectl
async def test_kubectl_create_and_delete(kubectl: Kubectl, apiserver: APIServer) -> None:
    manifest = yaml.safe_dump(slice_manifest("node-a-gpu-created"))
    code, out, err = await kubectl("create", "-f", "-", stdin=manifest)
    assert code == 0, err
    assert "node-a-gpu-created created" in out
    assert apiserver.get("resource.k8s.io", "resourceslices", "node-a-gpu-created") is not None
    code, out, err = await kubectl("delete", "resourceslice", "node-a-gpu-created")
    assert code == 0, err
    assert apiserver.get("resource.k8s.io", "resourceslices", "node-a-gpu-created") is None


@pytest.mark.kubectl
@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("get", "secrets"), None, 'cannot list resource "secrets" in API group ""'),
        (("get", "resourceslices"), None, "list requires fieldSelector"),
        (
            ("create", "-f", "-"),
            yaml.safe_dump(slice_manifest("node-a-nic-x", driver=NIC)),
            'does not match the calling driver "gpu.example.com"',
        ),
        (
            ("create", "-f", "-"),
            yaml.safe_dump(slice_manifest("bad-pool", pool="shared")),
            'spec.pool.name "shared" is not prefixed by node name "node-a"',
        ),
        # kubectl sends a built-in kind as protobuf: refused for its kind, not its encoding.
        (
            ("create", "secret", "generic", "foo", "--from-literal=a=b"),
            None,
            'cannot create resource "secrets" in API group "" in the namespace "default": '
            "the gatekeeper policy does not allow this resource",
        ),
    ],
    ids=["secrets", "cluster-wide-list", "other-driver", "bad-pool", "create-secret"],
)
async def test_kubectl_prints_the_gatekeepers_refusal(
    kubectl: Kubectl, apiserver: APIServer, args: tuple[str, ...], stdin: str | None, message: str
) -> None:
    code, _, err = await kubectl(*args, stdin=stdin)
    assert code != 0
    assert "forbidden" in err.lower() and message in err
    assert not [e for e in apiserver.journal if e.method != "GET" or "secrets" in e.path]


async def test_python_client(gatekeeper: Running, apiserver: APIServer, tmp_path: Path) -> None:
    kubernetes = pytest.importorskip("kubernetes")
    path = write_kubeconfig(tmp_path, gatekeeper, GPU)
    apiserver.add(slice_manifest("node-a-gpu-0"))
    apiserver.add(slice_manifest("node-a-nic-0", driver=NIC))

    def run() -> tuple[list[str], str, int]:
        client = kubernetes.config.new_client_from_config(config_file=str(path))
        api = kubernetes.client.ResourceV1Api(client)
        listed = api.list_resource_slice(field_selector=SELECTOR)
        created = api.create_resource_slice(slice_manifest("node-a-gpu-1"))
        try:
            api.list_resource_slice()
        except kubernetes.client.ApiException as exc:
            refused = exc.status
        else:
            refused = 0
        api.delete_resource_slice("node-a-gpu-1")
        client.close()
        return [item.metadata.name for item in listed.items], created.metadata.name, refused

    names, created, refused = await asyncio.to_thread(run)
    assert names == ["node-a-gpu-0"]
    assert created == "node-a-gpu-1"
    assert refused == 403
    assert apiserver.get("resource.k8s.io", "resourceslices", "node-a-gpu-1") is None


async def test_python_client_discovery(gatekeeper: Running, tmp_path: Path) -> None:
    """The Python client's discovery calls end in "/" (/api/, /apis/<group>/<version>/,
    /version/): served as the apiserver serves them (checked on the real tier too)."""
    kubernetes = pytest.importorskip("kubernetes")
    path = write_kubeconfig(tmp_path, gatekeeper, GPU)

    def run() -> tuple[Any, ...]:
        client = kubernetes.config.new_client_from_config(config_file=str(path))
        api = kubernetes.client
        try:
            return (
                api.VersionApi(client).get_code().major,
                api.CoreApi(client).get_api_versions().versions,
                {r.name for r in api.CoreV1Api(client).get_api_resources().resources},
                {g.name for g in api.ApisApi(client).get_api_versions().groups},
                api.ResourceApi(client).get_api_group().name,
                {r.name for r in api.ResourceV1Api(client).get_api_resources().resources},
            )
        finally:
            client.close()

    major, core, core_v1, groups, group, resources = await asyncio.to_thread(run)
    assert major == "1"
    assert core == ["v1"]
    assert "nodes" in core_v1
    assert "resource.k8s.io" in groups
    assert group == "resource.k8s.io"
    assert {"resourceslices", "resourceclaims", "resourceclaims/status"} <= resources
