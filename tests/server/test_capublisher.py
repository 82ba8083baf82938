"""The CA bundle ``publish-ca`` publishes, and every bad input refused before anything is written
(exit 2, one line naming the flag or file); the RoleBinding it keeps in each driver namespace
(--bind-role), on the embedded API server serving ConfigMaps and RoleBindings. Its reconciling
of a rotation is tested on the real tier (tests/realcluster/test_ca_publish.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from gatekeeper.apiserver import APIServer, ServedKind
from gatekeeper.cli.certs import create_ca, issue_server_cert
from gatekeeper.cli.publishca import run_publish_ca_command
from gatekeeper.errors import ConfigError
from gatekeeper.server.capublisher import PublishConfig, Publisher, read_bundle
from gatekeeper.testing.harness import NODE_TOKEN
from gatekeeper.upstream.kubeconfig import UpstreamConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CA = create_ca()
NEXT = create_ca("next")
LEAF = issue_server_cert(CA, ["127.0.0.1"])


def _dir(tmp_path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _subjects(bundle: str) -> list[str]:
    return [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(bundle.encode())]


def test_every_certificate_of_every_crt_file_in_name_order_once(tmp_path: Path) -> None:
    ca_dir = _dir(
        tmp_path,
        {
            "trust.crt": NEXT.cert_pem + CA.cert_pem,
            "ca.crt": CA.cert_pem,
            "notes.txt": b"ignored",
            ".hidden.crt": b"ignored: the kubelet's volume internals are dot files",
        },
    )
    assert _subjects(read_bundle(ca_dir)) == ["CN=dra-gatekeeper-ca", "CN=next"]


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({}, "no certificate in any *.crt file"),
        ({"ca.crt": CA.cert_pem + CA.key_pem}, "ca.crt: holds a private key"),
        ({"ca.crt": LEAF.cert_pem}, "ca.crt: CN=127.0.0.1 is not a CA certificate"),
        ({"ca.crt": b"garbage"}, "ca.crt: not a PEM certificate"),
        ({"ca.crt": b""}, "ca.crt: not a PEM certificate"),
    ],
    ids=["empty", "private-key", "leaf", "garbage", "empty-file"],
)
def test_a_bad_bundle_is_refused_naming_the_file(
    tmp_path: Path, files: dict[str, bytes], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem.replace("*", r"\*")):
        read_bundle(_dir(tmp_path, files))


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return path


@pytest.mark.parametrize(
    ("args", "files", "line"),
    [
        (["--configmap", "Bad_Name"], {"ca.crt": CA.cert_pem}, "is not a valid ConfigMap name"),
        (["--resync-period", "0"], {"ca.crt": CA.cert_pem}, "--resync-period must be between"),
        ([], {"ca.crt": CA.key_pem}, "holds a private key"),
        (["--policy", "/nonexistent.yaml"], {"ca.crt": CA.cert_pem}, "/nonexistent.yaml"),
    ],
    ids=["name", "resync", "key", "policy"],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    files: dict[str, bytes],
    line: str,
) -> None:
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    _dir(ca_dir, files)
    code = run_publish_ca_command(["--kubeconfig", str(kubeconfig), "--ca-dir", str(ca_dir), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("dra-gatekeeper publish-ca: ") and line in err
    assert err.count("\n") == 1


def test_a_missing_ca_dir_and_an_unknown_flag(
    tmp_path: Path, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = ["--kubeconfig", str(kubeconfig), "--ca-dir", str(tmp_path / "nope")]
    assert run_publish_ca_command(missing) == 2
    assert "--ca-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        run_publish_ca_command(["--ca-dir", str(tmp_path), "--configmaps", "x"])
    assert exited.value.code == 2
    assert "did you mean" in capsys.readouterr().err


def _shipped() -> dict[str, Any]:
    documents = yaml.safe_load_all((DEPLOY / "ca-distribution.yaml").read_text())
    deployment: dict[str, Any] = next(d for d in documents if d and d["kind"] == "Deployment")
    return deployment


def test_the_shipped_deployment_mounts_certificates_only() -> None:
    spec = _shipped()["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    # The signer's certificates' ConfigMap: no Secret at all, so no key can be in it.
    assert volumes["ca-certificates"] == {
        "name": "ca-certificates",
        "configMap": {"name": "dra-gatekeeper-ca-certificates"},
    }


def test_the_shipped_args_run_and_an_unreachable_apiserver_is_exit_1(
    tmp_path: Path, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Deployment's own args, its mount paths moved under tmp_path: accepted, and with no
    apiserver to answer (``--once``) the namespace is logged as failed, nothing raised."""
    (container,) = _shipped()["spec"]["template"]["spec"]["containers"]
    policy_dir, ca_dir = tmp_path / "policy", tmp_path / "ca"
    policy_dir.mkdir()
    ca_dir.mkdir()
    (policy_dir / "policy.yaml").write_text((DEPLOY / "policy.yaml").read_text())
    (ca_dir / "ca.crt").write_bytes(CA.cert_pem)
    args = [
        a.replace("/etc/dra-gatekeeper-ca", str(ca_dir)).replace(
            "/etc/dra-gatekeeper", str(policy_dir)
        )
        for a in container["args"]
    ]
    assert args[0] == "publish-ca"
    code = run_publish_ca_command([*args[1:], "--kubeconfig", str(kubeconfig), "--once"])
    assert code == 1
    assert "ca configmap failed namespace=dra-example-driver" in caplog.text


RBAC = ServedKind("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", True, ("v1",))
CONFIGMAPS = ServedKind("", "configmaps", "ConfigMap", True, ("v1",))
BINDINGS = "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/gk-driver-namespaces"


@pytest.fixture
async def api() -> AsyncIterator[APIServer]:
    server = APIServer((CONFIGMAPS, RBAC), token=NODE_TOKEN)
    await server.start()
    yield server
    await server.close()


async def test_the_gatekeepers_rolebinding_is_made_in_each_namespace_and_put_back(
    api: APIServer, tmp_path: Path
) -> None:
    """--bind-role: in every namespace the policy maps a ServiceAccount to, a RoleBinding of
    the DriverNamespace ClusterRole to the gatekeeper, made when missing, put back when its
    subjects were edited; one naming another role is left alone and reported."""
    policy = tmp_path / "policy.yaml"
    policy.write_text((DEPLOY.parent / "tests/policy/rules/rules.yaml").read_text())
    (tmp_path / "ca").mkdir()
    (tmp_path / "ca" / "ca.crt").write_bytes(CA.cert_pem)
    publisher = Publisher(
        PublishConfig(
            upstream=UpstreamConfig(server=api.url, token=NODE_TOKEN),
            policy=str(policy),
            ca_dir=tmp_path / "ca",
            configmap="dra-gatekeeper-ca",
            resync_seconds=60,
            bind_role="gk-driver-namespaces",
            bind_subject=("ops", "gk"),
        )
    )
    assert await publisher.once()
    for namespace in ("fpga-system", "gpu-system"):
        binding = api.get("rbac.authorization.k8s.io", "rolebindings", "gk-driver-namespaces",
                          namespace=namespace)  # fmt: skip
        assert binding is not None
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gk-driver-namespaces",
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gk",
                                        "namespace": "ops"}]  # fmt: skip
    edited = api.get("rbac.authorization.k8s.io", "rolebindings", "gk-driver-namespaces",
                     namespace="gpu-system")  # fmt: skip
    assert edited is not None
    api.store.delete(("rbac.authorization.k8s.io", "rolebindings"),
                     ("gpu-system", "gk-driver-namespaces"))  # fmt: skip
    edited["subjects"] = [{"kind": "ServiceAccount", "name": "intruder", "namespace": "ops"}]
    del edited["metadata"]["resourceVersion"], edited["metadata"]["uid"]
    api.add({**edited, "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"})
    other = dict(edited, roleRef={**edited["roleRef"], "name": "cluster-admin"})
    other["metadata"] = {**edited["metadata"], "namespace": "fpga-system"}
    api.store.delete(("rbac.authorization.k8s.io", "rolebindings"),
                     ("fpga-system", "gk-driver-namespaces"))  # fmt: skip
    api.add({**other, "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"})
    assert not await publisher.once()  # fpga-system's names another role: not current
    put_back = api.get("rbac.authorization.k8s.io", "rolebindings", "gk-driver-namespaces",
                       namespace="gpu-system")  # fmt: skip
    assert put_back is not None and put_back["subjects"][0]["name"] == "gk"
    left = api.get("rbac.authorization.k8s.io", "rolebindings", "gk-driver-namespaces",
                   namespace="fpga-system")  # fmt: skip
    assert left is not None and left["roleRef"]["name"] == "cluster-admin"


def test_bind_role_needs_its_service_account(
    tmp_path: Path, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    base = ["--kubeconfig", str(kubeconfig), "--ca-dir", str(tmp_path)]
    assert run_publish_ca_command([*base, "--bind-role", "gk-driver-namespaces"]) == 2
    assert "--bind-role needs --bind-service-account NAMESPACE/NAME" in capsys.readouterr().err
    assert run_publish_ca_command([*base, "--bind-service-account", "ops/gk"]) == 2
    assert "--bind-service-account needs --bind-role" in capsys.readouterr().err
