"""deploy/ as the real apiserver reads it: ``kubectl apply -k deploy/ --dry-run=server`` as a
cluster admin is accepted (kubectl's default ``--validate=strict`` makes the apiserver refuse
unknown or duplicate fields), and the apiserver answers with each object as it would store it.
The examples beside it are dry-run applied too, their namespaces (and the default
ServiceAccount a controller manager would add) created for real first: a dry-run namespace
does not exist for the objects in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.cluster import RealCluster
from tests.realcluster.kubectl import Kubectl, kubectl_binary
from tests.realcluster.objects import ensure

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))
# kubectl's own note about objects that exist without its last-applied annotation (the
# harness created the ClusterRole and its binding): not the apiserver's.
_KUBECTL_NOTE = "missing the kubectl.kubernetes.io/last-applied-configuration annotation"


@pytest.fixture
def admin_kubectl(real_cluster: RealCluster, tmp_path: Path) -> Kubectl:
    cert = real_cluster.client_cert("admin-deploy", "admin", "system:masters")
    kubeconfig = real_cluster.kubeconfig(tmp_path / "admin.kubeconfig", cert=cert)
    return Kubectl(kubectl_binary(), kubeconfig, tmp_path / "cache")


def _dry_run(kubectl: Kubectl, *source: str) -> list[dict[str, Any]]:
    done = kubectl.run("apply", *source, "--dry-run=server", "-o", "json", check=False)
    assert done.returncode == 0, done.stderr
    warnings = [
        line for line in done.stderr.splitlines() if line.strip() and _KUBECTL_NOTE not in line
    ]
    assert warnings == []
    answer = json.loads(done.stdout)
    items: list[dict[str, Any]] = answer["items"] if answer["kind"] == "List" else [answer]
    return items


def test_kustomization_is_accepted(admin_kubectl: Kubectl, real_cluster: RealCluster) -> None:
    built = yaml.safe_load_all(admin_kubectl.run("kustomize", str(DEPLOY)).stdout)
    want = sorted((o["kind"], o["metadata"]["name"]) for o in built if o)
    items = _dry_run(admin_kubectl, "-k", str(DEPLOY))
    assert sorted((o["kind"], o["metadata"]["name"]) for o in items) == want
    for item in items:
        # What only the apiserver fills in: a uid and, on the DaemonSet, its defaults.
        assert item["metadata"]["uid"], item["kind"]
    daemonset = next(o for o in items if o["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["schedulerName"] == "default-scheduler"
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # A dry run stores nothing.
    name = daemonset["metadata"]["name"]
    assert not real_cluster.admin.exists(f"/apis/apps/v1/namespaces/kube-system/daemonsets/{name}")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted(
    example: Path, admin_kubectl: Kubectl, real_cluster: RealCluster
) -> None:
    documents = [d for d in yaml.safe_load_all(example.read_text()) if d]
    for document in documents:
        if document["kind"] == "Namespace":
            name = document["metadata"]["name"]
            ensure(real_cluster.admin, "/api/v1/namespaces", document)
            # No controller manager runs here: make the "default" ServiceAccount it would.
            ensure(
                real_cluster.admin,
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            )
    items = _dry_run(admin_kubectl, "-f", str(example))
    assert sorted((o["kind"], o["metadata"]["name"]) for o in items) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in documents
    )


def test_the_token_driver_example_is_accepted(
    admin_kubectl: Kubectl, real_cluster: RealCluster
) -> None:
    """The driver behind the gatekeeper (env and volume changes only) is a valid DaemonSet."""
    example = DEPLOY / "examples" / "token-driver"
    built = [
        d for d in yaml.safe_load_all(admin_kubectl.run("kustomize", str(example)).stdout) if d
    ]
    namespace = next(d for d in built if d["kind"] == "Namespace")
    ensure(real_cluster.admin, "/api/v1/namespaces", namespace)
    items = _dry_run(admin_kubectl, "-k", str(example))
    daemonset = next(o for o in items if o["kind"] == "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    projected = next(v for v in spec["volumes"] if v["name"] == "gatekeeper-serviceaccount")
    assert projected["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
