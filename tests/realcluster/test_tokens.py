"""Drivers keep their own ServiceAccount: the unchanged Go driver and the official Python client,
configured by ``rest.InClusterConfig()`` / ``load_incluster_config()`` from their environment
and service-account volume alone, reach the gatekeeper's token listener with a pod-bound token
from a real TokenRequest; the gatekeeper asks the real apiserver who holds it."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import ApiError, RealCluster, poll
from tests.realcluster.objects import bound_token, ensure, signed_token, token_claims
from tests.realcluster.processes import (
    DriverProcess,
    GatekeeperProcess,
    in_cluster_env,
    in_pod,
    service_account_volume,
)

GPU = "gpu.example.com"
MINE = (
    "/apis/resource.k8s.io/v1/resourceslices"
    "?fieldSelector=spec.driver%3Dgpu.example.com%2Cspec.nodeName%3Dnode-a"
)


def volume(gatekeeper: GatekeeperProcess, tmp_path: Path, token: str) -> Path:
    return service_account_volume(
        tmp_path / "serviceaccount", token, gatekeeper.pki.path("ca.crt"), "gpu-system"
    )


def test_the_helper_publishes_with_in_cluster_config(
    binaries: Binaries,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    tmp_path: Path,
    journal: None,
    clean: None,
) -> None:
    token, _ = bound_token(real_cluster, "gpu-system", "gpu-driver", "node-a")
    mark = real_gatekeeper.audit_mark()
    with DriverProcess(
        binaries["dradriver"],
        "incluster",
        env=in_cluster_env(real_gatekeeper),
        wrap=in_pod(volume(real_gatekeeper, tmp_path, token)),
    ) as driver:
        pools = {"node-a": [{"name": "gpu-0"}], "node-a/more": [{"name": "gpu-1"}]}
        assert driver("publish", pools=pools)["ok"]
        poll(
            "both pools stored",
            lambda: (
                sorted(i["spec"]["pool"]["name"] for i in real_cluster.admin.get(MINE)["items"])
                == ["node-a", "node-a/more"]
            ),
        )
        assert driver.events_of("helper-error") == [], driver.stderr_tail()
    real_gatekeeper.settle()
    creates = [e for e in real_gatekeeper.audit_events()[mark:] if e["verb"] == "create"]
    assert creates and all(e["user"]["username"] == GPU for e in creates)
    extra = creates[0]["user"]["extra"]
    assert extra["dra-gatekeeper.io/transport"] == ["token"]
    assert extra["dra-gatekeeper.io/peer-serviceAccount"] == [
        "system:serviceaccount:gpu-system:gpu-driver"
    ]
    assert extra["dra-gatekeeper.io/peer-nodeName"] == ["node-a"]


_PYTHON_IN_POD = """
import json
from kubernetes import client, config
config.load_incluster_config()
slices = client.ResourceV1Api().list_resource_slice(
    field_selector="spec.driver=gpu.example.com,spec.nodeName=node-a")
node = client.CoreV1Api().read_node("node-a")
try:
    client.CoreV1Api().list_namespaced_secret("gpu-system")
    secrets = 200
except client.ApiException as e:
    secrets = e.status
print(json.dumps({"slices": len(slices.items), "node": node.metadata.name, "secrets": secrets}))
"""


def test_the_official_client_with_load_incluster_config(
    real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess, tmp_path: Path, journal: None
) -> None:
    token, _ = bound_token(real_cluster, "gpu-system", "gpu-driver", "node-a")
    command = [
        *in_pod(volume(real_gatekeeper, tmp_path, token)),
        sys.executable,
        "-c",
        _PYTHON_IN_POD,
    ]
    env = {**in_cluster_env(real_gatekeeper), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"slices": 0, "node": "node-a", "secrets": 403}


def _token_call(gatekeeper: GatekeeperProcess, token: str) -> tuple[int, dict[str, Any]]:
    api = gatekeeper.driver_api(GPU)
    api.context.load_default_certs()
    api.url = f"https://127.0.0.1:{gatekeeper.token_port}"
    api.token = token
    try:
        return 200, api.get(MINE)
    except ApiError as error:
        return error.code, error.body


def _legacy_token(cluster: RealCluster) -> str:
    account = cluster.admin.get("/api/v1/namespaces/gpu-system/serviceaccounts/gpu-driver")
    prefix = "kubernetes.io/serviceaccount/"
    token = signed_token(
        cluster,
        {
            "iss": "kubernetes/serviceaccount",
            f"{prefix}namespace": "gpu-system",
            f"{prefix}secret.name": "gpu-driver-legacy",
            f"{prefix}service-account.name": "gpu-driver",
            f"{prefix}service-account.uid": account["metadata"]["uid"],
            "sub": "system:serviceaccount:gpu-system:gpu-driver",
        },
    )
    ensure(
        cluster.admin,
        "/api/v1/namespaces/gpu-system/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "gpu-driver-legacy",
                "annotations": {"kubernetes.io/service-account.name": "gpu-driver"},
            },
            "type": "kubernetes.io/service-account-token",
            "data": {"token": base64.b64encode(token.encode()).decode()},
        },
    )
    return token


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("other-node", 403, 'bound to a pod on node "node-b", not this node "node-a"'),
        ("unmapped", 403, "service account gpu-system/stranger is not listed"),
        ("expired", 401, "service account token has expired"),
        ("garbage", 401, "invalid bearer token"),
        ("legacy", 403, "unboundTokens: Refuse"),
    ],
)
def test_tokens_that_are_no_driver_on_this_node(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    case: str,
    code: int,
    message: str,
    journal: None,
) -> None:
    if case == "other-node":
        token, _ = bound_token(real_cluster, "gpu-system", "gpu-driver", "node-b")
    elif case == "unmapped":
        token, _ = bound_token(real_cluster, "gpu-system", "stranger", "node-a")
    elif case == "expired":
        _, pod = bound_token(real_cluster, "gpu-system", "gpu-driver", "node-a")
        claims = token_claims(real_cluster, "gpu-system", "gpu-driver", pod)
        token = signed_token(real_cluster, claims | {"exp": claims["iat"] - 60})
    elif case == "legacy":
        token = _legacy_token(real_cluster)
    else:
        token = "garbage.not-a.jwt"
    status, body = _token_call(real_gatekeeper, token)
    assert (status, body.get("kind")) == (code, "Status"), body
    assert message in body["message"]
