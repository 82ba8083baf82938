"""No node holds a key that signs for every node: ``dra-gatekeeper serve`` makes its key in its
process and gets its certificate through the real apiserver's CSR API from the real
``dra-gatekeeper signer`` (both processes, the signer with exactly deploy/signer.yaml's objects
and its Deployment's arguments); a driver with in-cluster config, trusting only the signer's
published CA, connects; the certificate is renewed while the gatekeeper runs. A request for
another node's address, one from another ServiceAccount, and one made with a token bound to no
pod are each denied, the condition saying why, and none is signed."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.realcluster.cluster import Api, RealCluster, poll
from tests.realcluster.conftest import DRIVERS
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import GatekeeperProcess
from tests.realcluster.signing import (
    CSRS,
    NODE_ADDRESSES,
    apply,
    csr_of,
    driver_in_pod,
    gpu_slices_on_node_a,
    request_certificate,
    served_serial,
    set_node_addresses,
    signer_process,
    unbound_token,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SIGNER = "dra-gatekeeper.io/token-listener"
GATEKEEPER = ("kube-system", "dra-gatekeeper")
CA_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/dra-gatekeeper-ca-certificates"
LIFETIME = 60
"""Seconds a certificate lives here (7 days in deploy/): renewed within the test."""


def _shipped() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "signer.yaml").read_text()) if d]


@pytest.fixture(scope="module")
def signer(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, bytes]]:
    """deploy/signer.yaml's objects, and the signer run with its Deployment's arguments and a
    pod-bound token of its ServiceAccount; yields its log and the CA certificate it published."""
    work = tmp_path_factory.mktemp("signer")
    set_node_addresses(real_cluster)
    documents = _shipped()
    apply(real_cluster, documents)
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(POD_NAMESPACE)", "kube-system") for a in container["args"]]
    args.append(f"--certificate-lifetime={LIFETIME}")
    token, _ = bound_token(real_cluster, "kube-system", "dra-gatekeeper-signer", "node-b")
    (work / "signer.token").write_text(token)
    kubeconfig = real_cluster.kubeconfig(
        work / "signer.kubeconfig", token_file=work / "signer.token"
    )
    with signer_process(args, kubeconfig, work / "signer.log") as log:
        published = poll(
            "the signer's CA certificate published",
            lambda: real_cluster.admin.get(CA_CONFIGMAP).get("data", {}).get("ca.crt"),
        )
        yield log, published.encode()


def _gatekeeper_token(cluster: RealCluster, work: Path) -> tuple[str, Path]:
    """A token of the gatekeeper's ServiceAccount bound to its pod on node-a, and that SA given
    the tier's ClusterRole (what it forwards) beside deploy/signer.yaml's right to ask."""
    ensure(cluster.admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tier-kube-system-gatekeeper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "dra-gatekeeper"},
        "subjects": [{"kind": "ServiceAccount", "name": GATEKEEPER[1],
                      "namespace": GATEKEEPER[0]}],
    })  # fmt: skip
    token, _ = bound_token(cluster, *GATEKEEPER, "node-a")
    path = work / "gatekeeper.token"
    path.write_text(token)
    return token, path


def _driver_connects(
    cluster: RealCluster, gatekeeper: GatekeeperProcess, work: Path, ca: bytes, name: str
) -> None:
    done = driver_in_pod(cluster, gatekeeper, work / name, ca)
    assert (done.returncode, done.stdout.strip()) == (0, gpu_slices_on_node_a(cluster)), done.stderr


def _mine(cluster: RealCluster, username: str) -> list[dict[str, Any]]:
    listed = cluster.admin.get(f"{CSRS}?fieldSelector=spec.signerName%3D{SIGNER}")["items"]
    return [c for c in listed if c["spec"]["username"] == username]


def test_serve_gets_its_certificate_from_the_signer_and_renews_it_running(
    real_cluster: RealCluster,
    real_policy: Path,
    signer: tuple[Path, bytes],
    tmp_path: Path,
) -> None:
    log, ca = signer
    _, token_file = _gatekeeper_token(real_cluster, tmp_path)
    address = NODE_ADDRESSES["node-a"]
    extra = ("--token-cert-signer", SIGNER, "--token-cert-address", "127.0.0.1",
             "--token-cert-address", address)  # fmt: skip
    gatekeeper = GatekeeperProcess(
        real_cluster, real_policy, DRIVERS, token_file, listen_token=True, extra_args=extra
    ).start()
    try:
        username = f"system:serviceaccount:{GATEKEEPER[0]}:{GATEKEEPER[1]}"
        (first,) = _mine(real_cluster, username)
        # The apiserver filled in who asked: the gatekeeper's pod on node-a.
        assert first["spec"]["extra"]["authentication.kubernetes.io/node-name"] == ["node-a"]
        approved = next(c for c in first["status"]["conditions"] if c["type"] == "Approved")
        assert approved["reason"] == "GatekeeperNodeAddresses"
        leaf = x509.load_pem_x509_certificate(base64.b64decode(first["status"]["certificate"]))
        request = x509.load_pem_x509_csr(base64.b64decode(first["spec"]["request"]))
        assert leaf.public_key() == request.public_key()  # the key stayed with serve
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sorted(str(n.value) for n in names) == ["10.11.12.1", "127.0.0.1"]
        assert served_serial(gatekeeper.token_port, ca) == leaf.serial_number
        _driver_connects(real_cluster, gatekeeper, tmp_path, ca, "first")

        # Renewed at 60-75 % of its life, into the running listener: no restart.
        renewed = poll(
            "the renewed certificate served",
            lambda: (s := served_serial(gatekeeper.token_port, ca)) != leaf.serial_number and s,
            timeout=3 * LIFETIME,
            every=1.0,
        )
        assert gatekeeper.process is not None and gatekeeper.process.poll() is None
        assert len(_mine(real_cluster, username)) >= 2
        _driver_connects(real_cluster, gatekeeper, tmp_path, ca, "renewed")
        serve_log = (gatekeeper.workdir / "serve.log").read_text()
        assert "serving certificate renewed csr=" in serve_log
        assert f"serial={renewed:x}" in serve_log
        assert "PRIVATE KEY" not in serve_log
    finally:
        gatekeeper.stop()
    assert "csr signed" in log.read_text()


@pytest.mark.parametrize(
    ("case", "reason", "words"),
    [
        ("another-nodes-address", "AddressNotOfNode",
         "asks for 10.11.12.2, which is not one of node node-a's status.addresses"),
        ("another-service-account", "RequesterNotGatekeeper",
         "spec.username 'system:serviceaccount:kube-system:not-the-gatekeeper' is not the "
         "gatekeeper's ServiceAccount"),
        ("token-bound-to-no-pod", "TokenNotPodBound", "a token not bound to a pod"),
    ],
)  # fmt: skip
def test_a_request_beyond_the_rules_is_denied_saying_why(
    case: str,
    reason: str,
    words: str,
    real_cluster: RealCluster,
    signer: tuple[Path, bytes],
    tmp_path: Path,
) -> None:
    hosts = ["127.0.0.1"]
    if case == "another-nodes-address":
        token, _ = _gatekeeper_token(real_cluster, tmp_path)
        hosts = [NODE_ADDRESSES["node-a"], NODE_ADDRESSES["node-b"]]
    elif case == "another-service-account":
        # As able to ask as the gatekeeper is: the signer, not RBAC, refuses it.
        ensure(real_cluster.admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "tier-not-the-gatekeeper-asks"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "dra-gatekeeper-serving-certificate"},
            "subjects": [{"kind": "ServiceAccount", "name": "not-the-gatekeeper",
                          "namespace": "kube-system"}],
        })  # fmt: skip
        token, _ = bound_token(real_cluster, "kube-system", "not-the-gatekeeper", "node-a")
    else:
        _gatekeeper_token(real_cluster, tmp_path)
        token = unbound_token(real_cluster, *GATEKEEPER)
    name = f"tier-{case}"
    asking = Api(real_cluster.url, real_cluster.ca_file, token=token)
    request_certificate(asking, SIGNER, hosts, name)
    try:
        denied = poll(
            f"{name} denied",
            lambda: next(
                (c for c in csr_of(real_cluster, name).get("status", {}).get("conditions", [])
                 if c["type"] == "Denied"), None,
            ),
        )  # fmt: skip
        assert denied["reason"] == reason and words in denied["message"], denied
        stored = csr_of(real_cluster, name)
        assert not stored["status"].get("certificate")
        assert [c["type"] for c in stored["status"]["conditions"]] == ["Denied"]
        log, _ = signer
        assert f"csr denied name={name} reason={reason}" in log.read_text()
    finally:
        real_cluster.admin.delete(f"{CSRS}/{name}")
