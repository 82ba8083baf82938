"""The Helm chart (deploy/helm/dra-gatekeeper), linted and rendered by Helm 4 built from Go
modules: lint-clean with and without ``-n``; its defaults render exactly the objects ``kubectl
kustomize deploy/`` builds; every value renders valid objects that ``serve`` accepts; values
generated for a custom policy give that policy's ClusterRole, admission policy and APF objects,
in whatever namespace the release is; a `generated` that does not belong to this release's
policy or ServiceAccount is refused, never rendered; no rendering puts a key on a worker node;
a cert-manager issuer can sign instead of the signer."""

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
from tests.realcluster.helm import (
    CHART,
    DRIVER_NAMESPACE_KIND,
    Helm,
    generated_values,
    without_helm_labels,
)
from tests.test_deploy import assert_no_ca_key_on_workers

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


@pytest.mark.parametrize("namespace", [(), ("--namespace", "kube-system"), ("-n", "gpu-ops")],
                         ids=["no-namespace", "kube-system", "another"])  # fmt: skip
def test_the_chart_lints_strictly_in_any_namespace(helm: Helm, namespace: tuple[str, ...]) -> None:
    done = helm.run("lint", str(CHART), "--strict", *namespace)
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[ERROR]" not in done.stdout and "[WARNING]" not in done.stdout, done.stdout


def test_the_generated_objects_are_the_releases_namespaces(helm: Helm) -> None:
    """Made for no namespace in particular: each binds the release's own ServiceAccount."""
    kinds = by_kind(helm.template(namespace="gpu-ops"))
    assert kinds["ClusterRoleBinding"]["subjects"][0]["namespace"] in ("gpu-ops",)
    condition = kinds["ValidatingAdmissionPolicy"]["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:gpu-ops:dra-gatekeeper" in condition
    account = kinds["FlowSchema"]["spec"]["rules"][0]["subjects"][0]["serviceAccount"]
    assert account == {"name": "dra-gatekeeper", "namespace": "gpu-ops"}
    assert "release-namespace" not in yaml.safe_dump_all(list(kinds.values()))


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
    objects = helm.template(values)
    kinds = by_kind(objects)
    (configmap,) = [o for o in objects if o["metadata"]["name"] == "dra-gatekeeper-policy"]
    assert configmap["data"] == {"policy.yaml": CUSTOM_POLICY}
    assert kinds["DaemonSet"]["spec"]["template"]["spec"]["volumes"][0]["configMap"] == {
        "name": "dra-gatekeeper-policy"
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no generated objects", "`generated` is empty"),
        ("another ServiceAccount", "made for the ServiceAccount dra-gatekeeper, "
                                   "this release runs other"),
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
        data["name"] = "other"
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


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in ("DaemonSet", "Deployment")}


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.kubectl
def test_no_rendering_puts_a_key_on_a_worker_node(helm: Helm, tmp_path: Path) -> None:
    """Every volume of every workload, as kustomize builds deploy/ and as the chart renders its
    defaults, its values for a custom policy, and with a cert-manager issuer: no Secret, CSI
    volume or key path in the DaemonSet; the CA's Secret mounted by no pod."""
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "deploy")], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert_no_ca_key_on_workers([o for o in yaml.safe_load_all(built) if o])
    values = generated_values(tmp_path, CUSTOM_POLICY, "gpu-system/dra-gatekeeper")
    for sets in ((), ("certManager.enabled=true", "certManager.issuer.name=ca-issuer")):
        assert_no_ca_key_on_workers(helm.template(sets=sets))
        assert_no_ca_key_on_workers(helm.template(values, namespace="gpu-system", sets=sets))


def test_a_cert_manager_issuer_signs_instead_and_the_signer_only_approves(helm: Helm) -> None:
    """certManager.enabled: the gatekeepers ask cert-manager's signer name for the issuer; the
    signer only approves or denies (by the same rules), holds no CA and may not sign; the
    publisher hands out the issuer's CA certificate from the ConfigMap named."""
    sets = ("certManager.enabled=true", "certManager.issuer.name=ca-issuer",
            "certManager.caConfigMap=issuer-ca")  # fmt: skip
    objects = helm.template(sets=sets)
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    workloads = _workloads(objects)
    args = _container(workloads["dra-gatekeeper"])["args"]
    assert "--token-cert-signer=clusterissuers.cert-manager.io/ca-issuer" in args
    signer_args = _container(workloads["dra-gatekeeper-signer"])["args"]
    assert "--approve-only" in signer_args
    assert "--signer-name=clusterissuers.cert-manager.io/ca-issuer" in signer_args
    assert not any(a.startswith("--ca-secret") for a in signer_args)
    assert "Secret" not in by_kind(objects)
    role = next(o for o in objects if o["kind"] == "ClusterRole"
                and o["metadata"]["name"] == "dra-gatekeeper-signer")  # fmt: skip
    signers = next(r for r in role["rules"] if r["resources"] == ["signers"])
    assert signers == {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
                       "resourceNames": ["clusterissuers.cert-manager.io/ca-issuer"],
                       "verbs": ["approve"]}  # fmt: skip
    publisher = workloads["dra-gatekeeper-ca-publisher"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in publisher["volumes"]}
    assert volumes["ca-certificates"]["configMap"] == {"name": "issuer-ca"}
    # A namespaced Issuer: the gatekeeper may reference it, there only.
    issuer = helm.template(sets=(*sets, "certManager.issuer.kind=Issuer",
                                 "certManager.issuer.namespace=pki"))  # fmt: skip
    args = _container(_workloads(issuer)["dra-gatekeeper"])["args"]
    assert "--token-cert-signer=issuers.cert-manager.io/pki.ca-issuer" in args
    reference = next(
        o for o in issuer if o["kind"] == "Role" and o["metadata"]["namespace"] == "pki"
    )
    assert reference["rules"] == [
        {
            "apiGroups": ["cert-manager.io"],
            "resources": ["signers"],
            "resourceNames": ["ca-issuer"],
            "verbs": ["reference"],
        }
    ]
    done = helm.run("template", "x", str(CHART), "--set", "certManager.enabled=true", check=False)
    assert (
        done.returncode != 0 and "certManager.enabled needs certManager.issuer.name" in done.stderr
    )


def test_a_driver_namespace_policy_is_bound_by_the_publisher_as_namespaces_appear(
    helm: Helm, tmp_path: Path
) -> None:
    """A policy with DriverNamespace kinds: no RoleBinding rendered into a driver namespace
    (it may not exist yet); publish-ca binds the generated ClusterRole there, allowed exactly
    that (bind on it, RoleBindings of its name)."""
    policy = CUSTOM_POLICY + DRIVER_NAMESPACE_KIND
    values = generated_values(tmp_path, policy, "kube-system/dra-gatekeeper")
    objects = helm.template(values)
    namespaced_elsewhere = [
        (o["kind"], o["metadata"]["namespace"]) for o in objects
        if o["metadata"].get("namespace") not in (None, "kube-system")
    ]  # fmt: skip
    assert namespaced_elsewhere == []
    args = _container(_workloads(objects)["dra-gatekeeper-ca-publisher"])["args"]
    assert "--bind-role=dra-gatekeeper-driver-namespaces" in args
    assert "--bind-service-account=kube-system/dra-gatekeeper" in args
    role = next(o for o in objects if o["kind"] == "ClusterRole"
                and o["metadata"]["name"] == "dra-gatekeeper-ca-publisher")  # fmt: skip
    assert {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles"],
        "resourceNames": ["dra-gatekeeper-driver-namespaces"],
        "verbs": ["bind"],
    } in role["rules"]
    assert any(o["kind"] == "ClusterRole" and o["metadata"]["name"] ==
               "dra-gatekeeper-driver-namespaces" for o in objects)  # fmt: skip
