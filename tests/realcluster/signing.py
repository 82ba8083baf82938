"""The signer and the certificate requests of the real tier: node addresses as a kubelet would
report them, ``dra-gatekeeper signer`` as a process with a token of its own ServiceAccount, the
objects a manifest makes, and requests made and read as the apiserver keeps them."""

from __future__ import annotations

import base64
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography import x509

from gatekeeper.codec import pki
from tests.realcluster.cluster import Api, RealCluster, poll
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import (
    GatekeeperProcess,
    in_cluster_env,
    in_pod,
    service_account_volume,
)

__all__ = [
    "CSRS",
    "NODE_ADDRESSES",
    "apply",
    "csr_of",
    "driver_in_pod",
    "gpu_slices_on_node_a",
    "request_certificate",
    "served_serial",
    "set_node_addresses",
    "signer_process",
    "unbound_token",
]

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
NODE_ADDRESSES = {"node-a": "10.11.12.1", "node-b": "10.11.12.2"}
"""The InternalIP each node reports (no kubelet runs here: the tier writes them)."""
_PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
}


def set_node_addresses(cluster: RealCluster) -> None:
    """Each node's status.addresses, as its kubelet would report them (idempotent)."""
    for node, address in NODE_ADDRESSES.items():
        stored = cluster.admin.get(f"/api/v1/nodes/{node}")
        stored["status"] = {**stored.get("status", {}), "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": node},
        ]}  # fmt: skip
        cluster.admin.call("PUT", f"/api/v1/nodes/{node}/status", stored)


def apply(cluster: RealCluster, documents: Sequence[dict[str, Any]]) -> None:
    """Create the ServiceAccounts, Secrets, ConfigMaps and RBAC of a manifest (no kubelet runs
    workloads here: the tests run their processes themselves); existing ones are kept."""
    for document in documents:
        kind = document["kind"]
        if kind not in _PLURALS:
            continue
        group = "/apis/rbac.authorization.k8s.io/v1" if "Role" in kind else "/api/v1"
        namespace = document["metadata"].get("namespace")
        where = f"/namespaces/{namespace}" if namespace else ""
        ensure(cluster.admin, f"{group}{where}/{_PLURALS[kind]}", document)


def unbound_token(cluster: RealCluster, namespace: str, account: str) -> str:
    """A TokenRequest's token bound to nothing: no pod, hence no node in its claims."""
    answer = cluster.admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}},
    )  # fmt: skip
    return str(answer["status"]["token"])


def request_certificate(api: Api, signer: str, hosts: Sequence[str], name: str) -> None:
    """A request of ``signer`` for ``hosts``, made with ``api``'s credentials."""
    pem = pki.certificate_request(pki.new_key(), hosts, "test")
    api.create(CSRS, {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": base64.b64encode(pem).decode(), "signerName": signer,
                 "usages": ["digital signature", "server auth"]},
    })  # fmt: skip


def csr_of(cluster: RealCluster, name: str) -> dict[str, Any]:
    return dict(cluster.admin.get(f"{CSRS}/{name}"))


def served_serial(port: int, ca_pem: bytes) -> int:
    """The serial of the certificate the TLS listener on ``port`` serves, verified by
    ``ca_pem`` for 127.0.0.1."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


@contextmanager
def signer_process(args: Sequence[str], kubeconfig: Path, log: Path) -> Iterator[Path]:
    """``dra-gatekeeper signer ARGS`` with ``kubeconfig``, until the block ends; yields its log.
    It must stop on SIGTERM with 0 and never log a token or a key."""
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gatekeeper", *args, "--kubeconfig", str(kubeconfig)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            poll("the signer to start", lambda: _started(process, log), timeout=60)
            yield log
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "PRIVATE KEY" not in text and "eyJ" not in text


def _started(process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the signer exited {process.returncode}: {log.read_text()[-2000:]}")
    return "signer started" in log.read_text()


_GPU_ON_NODE_A = "spec.driver=gpu.example.com,spec.nodeName=node-a"
_DRIVER_IN_POD = f"""
from kubernetes import client, config
config.load_incluster_config()
slices = client.ResourceV1Api().list_resource_slice(field_selector="{_GPU_ON_NODE_A}")
print(len(slices.items))
"""


def gpu_slices_on_node_a(cluster: RealCluster) -> str:
    """How many slices the driver in a pod should list, as the admin counts them (other tests
    of the tier may have left some: the count is the apiserver's, not a constant)."""
    listed = cluster.admin.get(
        f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={_GPU_ON_NODE_A}"
    )
    return str(len(listed["items"]))


def driver_in_pod(
    cluster: RealCluster,
    gatekeeper: GatekeeperProcess,
    directory: Path,
    ca_pem: bytes,
    account: tuple[str, str] = ("gpu-system", "gpu-driver"),
) -> subprocess.CompletedProcess[str]:
    """The official client with ``load_incluster_config()``, in a pod of ``account`` on
    node-a whose service-account volume holds ``ca_pem`` as its only CA, listing the GPU
    driver's slices through the gatekeeper's token listener (it prints how many)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trusted.crt").write_bytes(ca_pem)
    token, _ = bound_token(cluster, *account, "node-a")
    volume = service_account_volume(
        directory / "serviceaccount", token, str(directory / "trusted.crt"), account[0]
    )
    env = {**in_cluster_env(gatekeeper), "PATH": "/usr/bin:/bin"}
    command = [*in_pod(volume), sys.executable, "-c", _DRIVER_IN_POD]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
