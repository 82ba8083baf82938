"""The chart installed into the real apiserver with ``helm install``, and a driver published
through a gatekeeper configured from what it installed.

The tier has no kubelet, so the DaemonSet's pods never run: the test reads the DaemonSet and the
policy ConfigMap back from the apiserver, checks the rendered ``serve`` arguments parse, and runs
``serve`` as the tier runs it (its own socket directory, audit file and ports instead of the
hostPaths) with the stored policy, the rendered limits, and a token of the release's
ServiceAccount bound to a pod on node-a. The driver's writes then pass the ClusterRole, the
ValidatingAdmissionPolicy and the FlowSchema the chart installed; the apiserver classifies the
gatekeeper's requests into that FlowSchema (its ``X-Kubernetes-PF-FlowSchema-UID`` answer)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.cli.main import build_parser
from tests.realcluster.build import Binaries
from tests.realcluster.cluster import RealCluster, poll
from tests.realcluster.helm import CHART, Helm, generated_values
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

NAMESPACE = "helm-gk"
ACCOUNT = "gk"
CLUSTER_NAME = "dra-gatekeeper-helm"
"""The cluster-scoped objects' name (--name): the tier's own are called dra-gatekeeper."""
GPU = "gpu.example.com"
POLICY = f"""\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [{GPU}]
"""
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# serve flags the rendered DaemonSet sets that the tier replaces: node paths and listeners.
_TIER_OWNS = {"policy", "socket_dir", "audit_log", "health_listen", "listen_token",
              "tls_cert_file", "tls_key_file"}  # fmt: skip


@pytest.fixture
def installed(
    binaries: Binaries, real_cluster: RealCluster, tmp_path: Path
) -> Iterator[tuple[Helm, Path]]:
    """``helm install`` of the chart with values generated for POLICY, then uninstalled."""
    values = generated_values(tmp_path, POLICY, f"{NAMESPACE}/{ACCOUNT}", name=CLUSTER_NAME)
    (tmp_path / "settings.yaml").write_text(
        yaml.safe_dump({"name": ACCOUNT, "listeners": {"token": {"enabled": False}}})
    )
    cert = real_cluster.client_cert("admin-helm", "admin", "system:masters")
    kubeconfig = real_cluster.kubeconfig(tmp_path / "admin.kubeconfig", cert=cert)
    helm = Helm(binaries["helm"], tmp_path / "helm-home")
    ensure(real_cluster.admin, "/api/v1/namespaces",
           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})  # fmt: skip
    helm.run("install", "gk", str(CHART), "--namespace", NAMESPACE, "--kubeconfig",
             str(kubeconfig), "-f", str(values),
             "-f", str(tmp_path / "settings.yaml"))  # fmt: skip
    try:
        yield helm, kubeconfig
    finally:
        helm.run("uninstall", "gk", "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig))
        real_cluster.admin.delete(SLICES)


def _apf_answer(cluster: RealCluster, token: str) -> dict[str, str]:
    """The headers of the apiserver's answer to the gatekeeper's token alone (no client
    certificate: the apiserver would authenticate that first)."""
    request = urllib.request.Request(cluster.url + SLICES, method="GET")
    request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        return {k.lower(): v for k, v in answer.headers.items()}


def _served_args(daemonset: dict[str, Any]) -> list[str]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    build_parser().parse_args(args)  # exits 2 on anything serve does not accept
    kept = []
    for arg in args[1:]:
        flag = arg.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if flag not in _TIER_OWNS:
            kept.append(arg)
    return kept


def test_helm_install_then_a_driver_publishes_through_its_gatekeeper(
    installed: tuple[Helm, Path], binaries: Binaries, real_cluster: RealCluster, tmp_path: Path
) -> None:
    helm, kubeconfig = installed
    admin = real_cluster.admin
    listed = helm.run("list", "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig)).stdout
    assert "deployed" in listed
    daemonset = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{ACCOUNT}")
    configmap = admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{ACCOUNT}-policy")
    assert configmap["data"]["policy.yaml"] == POLICY
    schema = admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{CLUSTER_NAME}")
    level = admin.get(
        f"/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/{CLUSTER_NAME}"
    )
    policy_path = tmp_path / "served-policy.yaml"
    policy_path.write_text(configmap["data"]["policy.yaml"])
    token, _ = bound_token(real_cluster, NAMESPACE, ACCOUNT, "node-a")
    token_file = tmp_path / "gatekeeper.token"
    token_file.write_text(token)
    extra = tuple(_served_args(daemonset))
    assert "--audit-log-maxsize=100" in extra
    gatekeeper = GatekeeperProcess(real_cluster, policy_path, (), token_file, extra_args=extra)
    gatekeeper.start()
    try:
        with DriverProcess(binaries["dradriver"], f"socket={gatekeeper.socket(GPU)}") as driver:
            pool = [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}]
            assert driver("publish", pools={"node-a": pool})["ok"]
            mine = f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3Dnode-a"
            poll("the slice stored", lambda: admin.get(mine)["items"] or None)
            assert driver.events_of("helper-error") == [], driver.stderr_tail()
    finally:
        gatekeeper.stop()
    # APF: the release's FlowSchema and priority level classify the gatekeeper's credentials
    # (the apiserver's configuration controller picks new FlowSchemas up asynchronously).
    want = {
        "x-kubernetes-pf-flowschema-uid": schema["metadata"]["uid"],
        "x-kubernetes-pf-prioritylevel-uid": level["metadata"]["uid"],
    }
    seen: list[dict[str, str]] = []

    def classified() -> bool:
        answer = _apf_answer(real_cluster, token)
        seen.append({key: answer.get(key, "") for key in want})
        return seen[-1] == want

    try:
        poll("the gatekeeper's requests classified into the chart's FlowSchema", classified)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; want {want}, last answered {seen[-1:]}") from None
