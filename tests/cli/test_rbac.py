"""``dra-gatekeeper policy rbac``: the ClusterRole follows the policy's kinds, verbs and drivers."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gatekeeper.cli.main import main
from gatekeeper.cli.rbac import (
    cluster_role,
    driver_namespace_role,
    driver_roles,
    namespace_bindings,
    render_rbac,
    run_policy_command,
)
from gatekeeper.policyfile import load_policy, parse_policy

WIDGETS = """
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [w.example.com]
kinds:
  - group: widgets.example.com
    resource: widgets
    kind: Widget
    scope: Namespaced
    rule: NodeLocal
    verbs: [create, list]
    versions:
      - {names: [v1], driver: spec.driver, node: spec.nodeName}
"""


def rules_by_resource(role: dict) -> dict[str, dict]:
    return {rule["resources"][0]: rule for rule in role["rules"] if "resources" in rule}


def test_default_policy_rules() -> None:
    role = cluster_role(load_policy(None).with_drivers(frozenset({"b.example", "a.example"})))
    rules = rules_by_resource(role)
    assert set(rules) == {
        "resourceslices",
        "devicepools",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaims/driver",
        "nodes",
    }
    # The node's own Node (rule OwnNode): read only; the gatekeeper forwards no other name.
    assert rules["nodes"] == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    assert rules["resourceslices"]["verbs"] == [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ]
    # Claims: read, and write only the status; never create or delete.
    assert rules["resourceclaims"]["verbs"] == ["get", "list", "watch"]
    assert rules["resourceclaims/status"]["verbs"] == ["get", "update", "patch"]
    driver_rule = rules["resourceclaims/driver"]
    assert driver_rule["verbs"] == ["associated-node:patch", "associated-node:update"]
    assert driver_rule["resourceNames"] == ["a.example", "b.example"]
    assert driver_rule["apiGroups"] == ["resource.k8s.io"]
    assert role["rules"][-1] == {
        "nonResourceURLs": [
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/openapi/*",
            "/version",
            "/version/",
        ],
        "verbs": ["get"],
    }
    assert "secrets" not in rules and "nodes/status" not in rules


def test_a_new_kind_gets_its_verbs_and_nothing_for_claims() -> None:
    role = cluster_role(parse_policy(WIDGETS, "widgets.yaml"))
    rules = rules_by_resource(role)
    assert set(rules) == {"widgets"}
    assert rules["widgets"] == {
        "apiGroups": ["widgets.example.com"],
        "resources": ["widgets"],
        "verbs": ["list", "create"],
    }


def test_writes_add_get_for_the_fetch_before_deciding() -> None:
    text = WIDGETS.replace("verbs: [create, list]", "verbs: [delete]")
    rules = rules_by_resource(cluster_role(parse_policy(text, "w.yaml")))
    assert rules["widgets"]["verbs"] == ["get", "delete"]


def test_any_driver_has_no_resource_names() -> None:
    role = cluster_role(load_policy(None).with_drivers(frozenset({"*"})))
    assert "resourceNames" not in rules_by_resource(role)["resourceclaims/driver"]


def test_command_prints_yaml_and_refuses_a_policy_without_drivers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "w.yaml"
    policy.write_text(WIDGETS)
    assert run_policy_command(["rbac", "--policy", str(policy), "--name", "gk"]) == 0
    role, binding = yaml.safe_load_all(capsys.readouterr().out)
    assert role["metadata"]["name"] == "gk" and role["kind"] == "ClusterRole"
    assert binding["kind"] == "ClusterRoleBinding" and binding["roleRef"]["name"] == "gk"
    result = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "policy", "rbac"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no drivers" in result.stderr


def test_mapped_service_accounts_add_token_reviews_only() -> None:
    plain = cluster_role(load_policy(None).with_drivers(frozenset({"gpu.example.com"})))
    mapped = cluster_role(
        replace(
            load_policy(None).with_drivers(frozenset({"gpu.example.com"})),
            service_accounts={"system:serviceaccount:gpu-system:plugin": "gpu.example.com"},
        )
    )
    review = {
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["tokenreviews"],
        "verbs": ["create"],
    }
    assert review not in plain["rules"]
    assert [rule for rule in mapped["rules"] if rule not in plain["rules"]] == [review]


RULES_POLICY = Path(__file__).resolve().parents[1] / "policy" / "rules" / "rules.yaml"


def test_every_rule_of_the_language_gets_its_rights_where_they_belong() -> None:
    """Gatekeeper-decided kinds in its ClusterRole; DriverNamespace kinds only in the drivers'
    namespaces (a ClusterRole bound to the gatekeeper by a RoleBinding in each); DriverCredentials
    kinds only in the drivers' own ClusterRoles (bound to their ServiceAccounts), never the
    gatekeeper's."""
    policy = load_policy(str(RULES_POLICY))
    cluster = cluster_role(policy)["rules"]
    resources = {r for rule in cluster for r in rule.get("resources", [])}
    assert {"nodes", "pods", "devicetaintrules", "resourceslices"} <= resources
    assert not resources & {"events", "leases", "widgets", "widgets/status"}
    taints = next(r for r in cluster if r.get("resources") == ["devicetaintrules"])
    assert taints["verbs"] == ["get", "list", "watch", "create", "update", "patch", "delete"]
    node = next(r for r in cluster if r.get("resources") == ["nodes"])
    assert node["verbs"] == ["get", "update", "patch"]
    role = driver_namespace_role(policy)
    assert role is not None and role["metadata"]["name"] == "dra-gatekeeper-driver-namespaces"
    assert {r["resources"][0] for r in role["rules"]} == {"events", "leases"}
    bindings = namespace_bindings(policy, "kube-system/gk")
    assert [(d["kind"], d["metadata"]["namespace"]) for d in bindings] == [
        ("RoleBinding", "fpga-system"), ("RoleBinding", "gpu-system"),
    ]  # fmt: skip
    assert bindings[0]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert bindings[1]["subjects"] == [
        {"kind": "ServiceAccount", "name": "gk", "namespace": "kube-system"}
    ]
    drivers = driver_roles(policy)
    gpu_role, gpu_binding = drivers[2], drivers[3]
    assert gpu_role["metadata"]["name"] == "dra-gatekeeper:driver:gpu.example.com"
    assert gpu_role["rules"] == [
        {"apiGroups": ["example.com"], "resources": ["widgets"],
         "verbs": ["get", "list", "watch", "create", "update", "patch"]},
        {"apiGroups": ["example.com"], "resources": ["widgets/status"],
         "verbs": ["get", "update", "patch"]},
    ]  # fmt: skip
    assert gpu_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "plugin", "namespace": "gpu-system"}
    ]


def test_the_command_prints_each_part_under_its_comment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "rbac", "--policy", str(RULES_POLICY)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == [
        "ClusterRole", "ClusterRoleBinding",
        "ClusterRole", "RoleBinding", "RoleBinding",
        "ClusterRole", "ClusterRoleBinding", "ClusterRole", "ClusterRoleBinding",
    ]  # fmt: skip
    assert documents[1]["subjects"] == [
        {"kind": "ServiceAccount", "name": "dra-gatekeeper", "namespace": "kube-system"}
    ]
    assert main(["policy", "rbac", "--policy", str(RULES_POLICY), "--service-account", "x"]) == 2
    assert "--service-account 'x' is not NAMESPACE/NAME" in capsys.readouterr().err


def test_the_output_names_the_binding_and_what_makes_the_namespace_ones() -> None:
    """The gatekeeper's ClusterRoleBinding is printed (its output alone binds the gatekeeper);
    the deployment's leaves the RoleBindings of namespaces that may not exist yet to publish-ca,
    and says so."""
    policy = load_policy(str(RULES_POLICY))
    printed = render_rbac(policy, "gk", "ops/gk")
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(printed)]
    assert kinds[:2] == [("ClusterRole", "gk"), ("ClusterRoleBinding", "gk")]
    assert ("RoleBinding", "gk-driver-namespaces") in kinds
    deployed = render_rbac(policy, "gk", "ops/gk", namespace_bindings_too=False)
    assert "RoleBinding" not in [d["kind"] for d in yaml.safe_load_all(deployed)]
    assert "`publish-ca --bind-role gk-driver-namespaces --bind-service-account ops/gk`" in deployed
    assert "(fpga-system, gpu-system)" in deployed
