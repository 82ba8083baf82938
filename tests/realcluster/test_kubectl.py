"""kubectl 1.32 as a driver, through the gatekeeper's mTLS listener, against the real apiserver.

Every kind the policy lets a driver write: create, get, patch (merge, JSON, strategic), three
server-side applies with a changed value, delete; claim status through ``--subresource=status``
on a claim the admin allocated; ``get -w`` with the driver's field selector seeing an admin's
change; and kubectl's discovery and openapi requests (``api-resources``, ``explain``). What
counts is what the apiserver stored, read as the admin. kubectl gets a discovery cache of its
own per test, so its discovery and openapi requests are made in every test, and any refusal of
them would show on its stderr (which must stay empty) and in the gatekeeper's audit log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.cluster import Api, RealCluster
from tests.realcluster.kubectl import Kubectl, kubectl_binary
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import GatekeeperProcess

GPU = "gpu.example.com"
MINE = f"spec.driver={GPU},spec.nodeName=node-a"


@pytest.fixture
def kubectl(real_gatekeeper: GatekeeperProcess, tmp_path: Path) -> Iterator[Kubectl]:
    """kubectl as the GPU driver; afterwards, every request it made was allowed, but for the
    designed 404 of a read of an object that is not (or no longer) there."""
    binary = kubectl_binary()
    mark = real_gatekeeper.audit_mark()
    yield Kubectl(binary, real_gatekeeper.driver_kubeconfig(GPU, tmp_path), tmp_path / "cache")
    real_gatekeeper.settle()
    refused = [
        (e["verb"], e["requestURI"], e["responseStatus"]["code"], e["annotations"])
        for e in real_gatekeeper.audit_events()[mark:]
        if e["userAgent"].startswith("kubectl/")
        and e["annotations"]["authorization.k8s.io/decision"] == "forbid"
        and not (e["responseStatus"]["code"] == 404 and e["verb"] == "get")
    ]
    assert refused == []


@pytest.fixture
def admin_kubectl(real_cluster: RealCluster, tmp_path: Path) -> Kubectl:
    """kubectl straight to the apiserver as a cluster admin (to compare answers)."""
    cert = real_cluster.client_cert("admin-kubectl", "admin", "system:masters")
    kubeconfig = real_cluster.kubeconfig(tmp_path / "admin.kubeconfig", cert=cert)
    return Kubectl(kubectl_binary(), kubeconfig, tmp_path / "admin-cache")


@dataclass(frozen=True)
class Kind:
    """A node-local kind as a manifest, the path the admin reads it at, and a value to change."""

    resource: str
    collection: str
    name: str
    manifest: dict[str, Any]
    value_path: tuple[str, ...]
    strategic: bool  # the apiserver takes strategic merge patches (built-in kinds only)

    def with_value(self, value: str) -> str:
        manifest = json.loads(json.dumps(self.manifest))
        _set(manifest, self.value_path, value)
        return yaml.safe_dump(manifest)

    def stored(self, admin: Api) -> dict[str, Any]:
        return dict(admin.get(f"{self.collection}/{self.name}"))

    def value(self, admin: Api) -> Any:
        obj: Any = self.stored(admin)
        for key in self.value_path:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        return obj


def _set(obj: Any, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    obj[path[-1]] = value


SLICE = Kind(
    "resourceslice",
    "/apis/resource.k8s.io/v1/resourceslices",
    "node-a-gpu-kubectl",
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu-kubectl"},
        "spec": {
            "driver": GPU,
            "nodeName": "node-a",
            "pool": {"name": "node-a/kubectl", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}],
        },
    },
    ("spec", "devices", "0", "attributes", "model", "string"),
    strategic=True,
)
POOL = Kind(
    "devicepool",
    "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools",
    "node-a",
    {
        "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
        "kind": "DevicePool",
        "metadata": {"name": "node-a"},
        "spec": {"driver": GPU, "nodeName": "node-a", "model": "a100"},
    },
    ("spec", "model"),
    strategic=False,
)


@pytest.mark.parametrize("kind", [SLICE, POOL], ids=lambda k: k.resource)
def test_create_get_patch_apply_delete(
    kind: Kind,
    kubectl: Kubectl,
    admin_kubectl: Kubectl,
    real_cluster: RealCluster,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    target = f"{kind.resource}/{kind.name}"

    kubectl.run("create", "-f", "-", stdin=kind.with_value("a100"))
    stored = kind.stored(admin)
    assert (stored["spec"]["driver"], stored["spec"]["nodeName"]) == (GPU, "node-a")

    got = kubectl.json("get", target)
    assert got["metadata"]["uid"] == stored["metadata"]["uid"]
    assert got["spec"] == stored["spec"]
    assert kind.name in kubectl.run("get", kind.resource, "--field-selector", MINE).stdout

    kubectl.run("patch", target, "--type=merge", "-p", '{"metadata":{"labels":{"merge":"1"}}}')
    kubectl.run(
        "patch",
        target,
        "--type=json",
        "-p",
        '[{"op":"add","path":"/metadata/labels/json","value":"2"}]',
    )
    strategic = '{"metadata":{"labels":{"strategic":"3"}}}'
    if kind.strategic:
        kubectl.run("patch", target, "--type=strategic", "-p", strategic)
    else:
        # A custom resource takes no strategic merge patch: the driver gets the apiserver's own
        # answer, word for word what an admin gets straight from the apiserver.
        refused = kubectl.run("patch", target, "--type=strategic", "-p", strategic, check=False)
        direct = admin_kubectl.run(
            "patch", target, "--type=strategic", "-p", strategic, check=False
        )
        assert refused.returncode == direct.returncode == 1
        assert "not supported" in refused.stderr
        assert refused.stderr == direct.stderr
    labels = kind.stored(admin)["metadata"]["labels"]
    want = {"merge": "1", "json": "2"} | ({"strategic": "3"} if kind.strategic else {})
    assert labels == want

    kubectl.run("delete", target)
    assert not admin.exists(f"{kind.collection}/{kind.name}")

    # Three applies: the first creates, the next two change a value kubectl's manager owns.
    kubectl.run("apply", "--server-side", "-f", "-", stdin=kind.with_value("a100"))
    assert kind.value(admin) == "a100"
    if not kind.strategic:
        # docs/policy.md#apiserverimmutable-a-security-assertion: for a kind whose driver,
        # node and pool fields
        # the policy does not list as immutable (DevicePool), an apply that creates is
        # forwarded as a create, so kubectl's fields are first owned by an Update of the
        # manager "kubectl"; the apply that first changes one conflicts with it, once.
        conflict = kubectl.run(
            "apply", "--server-side", "-f", "-", stdin=kind.with_value("h100"), check=False
        )
        assert 'conflict with "kubectl"' in conflict.stderr, conflict.stderr
        assert kind.value(admin) == "a100"
        kubectl.run(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=kind.with_value("h100"),
        )
    else:
        kubectl.run("apply", "--server-side", "-f", "-", stdin=kind.with_value("h100"))
    assert kind.value(admin) == "h100"
    kubectl.run("apply", "--server-side", "-f", "-", stdin=kind.with_value("b200"))
    assert kind.value(admin) == "b200"
    managers = {m["manager"] for m in kind.stored(admin)["metadata"]["managedFields"]}
    assert managers == {"kubectl"}
    kubectl.run("delete", target)
    assert not admin.exists(f"{kind.collection}/{kind.name}")


def _claim(admin: Api, name: str, drivers: list[str]) -> dict[str, Any]:
    """A claim the admin allocated on node-a to ``drivers``; the NIC driver's status entry, if
    it has a result, already written (so the GPU driver must leave it be)."""
    claim = create_claim(admin, "tenant", name)
    results = [(d, "node-a", f"{d.split('.')[0]}-0") for d in drivers]
    claim = allocate_claim(admin, claim, results)
    if "nic.example.com" in drivers:
        claim["status"]["devices"] = [
            {"driver": "nic.example.com", "pool": "node-a", "device": "nic-0", "data": {"nic": 1}}
        ]
        path = f"{CLAIMS.format(ns='tenant')}/{name}/status"
        claim = admin.call("PUT", path, claim)
    return claim


def _devices(admin: Api, name: str) -> dict[str, Any]:
    claim = admin.get(f"{CLAIMS.format(ns='tenant')}/{name}")
    return {e["driver"]: e for e in claim["status"].get("devices", [])}


def test_claim_status(
    kubectl: Kubectl, real_cluster: RealCluster, journal: None, clean: None
) -> None:
    admin = real_cluster.admin
    nic_entry = _claim(admin, "shared", [GPU, "nic.example.com"])["status"]["devices"][0]
    _claim(admin, "nic-only", ["nic.example.com"])
    claim = "resourceclaim/shared"

    # Only the claim with a GPU result on this node is there for the GPU driver.
    listed = kubectl.json("get", "resourceclaims", "-A")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["shared"]
    assert "shared" in kubectl.run("get", "resourceclaims", "-n", "tenant").stdout
    got = kubectl.json("get", "-n", "tenant", claim)
    assert got["status"]["allocation"]["devices"]["results"][0]["driver"] == GPU

    own = {"driver": GPU, "pool": "node-a", "device": "gpu-0"}
    # A merge patch replaces the whole list: the NIC entry goes back exactly as read.
    merge = {"status": {"devices": [nic_entry, {**own, "data": {"step": "merge"}}]}}
    kubectl.run(
        "patch",
        "-n",
        "tenant",
        claim,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(merge),
    )
    assert _devices(admin, "shared")[GPU]["data"] == {"step": "merge"}
    json_patch = [{"op": "replace", "path": "/status/devices/1/data", "value": {"step": "json"}}]
    kubectl.run(
        "patch",
        "-n",
        "tenant",
        claim,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps(json_patch),
    )
    assert _devices(admin, "shared")[GPU]["data"] == {"step": "json"}
    strategic = {"status": {"devices": [nic_entry, {**own, "data": {"step": "strategic"}}]}}
    kubectl.run(
        "patch",
        "-n",
        "tenant",
        claim,
        "--subresource=status",
        "--type=strategic",
        "-p",
        json.dumps(strategic),
    )
    assert _devices(admin, "shared")[GPU]["data"] == {"step": "strategic"}

    # Server-side apply of the driver's own entry (a list map keyed by driver, pool, device).
    for step in ("apply-1", "apply-2", "apply-3"):
        manifest = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": "tenant"},
            "status": {"devices": [{**own, "data": {"step": step}}]},
        }
        kubectl.run(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--subresource=status",
            "-f",
            "-",
            stdin=yaml.safe_dump(manifest),
        )
        assert _devices(admin, "shared")[GPU]["data"] == {"step": step}
    assert _devices(admin, "shared")["nic.example.com"] == nic_entry


def test_watch_sees_an_admin_change(
    kubectl: Kubectl, real_cluster: RealCluster, journal: None, clean: None
) -> None:
    admin = real_cluster.admin
    kubectl.run("create", "-f", "-", stdin=SLICE.with_value("a100"))
    _claim(admin, "watched", [GPU])
    columns = "-o=custom-columns=NAME:.metadata.name,MARK:.metadata.labels.mark"
    slices = kubectl.watch("get", "resourceslices", "-w", "--field-selector", MINE, columns)
    claims = kubectl.watch("get", "resourceclaims", "-A", "-w", columns)
    with slices as slice_watch, claims as claim_watch:
        slice_watch.wait_for("the slice listed", lambda line: line.split()[:1] == [SLICE.name])
        claim_watch.wait_for("the claim listed", lambda line: line.split()[:1] == ["watched"])
        patch = {"metadata": {"labels": {"mark": "seen-by-watch"}}}
        admin.call(
            "PATCH",
            f"{SLICE.collection}/{SLICE.name}",
            patch,
            content_type="application/merge-patch+json",
        )
        admin.call(
            "PATCH",
            f"{CLAIMS.format(ns='tenant')}/watched",
            patch,
            content_type="application/merge-patch+json",
        )
        seen = [SLICE.name, "seen-by-watch"]
        assert slice_watch.wait_for("the admin's label", lambda line: line.split() == seen)
        assert claim_watch.wait_for(
            "the admin's label", lambda line: line.split() == ["watched", "seen-by-watch"]
        )


@pytest.mark.parametrize(
    "resource", ["resourceslices.spec.pool", "devicepools", "resourceclaims.status", "nodes.spec"]
)
def test_explain(resource: str, kubectl: Kubectl, journal: None) -> None:
    """``explain`` reads the openapi v3 document of the kind's group (``/openapi/v3/api/v1`` for
    the core group): every kind the policy lets a driver use can be explained."""
    out = kubectl.run("explain", resource).stdout
    assert out.startswith(("GROUP:", "KIND:")), out


def test_discovery(kubectl: Kubectl, journal: None) -> None:
    resources = kubectl.run("api-resources", "-o", "name").stdout.split()
    assert {"resourceslices.resource.k8s.io", "devicepools.devmgmtproto.k8s.io", "nodes"} <= set(
        resources
    )
    versions = kubectl.run("api-versions").stdout.split()
    assert {"resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"} <= set(
        versions
    )
    version = json.loads(kubectl.run("get", "--raw", "/version").stdout)
    assert "gitVersion" in version
