"""The chart installed in one command into the real apiserver, nothing prepared by hand (``helm
install --create-namespace``: no namespace, Secret, CA or RBAC made first), and everything it
installed run from what it installed.

The tier has no kubelet, so no pod runs: the test reads the workloads back from the apiserver
and runs each as its kubelet would, with a token of its own ServiceAccount bound to a pod on a
node and its ConfigMap volumes written from the apiserver: the signer makes its CA at its first
start; ``publish-ca`` gives the CA to the driver's namespace and the gatekeeper its RoleBinding
there, once that namespace appears (it does not exist at install); ``serve`` gets its
certificate from the signer; a driver with in-cluster config trusting that published CA
publishes through the token listener. The driver's writes pass the ClusterRole, the
ValidatingAdmissionPolicy and the FlowSchema the chart installed; the apiserver classifies the
gatekeeper's requests into that FlowSchema (its ``X-Kubernetes-PF-FlowSchema-UID`` answer)."""

from __future__ import annotations

import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.cli.main import build_parser
from tests.realcluster.build import Binaries
from tests.realcluster.cluster import RealCluster, poll
from tests.realcluster.helm import CHART, DRIVER_NAMESPACE_KIND, Helm, generated_values
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import DriverProcess, GatekeeperProcess
from tests.realcluster.signing import (
    NODE_ADDRESSES,
    driver_in_pod,
    set_node_addresses,
    signer_process,
)

NAMESPACE = "helm-gk"
ACCOUNT = "gk"
CLUSTER_NAME = "dra-gatekeeper-helm"
"""The cluster-scoped objects' name (--name): the tier's own are called dra-gatekeeper."""
SIGNER = "helm-gk.example.com/token-listener"
"""A signer name of the release's own: the tier's signer answers dra-gatekeeper.io's."""
GPU = "gpu.example.com"
DRIVER_NS = "helm-driver"
POLICY = f"""\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [{GPU}]
serviceAccounts:
  {GPU}: [{DRIVER_NS}/gpu-plugin]
{DRIVER_NAMESPACE_KIND}"""
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# serve flags the rendered DaemonSet sets that the tier replaces: node paths and listeners.
_TIER_OWNS = {"policy", "socket_dir", "audit_log", "health_listen", "listen_token"}


@pytest.fixture
def installed(
    binaries: Binaries, real_cluster: RealCluster, tmp_path: Path
) -> Iterator[tuple[Helm, Path]]:
    """``helm install --create-namespace`` of the chart with values generated for POLICY, then
    uninstalled."""
    values = generated_values(tmp_path, POLICY, f"{NAMESPACE}/{ACCOUNT}", name=CLUSTER_NAME)
    (tmp_path / "settings.yaml").write_text(
        yaml.safe_dump({"name": ACCOUNT, "signer": {"signerName": SIGNER}})
    )
    cert = real_cluster.client_cert("admin-helm", "admin", "system:masters")
    kubeconfig = real_cluster.kubeconfig(tmp_path / "admin.kubeconfig", cert=cert)
    helm = Helm(binaries["helm"], tmp_path / "helm-home")
    assert not real_cluster.admin.exists(f"/api/v1/namespaces/{NAMESPACE}")
    assert not real_cluster.admin.exists(f"/api/v1/namespaces/{DRIVER_NS}")
    helm.run("install", "gk", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
             "--kubeconfig", str(kubeconfig), "-f", str(values),
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


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _served_args(daemonset: dict[str, Any]) -> list[str]:
    args: list[str] = _container(daemonset)["args"]
    build_parser().parse_args(args)  # exits 2 on anything serve does not accept
    kept = []
    for arg in args[1:]:
        flag = arg.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if flag not in _TIER_OWNS:
            # The downward API's status.hostIP: node-a's address, as its kubelet would set.
            kept.append(arg.replace("$(HOST_IP)", NODE_ADDRESSES["node-a"]))
    return kept


def _running_as(
    cluster: RealCluster, workload: dict[str, Any], node: str, work: Path
) -> tuple[list[str], Path]:
    """What the kubelet would give the workload's container: its arguments (env expanded),
    a kubeconfig with a token of its ServiceAccount bound to a pod on ``node``; and each of its
    ConfigMap volumes written to a directory (the mount path replaced by it in the args)."""
    spec = workload["spec"]["template"]["spec"]
    container = _container(workload)
    work.mkdir(parents=True, exist_ok=True)
    args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in container["args"]]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    # The longest mount path first: /etc/dra-gatekeeper is a prefix of /etc/dra-gatekeeper-ca.
    volumes = sorted(spec.get("volumes", []), key=lambda v: -len(mounts[v["name"]]))
    for volume in volumes:
        name = volume["configMap"]["name"]
        stored = cluster.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}")
        directory = work / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in (stored.get("data") or {}).items():
            (directory / key).write_text(text)
        args = [a.replace(mounts[volume["name"]], str(directory)) for a in args]
    account = spec["serviceAccountName"]
    token, _ = bound_token(cluster, NAMESPACE, account, node)
    (work / f"{account}.token").write_text(token)
    kubeconfig = cluster.kubeconfig(work / f"{account}.kubeconfig",
                                    token_file=work / f"{account}.token")  # fmt: skip
    return args, kubeconfig


def test_one_helm_install_and_a_driver_publishes_through_its_gatekeeper(
    installed: tuple[Helm, Path], binaries: Binaries, real_cluster: RealCluster, tmp_path: Path
) -> None:
    helm, kubeconfig = installed
    admin = real_cluster.admin
    set_node_addresses(real_cluster)
    listed = helm.run("list", "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig)).stdout
    assert "deployed" in listed
    apps = f"/apis/apps/v1/namespaces/{NAMESPACE}"
    daemonset = admin.get(f"{apps}/daemonsets/{ACCOUNT}")
    signer = admin.get(f"{apps}/deployments/{ACCOUNT}-signer")
    publisher = admin.get(f"{apps}/deployments/{ACCOUNT}-ca-publisher")
    configmap = admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{ACCOUNT}-policy")
    assert configmap["data"]["policy.yaml"] == POLICY
    # The signer off the worker nodes, on the control plane (overridable).
    assert signer["spec"]["template"]["spec"]["nodeSelector"] == {
        "node-role.kubernetes.io/control-plane": ""
    }

    # The signer: its CA made at its first start into the Secret only it reads.
    signer_args, signer_config = _running_as(real_cluster, signer, "node-b", tmp_path / "s")
    with signer_process(signer_args, signer_config, tmp_path / "signer.log"):
        secret = admin.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ACCOUNT}-signer-ca")
        assert set(secret["data"]) == {"ca.crt", "ca.key"}

        # publish-ca: the driver's namespace does not exist yet, which fails nothing.
        args, config = _running_as(real_cluster, publisher, "node-b", tmp_path / "p")
        once = [sys.executable, "-m", "gatekeeper", *args, "--kubeconfig", str(config), "--once"]
        done = subprocess.run(once, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and f"namespace-missing namespace={DRIVER_NS}" in done.stderr
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NS}}
        ensure(admin, "/api/v1/namespaces", namespace)
        done = subprocess.run(once, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        published = admin.get(f"/api/v1/namespaces/{DRIVER_NS}/configmaps/dra-gatekeeper-ca")
        binding = admin.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{DRIVER_NS}/"
                            f"rolebindings/{CLUSTER_NAME}-driver-namespaces")  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}
        ]

        # serve, with the installed arguments, its certificate from the signer.
        policy_path = tmp_path / "served-policy.yaml"
        policy_path.write_text(configmap["data"]["policy.yaml"])
        token, _ = bound_token(real_cluster, NAMESPACE, ACCOUNT, "node-a")
        token_file = tmp_path / "gatekeeper.token"
        token_file.write_text(token)
        extra = tuple(_served_args(daemonset))
        assert f"--token-cert-signer={SIGNER}" in extra and "--audit-log-maxsize=100" in extra
        gatekeeper = GatekeeperProcess(
            real_cluster, policy_path, (), token_file, listen_token=True, extra_args=extra
        )
        gatekeeper.start()
        try:
            with DriverProcess(binaries["dradriver"], f"socket={gatekeeper.socket(GPU)}") as driver:
                pool = [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}]
                assert driver("publish", pools={"node-a": pool})["ok"]
                mine = f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3Dnode-a"
                poll("the slice stored", lambda: admin.get(mine)["items"] or None)
                assert driver.events_of("helper-error") == [], driver.stderr_tail()
            # A driver keeping its in-cluster config, trusting only the CA published to it.
            ca = published["data"]["ca.crt"].encode()
            done = driver_in_pod(real_cluster, gatekeeper, tmp_path / "driver", ca,
                                 (DRIVER_NS, "gpu-plugin"))  # fmt: skip
            assert done.returncode == 0 and int(done.stdout) >= 1, done.stderr
        finally:
            gatekeeper.stop()

    # APF: the release's FlowSchema and priority level classify the gatekeeper's credentials
    # (the apiserver's configuration controller picks new FlowSchemas up asynchronously).
    schema = admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{CLUSTER_NAME}")
    level = admin.get(
        f"/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/{CLUSTER_NAME}"
    )
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
