"""The CA bundle ``publish-ca`` publishes, and every bad input refused before anything is written
(exit 2, one line naming the flag or file). Its reconciling is tested on the real tier
(tests/realcluster/test_ca_publish.py): ConfigMaps are not a kind of the embedded API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from gatekeeper.cli.certs import create_ca, issue_server_cert
from gatekeeper.cli.publishca import run_publish_ca_command
from gatekeeper.errors import ConfigError
from gatekeeper.server.capublisher import read_bundle

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
    secret = volumes["ca-certificates"]["secret"]
    assert secret["secretName"] == "dra-gatekeeper-serving-ca"
    assert [item["key"] for item in secret["items"]] == ["ca.crt", "trust.crt"]


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
