"""The Helm chart (deploy/helm/dra-gatekeeper), linted and rendered by Helm 4 built from Go
modules: its defaults render exactly the objects ``kubectl kustomize deploy/`` builds; every
value renders valid objects that ``serve`` accepts; values generated for a custom policy give
that policy's ClusterRole, admission policy and APF objects; a `generated` that does not belong
to this release's policy or ServiceAccount is refused, never rendered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gatekeeper.cli.main import build_parser
from gatekeeper.testing.harness import KUBECTL
from tests.realcluster.build import Binaries
from tests.realcluster.helm import CHART, Helm, generated_values, without_helm_labels

ROOT = CHART.parents[2]
K8S_VERSION = "1.32.0"
CUSTOM_POLICY = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [nic.example.com]
serviceAccounts:
  nic.example.com: [nic-system/nic-driver]
"""


@pytest.fixture(scope="module")
def helm(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(binaries["helm"], tmp_path_factory.mktemp("helm-home"))


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def test_the_chart_lints_strictly(helm: Helm) -> None:
    done = helm.run("lint", str(CHART), "--strict", "--namespace", "kube-system")
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.kubectl
def test_defaults_render_what_kustomize_builds(helm: Helm) -> None:
    """Same settings, same objects: the chart's defaults and deploy/ differ only in the labels
    Helm adds."""
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "deploy")], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    kustomized = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built) if o}
    rendered = helm.template()
    for obj in rendered:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    charted = {(o["kind"], o["metadata"]["name"]): without_helm_labels(o) for o in rendered}
    assert sorted(charted) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert charted[key] == obj, key


def test_every_value_renders_valid_objects_serve_accepts(helm: Helm, tmp_path: Path) -> None:
    values = generated_values(tmp_path, CUSTOM_POLICY, "gpu-system/gk")
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        yaml.safe_dump(
            {
                "name": "gk",
                "image": {"repository": "registry.example/dra-gatekeeper", "tag": "9.9.9",
                          "pullPolicy": "Always"},
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "priorityClassName": "",
                "resources": {"gatekeeper": {"requests": {"cpu": "1"},
                                             "limits": {"memory": "1Gi"}}},
                "existingPolicyConfigMap": "my-policy",
                "listeners": {"socketDir": "/run/gk", "token": {"enabled": False},
                              "health": {"port": 9000}},
                "audit": {"dir": "/var/log/gk", "level": "Metadata", "maxSize": 7,
                          "maxBackup": 2},
                "shutdownGracePeriod": 5,
                "extraArgs": ["--max-requests-per-driver=7"],
                "admissionPolicy": {"enabled": True},
            }
        )
    )  # fmt: skip
    objects = helm.template(values, settings, namespace="gpu-system")
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    kinds = by_kind(objects)
    assert "ConfigMap" not in kinds  # the operator's own
    spec = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "priorityClassName" not in spec and spec["terminationGracePeriodSeconds"] == 15
    assert spec["serviceAccountName"] == "gk"
    assert [c["name"] for c in spec["initContainers"]] == ["own-host-dirs"]  # no token: no cert
    (container,) = spec["containers"]
    assert container["image"] == "registry.example/dra-gatekeeper:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    # Helm merges maps of values: the memory request not set keeps its default.
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "64Mi"},
        "limits": {"memory": "1Gi"},
    }
    ns = build_parser().parse_args(container["args"])
    assert (ns.socket_dir, ns.audit_log, ns.audit_level) == ("/run/gk", "/var/log/gk/audit.log",
                                                             "Metadata")  # fmt: skip
    assert (ns.audit_log_maxsize, ns.audit_log_maxbackup, ns.listen_token) == (7, 2, None)
    assert ns.health_listen == "0.0.0.0:9000" and ns.max_requests_per_driver == 7
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == "my-policy"
    assert {"tls", "serving-ca"}.isdisjoint(volumes)
    # What the policy generated: its driver, its ServiceAccount.
    driver_rule = next(
        r for r in kinds["ClusterRole"]["rules"] if r.get("resources") == ["resourceclaims/driver"]
    )
    assert driver_rule["resourceNames"] == ["nic.example.com"]
    subjects = kinds["ClusterRoleBinding"]["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "gk", "namespace": "gpu-system"}]
    condition = kinds["ValidatingAdmissionPolicy"]["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:gpu-system:gk" in condition
    account = kinds["FlowSchema"]["spec"]["rules"][0]["subjects"][0]["serviceAccount"]
    assert account == {"name": "gk", "namespace": "gpu-system"}


def test_the_admission_policy_is_rendered_unless_disabled(helm: Helm) -> None:
    """On by default, the chart renders exactly the generated
    deploy/generated/admission-policy.yaml; off, none of it."""
    assert "ValidatingAdmissionPolicy" not in by_kind(
        helm.template(sets=("admissionPolicy.enabled=false",))
    )
    kinds = by_kind(helm.template())
    exported = [
        d for d in yaml.safe_load_all((ROOT / "deploy/generated/admission-policy.yaml").read_text())
    ]
    for document in exported:
        assert without_helm_labels(kinds[document["kind"]]) == document
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_an_inline_policy_is_served_from_the_configmap(helm: Helm, tmp_path: Path) -> None:
    values = generated_values(tmp_path, CUSTOM_POLICY, "kube-system/dra-gatekeeper")
    kinds = by_kind(helm.template(values))
    assert kinds["ConfigMap"]["data"] == {"policy.yaml": CUSTOM_POLICY}
    assert kinds["DaemonSet"]["spec"]["template"]["spec"]["volumes"][0]["configMap"] == {
        "name": "dra-gatekeeper-policy"
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no generated objects", "`generated` is empty"),
        ("another ServiceAccount", "made for the ServiceAccount kube-system/dra-gatekeeper, "
                                   "this release runs other/dra-gatekeeper"),
        ("another policy", "`policy` is not the policy `generated` was made from"),
    ],
)  # fmt: skip
def test_generated_objects_of_another_release_are_refused(
    case: str, message: str, helm: Helm, tmp_path: Path
) -> None:
    values = generated_values(tmp_path, CUSTOM_POLICY, "kube-system/dra-gatekeeper")
    data = yaml.safe_load(values.read_text())
    namespace = "kube-system"
    if case == "no generated objects":
        data["generated"]["objects"] = []
    elif case == "another ServiceAccount":
        namespace = "other"
    else:
        data["policy"] = CUSTOM_POLICY.replace("nic.example.com]", "nic.example.com, '*']", 1)
    values.write_text(yaml.safe_dump(data))
    args = ["template", "dra-gatekeeper", str(CHART), "-n", namespace, "-f", str(values)]
    done = helm.run(*args, check=False)
    assert done.returncode != 0 and done.stdout == ""
    assert message in done.stderr, done.stderr


def test_values_of_the_wrong_shape_are_refused_naming_them(helm: Helm) -> None:
    """values.schema.json: a misspelt key or a port that is not a number is an error naming
    the value, never a rendered DaemonSet that fails on the node."""
    args = ["template", "dra-gatekeeper", str(CHART), "-n", "kube-system"]
    sets = ["--set", "listeners.token.port=abc", "--set", "audit.levle=Metadata"]
    done = helm.run(*args, *sets, check=False)
    assert done.returncode != 0 and done.stdout == ""
    assert "'/listeners/token/port': got string, want integer" in done.stderr, done.stderr
    assert "additional properties 'levle' not allowed" in done.stderr
