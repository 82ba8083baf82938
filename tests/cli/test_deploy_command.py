"""``dra-gatekeeper policy deploy``: one command, everything derived from the policy; what it
refuses it refuses before writing anything."""

from __future__ import annotations

import hashlib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gatekeeper.cli.deploy import FILES, RELEASE_NAMESPACE, VALUES_MARKER
from gatekeeper.cli.flowcontrol import MATCHING_PRECEDENCE, flow_control
from gatekeeper.cli.main import main

POLICY = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [nic.example.com]
"""


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", "deploy", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_every_object_valid(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--policy", str(policy), "--service-account", "gpu/gk")
    assert code == 0, err
    documents = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in documents] == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "PriorityLevelConfiguration",
        "FlowSchema",
    ]
    for document in documents:
        kubernetes_validate.validate(document, "1.32.0", strict=True)


def test_helm_values_carry_the_policy_and_what_it_checks(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--policy", str(policy), "--format", "helm-values", "--name", "g")
    assert code == 0
    values = yaml.safe_load(out)
    assert values["policy"] == POLICY
    generated = values["generated"]
    assert generated["policySHA256"] == hashlib.sha256(POLICY.encode()).hexdigest()
    assert generated["serviceAccount"] == "dra-gatekeeper"
    assert [(d["kind"], d["metadata"]["name"]) for d in generated["objects"]] == [
        ("ClusterRole", "g"),
        ("ClusterRoleBinding", "g"),
        ("PriorityLevelConfiguration", "g"),
        ("FlowSchema", "g"),
    ]
    # Made for the release's namespace, whichever: the chart puts its own in.
    assert "kube-system" not in yaml.safe_dump(generated)
    assert generated["objects"][1]["subjects"][0]["namespace"] == RELEASE_NAMESPACE
    assert "namespaceRole" not in generated  # the policy has no DriverNamespace kinds
    assert [d["kind"] for d in generated["admissionPolicy"]] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert "policy: |\n" in out  # the policy stays readable in the values file


def test_a_driver_namespace_role_is_left_to_publish_ca_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DriverNamespace kind: its ClusterRole is generated, no RoleBinding in a namespace that
    may not exist yet; the chart learns the role's name for publish-ca --bind-role."""
    rules = Path(__file__).resolve().parents[1] / "policy" / "rules" / "rules.yaml"
    served = tmp_path / "rules.yaml"
    served.write_text(rules.read_text())
    code, out, err = run(capsys, "--policy", str(served), "--format", "helm-values")
    assert code == 0, err
    generated = yaml.safe_load(out)["generated"]
    assert generated["namespaceRole"] == "dra-gatekeeper-driver-namespaces"
    kinds = [(d["kind"], d["metadata"]["name"]) for d in generated["objects"]]
    assert ("ClusterRole", "dra-gatekeeper-driver-namespaces") in kinds
    assert not [kind for kind, _ in kinds if kind in ("Role", "RoleBinding")]


def test_out_and_chart_are_written_together(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.yaml").write_text(f"name: gk\n{VALUES_MARKER}\nold: 1\n")
    out = tmp_path / "out" / "generated"
    code, printed, _ = run(capsys, "--policy", str(policy), "--out", str(out), "--chart",
                           str(chart))  # fmt: skip
    assert (code, printed) == (0, "")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["name"] == "gk" and "old" not in values and values["policy"] == POLICY


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--policy FILE is required"),
        (("--policy", "{policy}", "--driver", "x.example"), "unrecognized arguments: --driver"),
        (("--policy", "{missing}"), "cannot read"),
        (("--policy", "{local}"), "base.yaml"),
        (("--policy", "{policy}", "--chart", "{nomarker}", "--out", "{out}"), "no line"),
        (("--policy", "{policy}", "--out", "{policy}"), "--out"),
        (("--policy", "{policy}", "--service-account", "gk"), "is not NAMESPACE/NAME"),
        (
            ("--policy", "{nodrivers}"),
            "no drivers: the rules bind writes to the drivers' names (list them under `drivers:`)",
        ),
    ],
)
def test_refusals_are_one_line_and_write_nothing(
    args: tuple[str, ...],
    message: str,
    policy: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    local = tmp_path / "local.yaml"  # the ConfigMap serves one file: no local includes
    local.write_text(POLICY.replace("[packaged:default]", "[base.yaml]"))
    (tmp_path / "base.yaml").write_text(POLICY)
    nomarker = tmp_path / "chart"
    nomarker.mkdir()
    (nomarker / "values.yaml").write_text("name: gk\n")
    nodrivers = tmp_path / "nodrivers.yaml"
    nodrivers.write_text(POLICY.replace("drivers: [nic.example.com]\n", ""))
    places = {"policy": policy, "nodrivers": nodrivers, "missing": tmp_path / "none.yaml",
              "local": local, "nomarker": nomarker, "out": tmp_path / "out"}  # fmt: skip
    code, out, err = run(capsys, *(arg.format(**places) for arg in args))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()
    assert (nomarker / "values.yaml").read_text() == "name: gk\n"


def test_the_flow_schema_catches_the_gatekeeper_before_the_built_in_ones() -> None:
    level, schema = flow_control("gpu-system/gk", "gk")
    assert 500 < MATCHING_PRECEDENCE < 900  # after system-nodes, before kube-system accounts
    spec = schema["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": level["metadata"]["name"]}
    (rule,) = spec["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "gk", "namespace": "gpu-system"}}
    ]
    # Every gatekeeper is the same user: ByUser would be one flow; ByNamespace spreads claims.
    assert spec["distinguisherMethod"] == {"type": "ByNamespace"}
    limited = level["spec"]["limited"]
    assert level["spec"]["type"] == "Limited" and limited["limitResponse"]["type"] == "Queue"
    assert limited["lendablePercent"] < 100  # never lends all its seats away
