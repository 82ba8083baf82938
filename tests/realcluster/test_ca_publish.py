"""The CA reaches drivers without hand work: ``dra-gatekeeper publish-ca``, with exactly the RBAC
of deploy/ca-distribution.yaml and a pod-bound token of its own ServiceAccount, keeps the
ConfigMap in every namespace the policy maps a driver's ServiceAccount to, follows a policy edit
and each step of a CA rotation, puts back what an admin deleted or edited, and a driver whose
service-account volume takes ``ca.crt`` from that ConfigMap connects to the token listener."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from gatekeeper.cli.certs import create_ca
from tests.realcluster.cluster import Api, ApiError, RealCluster, poll
from tests.realcluster.conftest import DEFAULT_POLICY, SERVICE_ACCOUNTS
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import GatekeeperProcess
from tests.realcluster.signing import driver_in_pod, gpu_slices_on_node_a

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = "dra-gatekeeper-ca"
PUBLISHER = ("kube-system", "dra-gatekeeper-ca-publisher")
EXTRA = "ca-extra"
MISSING = "ca-missing"
RBAC = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ServiceAccount": "/api/v1/namespaces/kube-system/serviceaccounts",
}


def _policy(path: Path, accounts: dict[str, list[str]]) -> None:
    mapping = "".join(f"  {driver}: {json.dumps(names)}\n" for driver, names in accounts.items())
    text = DEFAULT_POLICY.read_text() + "\nserviceAccounts:\n" + mapping
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    scratch.rename(path)  # as the kubelet swaps a ConfigMap volume: all at once


def _write_ca(ca_dir: Path, name: str, pem: bytes | None) -> None:
    if pem is None:
        (ca_dir / name).unlink()
        return
    scratch = ca_dir / f".{name}.tmp"
    scratch.write_bytes(pem)
    scratch.rename(ca_dir / name)


def _fingerprints(pem: str | bytes) -> list[str]:
    data = pem.encode() if isinstance(pem, str) else pem
    return [c.fingerprint(hashes.SHA256()).hex() for c in x509.load_pem_x509_certificates(data)]


def _published(cluster: RealCluster, namespace: str) -> list[str] | None:
    try:
        stored = cluster.admin.get(f"/api/v1/namespaces/{namespace}/configmaps/{NAME}")
    except ApiError as error:
        if error.code == 404:
            return None
        raise
    return _fingerprints(stored["data"]["ca.crt"])


def _all_publish(cluster: RealCluster, namespaces: list[str], want: list[str]) -> None:
    poll(
        f"{NAME} in {namespaces} to hold {len(want)} certificate(s)",
        lambda: all(_published(cluster, ns) == want for ns in namespaces),
        timeout=30,
    )


@pytest.fixture
def publisher_kubeconfig(real_cluster: RealCluster, tmp_path: Path) -> Iterator[Path]:
    """The shipped ServiceAccount, ClusterRole and binding, and a token bound to a pod."""
    shipped = [d for d in yaml.safe_load_all((DEPLOY / "ca-distribution.yaml").read_text()) if d]
    for document in shipped:
        if document["kind"] in RBAC:
            ensure(real_cluster.admin, RBAC[document["kind"]], document)
    for namespace in (EXTRA,):
        ensure(
            real_cluster.admin,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    token, _ = bound_token(real_cluster, *PUBLISHER, "node-a")
    token_file = tmp_path / "publisher.token"
    token_file.write_text(token)
    yield real_cluster.kubeconfig(tmp_path / "publisher.kubeconfig", token_file=token_file)
    for namespace in ("gpu-system", "nic-system", EXTRA):
        path = f"/api/v1/namespaces/{namespace}/configmaps/{NAME}"
        if real_cluster.admin.exists(path):
            real_cluster.admin.delete(path)


def _command(kubeconfig: Path, ca_dir: Path, policy: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "gatekeeper", "publish-ca",
        "--kubeconfig", str(kubeconfig),
        "--ca-dir", str(ca_dir),
        "--policy", str(policy),
        *extra,
    ]  # fmt: skip


def _driver_connects(
    cluster: RealCluster, gatekeeper: GatekeeperProcess, tmp_path: Path, name: str
) -> subprocess.CompletedProcess[str]:
    """The official client, in a pod whose service-account volume takes ``ca.crt`` from the
    published ConfigMap of gpu-system (what the token-driver example projects)."""
    stored = cluster.admin.get(f"/api/v1/namespaces/gpu-system/configmaps/{NAME}")
    return driver_in_pod(cluster, gatekeeper, tmp_path / name, stored["data"]["ca.crt"].encode())


def test_the_ca_follows_the_policy_and_a_rotation_and_drivers_connect_with_it(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    publisher_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    serving = Path(real_gatekeeper.pki.path("ca.crt")).read_bytes()
    _write_ca(ca_dir, "ca.crt", serving)
    policy = tmp_path / "policy.yaml"
    accounts = {driver: [account] for driver, account in SERVICE_ACCOUNTS.items()}
    accounts["gpu.example.com"].append(f"{MISSING}/gpu-driver")
    _policy(policy, accounts)
    log = open(tmp_path / "publish.log", "w+")  # noqa: SIM115 - closed below
    command = _command(publisher_kubeconfig, ca_dir, policy, "--resync-period", "1")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        drivers = ["gpu-system", "nic-system"]
        old = _fingerprints(serving)
        _all_publish(real_cluster, drivers, old)
        done = _driver_connects(real_cluster, real_gatekeeper, tmp_path, "first")
        want = gpu_slices_on_node_a(real_cluster)
        assert (done.returncode, done.stdout.strip()) == (0, want), done.stderr

        # A namespace that does not exist is named in the log; the others are served anyway.
        poll(
            "the missing namespace logged",
            lambda: f"namespace-missing namespace={MISSING}" in Path(log.name).read_text(),
        )

        # The policy maps one more ServiceAccount: its namespace gets the ConfigMap.
        accounts["nic.example.com"].append(f"{EXTRA}/nic-helper")
        _policy(policy, accounts)
        _all_publish(real_cluster, [EXTRA], old)

        # Rotation, step 1: the next CA is trusted beside the current one.
        following = create_ca("dra-gatekeeper-ca-next").cert_pem
        _write_ca(ca_dir, "trust.crt", following)
        new = _fingerprints(following)
        _all_publish(real_cluster, [*drivers, EXTRA], old + new)
        done = _driver_connects(real_cluster, real_gatekeeper, tmp_path, "both")
        assert done.returncode == 0, done.stderr
        # Step 2: the gatekeepers mint from the next CA; the old one is still trusted.
        _write_ca(ca_dir, "ca.crt", following)
        _write_ca(ca_dir, "trust.crt", serving)
        _all_publish(real_cluster, [*drivers, EXTRA], new + old)
        # Step 3: the old CA is dropped. This gatekeeper still serves a certificate of the old
        # CA, so a driver trusting only what is published now must fail: the CA is the check.
        _write_ca(ca_dir, "trust.crt", None)
        _all_publish(real_cluster, [*drivers, EXTRA], new)
        done = _driver_connects(real_cluster, real_gatekeeper, tmp_path, "rotated")
        assert done.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr

        # What an admin deletes or edits by hand is put back.
        path = f"/api/v1/namespaces/nic-system/configmaps/{NAME}"
        real_cluster.admin.delete(path)
        _all_publish(real_cluster, ["nic-system"], new)
        stored = real_cluster.admin.get(path)
        stored["data"] = {"ca.crt": serving.decode()}
        real_cluster.admin.call("PUT", path, stored)
        _all_publish(real_cluster, ["nic-system"], new)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        log.close()
    output = Path(log.name).read_text()
    assert code == 0, output
    assert "Traceback" not in output
    assert "BEGIN CERTIFICATE" not in output and "eyJ" not in output  # no bundle, no token


def test_its_rights_are_the_one_configmap(
    real_cluster: RealCluster, publisher_kubeconfig: Path, tmp_path: Path
) -> None:
    """The shipped role reads and writes only ``dra-gatekeeper-ca``: another ConfigMap of a
    driver namespace is refused by the apiserver."""
    config = yaml.safe_load(publisher_kubeconfig.read_text())
    token = Path(config["users"][0]["user"]["tokenFile"]).read_text()
    api = Api(real_cluster.url, real_cluster.ca_file, token=token)
    other: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    ensure(real_cluster.admin, "/api/v1/namespaces/gpu-system/configmaps", other)
    for method, path in (
        ("GET", "/api/v1/namespaces/gpu-system/configmaps/x"),
        ("PUT", "/api/v1/namespaces/gpu-system/configmaps/x"),
        ("DELETE", "/api/v1/namespaces/gpu-system/configmaps/x"),
        ("GET", "/api/v1/namespaces/gpu-system/configmaps"),
        ("GET", "/api/v1/namespaces/gpu-system/secrets"),
    ):
        with pytest.raises(ApiError) as refused:
            api.call(method, path, other if method == "PUT" else None)
        assert refused.value.code == 403, (method, path)


def test_once_says_whether_every_namespace_is_current(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    publisher_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    _write_ca(ca_dir, "ca.crt", Path(real_gatekeeper.pki.path("ca.crt")).read_bytes())
    policy = tmp_path / "policy.yaml"
    _policy(policy, {"gpu.example.com": ["gpu-system/gpu-driver"]})
    once = _command(publisher_kubeconfig, ca_dir, policy, "--once")
    done = subprocess.run(once, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _published(real_cluster, "gpu-system") is not None
    _policy(policy, {"gpu.example.com": ["gpu-system/gpu-driver", f"{MISSING}/gpu-driver"]})
    done = subprocess.run(once, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"namespace-missing namespace={MISSING} name={NAME} code=404" in done.stderr
