"""dra-example-driver's own Helm chart behind the gatekeeper: rendered by the real tier's Helm with
deploy/examples/dra-example-driver/values.yaml and the post-renderer plugin
deploy/examples/behind-gatekeeper (installed with ``helm plugin install``, as an operator would),
it differs from the chart's own rendering only in the kubelet plugin's env and volumes, and the
real apiserver accepts the result (``kubectl apply --dry-run=server``, strict validation).

The chart comes from the Go module proxy, as the tier's other sources do: the module
sigs.k8s.io/dra-example-driver carries deployments/helm."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.policyfile import load_policy
from tests.realcluster.build import Binaries
from tests.realcluster.cluster import RealCluster
from tests.realcluster.kubectl import Kubectl, kubectl_binary
from tests.realcluster.objects import ensure

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = DEPLOY / "examples" / "dra-example-driver"
PLUGIN = DEPLOY / "examples" / "behind-gatekeeper"
CHART_MODULE = "sigs.k8s.io/dra-example-driver@v0.2.0"
NAMESPACE = "dra-example-driver"
_DEVICECLASS_DEPRECATED = (
    "Warning: resource.k8s.io/v1beta1 DeviceClass is deprecated in v1.35+, unavailable in v1.38+"
)
_KUBECTL_NOTE = "missing the kubectl.kubernetes.io/last-applied-configuration annotation"


def _chart() -> Path:
    """The chart directory of the module, downloaded (or found in the module cache) by go."""
    go = shutil.which("go")
    assert go is not None  # the binaries fixture has required Go already
    done = subprocess.run(
        [go, "mod", "download", "-json", CHART_MODULE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    chart = Path(json.loads(done.stdout)["Dir"]) / "deployments" / "helm" / "dra-example-driver"
    assert (chart / "Chart.yaml").is_file(), chart
    return chart


Helm = tuple[str, dict[str, str]]


@pytest.fixture
def helm(binaries: Binaries, tmp_path: Path) -> Helm:
    """The tier's helm and its environment: homes of its own, the post-renderer plugin
    installed, and the kubectl it runs."""
    binary = Path(binaries["helm"])
    if not binary.is_file():
        pytest.skip(f"helm is not among the real tier's binaries ({binary})")
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "KUBECTL": kubectl_binary(),
    }
    installed = subprocess.run(
        [str(binary), "plugin", "install", str(PLUGIN)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    return str(binary), env


def _render(helm: Helm, chart: Path, *extra: str) -> list[dict[str, Any]]:
    binary, env = helm
    done = subprocess.run(
        [
            binary, "template", "dra-example-driver", str(chart),
            "--namespace", NAMESPACE,
            "--kube-version", "v1.36.3",
            "-f", str(EXAMPLE / "values.yaml"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _without_gatekeeper(daemonset: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet with exactly what behind-gatekeeper.yaml adds taken out (asserted)."""
    result = copy.deepcopy(daemonset)
    spec = result["spec"]["template"]["spec"]
    assert spec.pop("automountServiceAccountToken") is False
    plugin = spec["containers"][0]
    added = plugin["env"][-2:]
    assert added[0]["name"] == "KUBERNETES_SERVICE_HOST"
    assert added[0]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert added[1] == {"name": "KUBERNETES_SERVICE_PORT", "value": "9443"}
    del plugin["env"][-2:]
    mount = plugin["volumeMounts"].pop()
    assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    volume = spec["volumes"].pop()
    assert volume["name"] == mount["name"]
    sources = volume["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    assert sources[1]["configMap"]["name"] == "dra-gatekeeper-ca"
    return result


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def test_the_chart_behind_the_gatekeeper_changes_env_and_volumes_only_and_is_accepted(
    helm: Helm, real_cluster: RealCluster, tmp_path: Path
) -> None:
    chart = _chart()
    plain = {_key(o): o for o in _render(helm, chart)}
    behind = {_key(o): o for o in _render(helm, chart, "--post-renderer", "behind-gatekeeper")}
    assert behind.keys() == plain.keys()
    (daemonset,) = [key for key in plain if key[0] == "DaemonSet"]
    for key, obj in behind.items():
        mine = _without_gatekeeper(obj) if key == daemonset else obj
        assert mine == plain[key], key

    # The names the policy maps are the chart's (values.yaml pins them).
    policy = load_policy(str(DEPLOY / "policy.yaml"))
    account = behind[("ServiceAccount", "dra-example-driver-service-account")]["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert policy.service_accounts[user] == "gpu.example.com"
    assert ("DeviceClass", "gpu.example.com") in behind

    # The real apiserver reads the result: server-side dry run, strict field validation.
    ensure(
        real_cluster.admin,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    ensure(
        real_cluster.admin,
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
    )
    rendered = tmp_path / "behind-gatekeeper.yaml"
    rendered.write_text(yaml.safe_dump_all(list(behind.values())))
    cert = real_cluster.client_cert("admin-chart", "admin", "system:masters")
    kubeconfig = real_cluster.kubeconfig(tmp_path / "admin.kubeconfig", cert=cert)
    kubectl = Kubectl(kubectl_binary(), kubeconfig, tmp_path / "cache")
    done = kubectl.run("apply", "-f", str(rendered), "--dry-run=server", "-o", "json", check=False)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line and _KUBECTL_NOTE not in line]
    # The chart's own DeviceClass is v1beta1 (served here by --runtime-config; a default 1.36
    # apiserver does not serve it): the apiserver's only remark, and not about the gatekeeper.
    assert warnings == [_DEVICECLASS_DEPRECATED]
    items = json.loads(done.stdout)["items"]
    assert sorted(_key(o) for o in items) == sorted(behind)
    stored = next(o for o in items if o["kind"] == "DaemonSet")
    assert stored["metadata"]["uid"]
    env = {e["name"]: e for e in stored["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KUBERNETES_SERVICE_PORT"]["value"] == "9443"
    assert not real_cluster.admin.exists(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{daemonset[1]}"
    )
