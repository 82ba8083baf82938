"""``dra-gatekeeper signer`` checks everything before it asks the apiserver anything: a bad flag
is exit 2 with one line naming it; a CA Secret it cannot use is exit 2 naming the Secret."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from gatekeeper.apiserver import APIServer, ServedKind
from gatekeeper.cli.signer import run_signer_command
from gatekeeper.testing.harness import NODE_TOKEN

GOOD = ["--gatekeeper-service-account", "kube-system/dra-gatekeeper", "--namespace", "kube-system"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--signer-name", "token-listener"], "'token-listener' is not a signer name"),
        (["--signer-name", "kubernetes.io/kubelet-serving"], "not kubernetes.io's"),
        (["--gatekeeper-service-account", "dra-gatekeeper"], "is not NAMESPACE/NAME"),
        (["--namespace", "Not_A_Namespace"], "--namespace NAMESPACE (or env POD_NAMESPACE)"),
        (["--certificate-lifetime", "10"], "--certificate-lifetime must be at least 60"),
        (["--ca-secret", "a/b"], "--ca-secret 'a/b' is not a valid name"),
    ],
    ids=["signer-name", "kubernetes-io", "service-account", "namespace", "lifetime", "secret"],
)  # fmt: skip
def test_a_bad_flag_is_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_signer_command([*GOOD, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dra-gatekeeper signer: ") and message in err
    assert len(err.strip().splitlines()) == 1


async def test_a_ca_secret_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    api = APIServer((ServedKind("", "secrets", "Secret", True, ("v1",)),), token=NODE_TOKEN)
    await api.start()
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "a", "cluster": {"server": api.url}}],
        "users": [{"name": "u", "user": {"token": NODE_TOKEN}}],
        "contexts": [{"name": "c", "context": {"cluster": "a", "user": "u"}}],
    }  # fmt: skip
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gatekeeper", "signer", *GOOD,
            "--kubeconfig", str(tmp_path / "kubeconfig"),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        await api.close()
    assert process.returncode == 2
    assert (
        "dra-gatekeeper signer: Secret kube-system/dra-gatekeeper-signer-ca does not exist"
        in err.decode()
    )
