"""What the gatekeeper refuses the GPU driver on the real tier: the Status the driver gets (code
and message), that the apiserver stored nothing, and (the ``journal`` fixture) that no refused
request appears in the apiserver's own audit log.

- slices naming another driver, another node, or another node's pool;
- a claim allocated to another driver: 404, as if it did not exist. draclient (the DRA helper's
  client) reads a 404 as "this API version is not served" and walks the versions; the driver
  must keep working after one;
- Secrets, and the openapi documents kubectl asks for outside the policy's groups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import ApiError, RealCluster
from tests.realcluster.kubectl import Kubectl, kubectl_binary
from tests.realcluster.objects import allocate_claim, create_claim
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
USER = f'User "{GPU}"'
CREATE_SLICE = (
    f'resourceslices.resource.k8s.io "{{name}}" is forbidden: {USER} cannot create resource '
    '"resourceslices" in API group "resource.k8s.io" at the cluster scope: '
)


def _slice(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": GPU,
        "nodeName": "node-a",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": body,
    }


def _pool(name: str) -> dict[str, Any]:
    return {"name": name, "generation": 1, "resourceSliceCount": 1}


SLICE_REFUSALS = [
    (
        "another-driver",
        {"driver": NIC},
        f'spec.driver "{NIC}" does not match the calling driver "{GPU}"',
    ),
    (
        "another-node",
        {"nodeName": "node-b"},
        'spec.nodeName "node-b" does not match this node "node-a"',
    ),
    (
        "another-nodes-pool",
        {"pool": _pool("node-b")},
        'spec.pool.name "node-b" is not prefixed by node name "node-a"',
    ),
    (
        "another-nodes-subpool",
        {"pool": _pool("node-b/x")},
        'spec.pool.name "node-b/x" is not prefixed by node name "node-a"',
    ),
    (
        # node-a-b is what node "node-a-b" would call its pool: "-" is no separator by default.
        "node-name-prefix-pool",
        {"pool": _pool("node-a-b")},
        'spec.pool.name "node-a-b" is not prefixed by node name "node-a" followed by "/"',
    ),
]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [case[1:] for case in SLICE_REFUSALS],
    ids=[case[0] for case in SLICE_REFUSALS],
)
def test_foreign_slices(
    spec: dict[str, Any],
    reason: str,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    journal: None,
    clean: None,
) -> None:
    api = real_gatekeeper.driver_api(GPU)
    name = "refused-slice"
    with pytest.raises(ApiError) as refused:
        api.create(SLICES, _slice(name, **spec))
    assert refused.value.code == 403
    status = refused.value.body
    assert (status["reason"], status["code"]) == ("Forbidden", 403)
    assert status["message"] == CREATE_SLICE.format(name=name) + reason
    assert status["details"] == {"group": "resource.k8s.io", "kind": "resourceslices", "name": name}
    assert not real_cluster.admin.exists(f"{SLICES}/{name}")


def _claims(real_cluster: RealCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """``hidden``, allocated on node-a to the NIC driver only; ``mine``, to the GPU driver."""
    admin = real_cluster.admin
    hidden = allocate_claim(
        admin, create_claim(admin, "tenant", "hidden"), [(NIC, "node-a", "nic-0")]
    )
    mine = allocate_claim(admin, create_claim(admin, "tenant", "mine"), [(GPU, "node-a", "gpu-0")])
    return hidden, mine


def test_another_drivers_claim_is_not_found(
    real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess, journal: None, clean: None
) -> None:
    _claims(real_cluster)
    api = real_gatekeeper.driver_api(GPU)
    for version in ("v1", "v1beta2", "v1beta1"):
        with pytest.raises(ApiError) as refused:
            api.get(f"/apis/resource.k8s.io/{version}/namespaces/tenant/resourceclaims/hidden")
        # Exactly the apiserver's NotFound: a driver learns nothing of claims not its own.
        assert refused.value.body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'resourceclaims.resource.k8s.io "hidden" not found',
            "reason": "NotFound",
            "details": {"name": "hidden", "group": "resource.k8s.io", "kind": "resourceclaims"},
            "code": 404,
        }
    listed = api.get("/apis/resource.k8s.io/v1/namespaces/tenant/resourceclaims")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["mine"]


def test_draclient_keeps_working_after_a_hidden_claim(
    binaries: Binaries,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    tmp_path: Path,
    journal: None,
    clean: None,
) -> None:
    hidden, mine = _claims(real_cluster)
    connect = f"kubeconfig={real_gatekeeper.driver_kubeconfig(GPU, tmp_path)}"
    mark = real_gatekeeper.audit_mark()
    with DriverProcess(binaries["dradriver"], connect) as driver:
        # draclient, as the driver's own code uses it.
        answer = driver("get-claim", namespace="tenant", name="hidden")
        assert (answer["ok"], answer.get("code")) == (False, 404), answer

        # It asked every version it knows, each one answered 404 (a 403 would have stopped it
        # at that version, and left it there for the requests that follow).
        real_gatekeeper.settle()
        walked = {
            e["objectRef"]["apiVersion"]
            for e in real_gatekeeper.audit_events()[mark:]
            if e.get("objectRef", {}).get("name") == "hidden" and e["responseStatus"]["code"] == 404
        }
        assert walked == {"v1", "v1beta2", "v1beta1"}
        answer = driver("get-claim", namespace="tenant", name="mine")
        assert answer["ok"], answer
        assert answer["object"]["metadata"]["uid"] == mine["metadata"]["uid"]

        # The helper's own draclient lives as long as the driver: NodePrepareResources of the
        # hidden claim fails, and the next one, of the driver's own claim, succeeds.
        def ref(claim: dict[str, Any]) -> dict[str, str]:
            meta = claim["metadata"]
            return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}

        answer = driver("prepare", claims=[ref(hidden)])
        assert not answer["ok"]
        assert 'resourceclaims.resource.k8s.io "hidden" not found' in answer["error"], answer
        answer = driver("prepare", claims=[ref(mine)])
        assert answer["ok"], answer
        assert answer["claims"][mine["metadata"]["uid"]] == {
            "error": "",
            "devices": ["node-a/gpu-0"],
        }
        assert driver.events_of("helper-error") == [], driver.stderr_tail()


def test_secrets(
    real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess, journal: None
) -> None:
    """Refused with the apiserver's own Status for a user without RBAC, plus the reason."""
    api = real_gatekeeper.driver_api(GPU)
    # The same user name straight to the apiserver, with no role: the apiserver's own 403.
    direct = real_cluster.user("gpu-direct", GPU)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}}
    requests = [
        ("GET", "/api/v1/namespaces/default/secrets", None),
        ("GET", "/api/v1/namespaces/default/secrets/s1", None),
        ("POST", "/api/v1/namespaces/default/secrets", secret),
        ("GET", "/api/v1/secrets?watch=true", None),
    ]
    for method, path, body in requests:
        with pytest.raises(ApiError) as refused:
            api.call(method, path, body)
        with pytest.raises(ApiError) as apiserver:
            direct.call(method, path, body)
        assert refused.value.code == apiserver.value.code == 403
        ours, theirs = refused.value.body, apiserver.value.body
        assert ours["message"] == theirs["message"] + (
            ": the gatekeeper policy does not allow this resource"
        )
        assert {k: v for k, v in ours.items() if k != "message"} == {
            k: v for k, v in theirs.items() if k != "message"
        }


def test_openapi_beyond_the_policy(
    real_gatekeeper: GatekeeperProcess, tmp_path: Path, journal: None
) -> None:
    """kubectl, creating a Deployment as the driver, asks for the openapi document of apps/v1:
    refused (then kubectl falls back to /openapi/v2, which is open, and the create is refused)."""
    api = real_gatekeeper.driver_api(GPU)
    for path in ("/openapi/v3/apis/apps/v1", "/openapi/v3/apis/rbac.authorization.k8s.io/v1"):
        with pytest.raises(ApiError) as refused:
            api.get(path)
        assert refused.value.code == 403
        assert refused.value.body["message"] == (
            f'forbidden: {USER} cannot get path "{path}": only discovery of the policy\'s API '
            "groups is allowed"
        )
    kubeconfig = real_gatekeeper.driver_kubeconfig(GPU, tmp_path)
    kubectl = Kubectl(kubectl_binary(), kubeconfig, tmp_path / "cache")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }
    mark = real_gatekeeper.audit_mark()
    done = kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(deployment), check=False)
    assert done.returncode == 1
    assert 'cannot create resource "deployments" in API group "apps"' in done.stderr
    real_gatekeeper.settle()
    refused = sorted(
        (e["verb"], e["requestURI"].split("?")[0])
        for e in real_gatekeeper.audit_events()[mark:]
        if e["userAgent"].startswith("kubectl/")
        and e["annotations"]["authorization.k8s.io/decision"] == "forbid"
    )
    assert refused == [
        ("create", "/apis/apps/v1/namespaces/default/deployments"),
        ("get", "/openapi/v3/apis/apps/v1"),
    ]
