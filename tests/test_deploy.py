"""deploy/: every manifest valid (kubernetes-validate --strict, offline), the kustomization
complete, everything generated from the policy (RBAC, admission policy, APF, the chart's values)
exactly what ``policy deploy`` writes, the DaemonSet and image hardened. The Helm chart itself is
rendered by Helm built from Go modules: tests/realcluster/test_chart.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gatekeeper.cli.deploy import FILES, VALUES_MARKER
from gatekeeper.cli.rbac import render_cluster_role
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import KUBECTL

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.32.0"
# Not Kubernetes objects: kustomize inputs, the policy, a kustomize patch, a Helm plugin's
# manifest and a chart's values.
NOT_MANIFESTS = {
    "kustomization.yaml",
    "policy.yaml",
    "behind-gatekeeper.yaml",
    "plugin.yaml",
    "values.yaml",
}
CHART = DEPLOY / "helm" / "dra-gatekeeper"
GENERATED = DEPLOY / "generated"
MANIFESTS = sorted(
    path
    for path in DEPLOY.rglob("*.yaml")
    if path.name not in NOT_MANIFESTS and CHART not in path.parents  # Helm templates: Helm's
)
TOKEN_DRIVER = DEPLOY / "examples" / "token-driver"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def daemonset() -> dict[str, Any]:
    return documents(DEPLOY / "daemonset.yaml")[0]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = daemonset()["spec"]["template"]["spec"]
    return spec


def gatekeeper_container() -> dict[str, Any]:
    return next(c for c in pod_spec()["containers"] if c["name"] == "gatekeeper")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_valid_strictly(path: Path) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_and_builds() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    top_level = {p.name for p in DEPLOY.glob("*.yaml")} - NOT_MANIFESTS
    generated = {f"generated/{name}" for name in FILES}
    assert {p.name for p in GENERATED.iterdir()} == set(FILES)
    assert set(kustomization["resources"]) == top_level | generated
    generated = kustomization["configMapGenerator"][0]
    assert generated["files"] == ["policy.yaml"]


@pytest.mark.kubectl
def test_kustomize_builds_valid_objects_offline() -> None:
    """``kubectl kustomize deploy/``, the README's offline check: no server needed."""
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(DEPLOY)], capture_output=True, text=True, check=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(built) if doc]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    assert kinds == [
        "ClusterRole/dra-gatekeeper",
        "ClusterRole/dra-gatekeeper-ca-publisher",
        "ClusterRole/dra-gatekeeper-serving-certificate",
        "ClusterRole/dra-gatekeeper-signer",
        "ClusterRoleBinding/dra-gatekeeper",
        "ClusterRoleBinding/dra-gatekeeper-ca-publisher",
        "ClusterRoleBinding/dra-gatekeeper-serving-certificate",
        "ClusterRoleBinding/dra-gatekeeper-signer",
        "ConfigMap/dra-gatekeeper-ca-certificates",
        "ConfigMap/dra-gatekeeper-policy",
        "DaemonSet/dra-gatekeeper",
        "Deployment/dra-gatekeeper-ca-publisher",
        "Deployment/dra-gatekeeper-signer",
        "FlowSchema/dra-gatekeeper",
        "PriorityLevelConfiguration/dra-gatekeeper",
        "Role/dra-gatekeeper-signer",
        "RoleBinding/dra-gatekeeper-signer",
        "Secret/dra-gatekeeper-signer-ca",
        "ServiceAccount/dra-gatekeeper",
        "ServiceAccount/dra-gatekeeper-ca-publisher",
        "ServiceAccount/dra-gatekeeper-signer",
        "ValidatingAdmissionPolicy/dra-gatekeeper",
        "ValidatingAdmissionPolicyBinding/dra-gatekeeper",
    ]
    # Namespaced objects in kube-system, cluster-scoped ones in none (kustomize 5.5 would give
    # the admission policy and the APF objects one if the kustomization set `namespace:`).
    namespaced = {"ConfigMap", "DaemonSet", "Deployment", "ServiceAccount", "Secret", "Role",
                  "RoleBinding"}  # fmt: skip
    for obj in objects:
        want = "kube-system" if obj["kind"] in namespaced else None
        assert obj["metadata"].get("namespace") == want, obj["kind"]
    configmap = next(o for o in objects if o["metadata"]["name"] == "dra-gatekeeper-policy")
    assert configmap["data"]["policy.yaml"] == (DEPLOY / "policy.yaml").read_text()


def test_everything_generated_is_exactly_what_the_command_writes(tmp_path: Path) -> None:
    """deploy/generated/ and the chart's generated values are what ``policy deploy`` writes for
    deploy/policy.yaml now: a policy edit without regenerating fails here."""
    chart = tmp_path / "chart"
    chart.mkdir()
    head = (CHART / "values.yaml").read_text().partition(VALUES_MARKER)[0]
    (chart / "values.yaml").write_text(head + VALUES_MARKER + "\nstale: true\n")
    out = tmp_path / "generated"
    done = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "policy", "deploy",
         "--policy", "deploy/policy.yaml", "--out", str(out), "--chart", str(chart)],
        capture_output=True, text=True, cwd=ROOT,  # the files name the policy as the README does
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    for name in FILES:
        assert (out / name).read_text() == (GENERATED / name).read_text(), name
    assert (chart / "values.yaml").read_text() == (CHART / "values.yaml").read_text()
    for name in FILES:
        for doc in documents(GENERATED / name):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_clusterrole_is_exactly_what_the_policy_needs_and_bound() -> None:
    deployed = (GENERATED / "rbac.yaml").read_text()
    role, binding = documents(GENERATED / "rbac.yaml")
    assert deployed.startswith(render_cluster_role(load_policy(str(DEPLOY / "policy.yaml"))))
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = documents(DEPLOY / "serviceaccount.yaml")[0]["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert pod_spec()["serviceAccountName"] == account["name"]
    policy = str(DEPLOY / "policy.yaml")
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "policy", "rbac", "--policy", policy],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == deployed


def test_deployed_policy_is_the_default_with_its_drivers() -> None:
    deployed = load_policy(str(DEPLOY / "policy.yaml"))
    default = load_policy(None)
    assert deployed.kinds == default.kinds
    assert deployed.drivers == {"gpu.example.com"}
    assert deployed.service_accounts == {
        "system:serviceaccount:dra-example-driver:dra-example-driver-service-account": (
            "gpu.example.com"
        )
    }


def test_daemonset_serves_tokens_with_a_certificate_it_requests_for_the_nodes_address() -> None:
    """The token listener's key is made in the pod, its certificate requested of the signer for
    the node's address (drivers dial status.hostIP) and loopback: no CA, no key, no Secret."""
    args = gatekeeper_container()["args"]
    assert "--listen-token=0.0.0.0:9443" in args
    token_port = next(p for p in gatekeeper_container()["ports"] if p["name"] == "token")
    assert token_port["hostPort"] == token_port["containerPort"] == 9443
    signer = documents(DEPLOY / "signer.yaml")
    deployment = next(d for d in signer if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    signer_name = next(a for a in container["args"] if a.startswith("--signer-name="))
    assert f"--token-cert-signer={signer_name.split('=', 1)[1]}" in args
    assert "--token-cert-address=$(HOST_IP)" in args and "--token-cert-address=127.0.0.1" in args
    env = {e["name"]: e for e in gatekeeper_container()["env"]}
    assert env["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert not any(a.startswith(("--tls-cert-file", "--tls-key-file")) for a in args)
    from gatekeeper.cli.main import build_parser

    ns = build_parser().parse_args(args)
    assert ns.token_cert_signer == "dra-gatekeeper.io/token-listener"


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"] + "/" + o["metadata"]["name"]: o for o in objects
            if o["kind"] in ("DaemonSet", "Deployment")}  # fmt: skip


def test_no_file_or_secret_on_a_worker_node_holds_the_ca_key() -> None:
    """Every volume of every workload of deploy/: the DaemonSet (every worker node) mounts no
    Secret, no projected Secret, no CSI volume, and no hostPath that holds keys; the CA's Secret
    is mounted by no pod at all (the signer reads it through the API, from the control plane)."""
    objects = [d for path in MANIFESTS for d in documents(path) if path.parent == DEPLOY]
    assert_no_ca_key_on_workers(objects)


def assert_no_ca_key_on_workers(objects: list[dict[str, Any]]) -> None:
    """The check of :func:`test_no_file_or_secret_on_a_worker_node_holds_the_ca_key`, for any
    rendering of the deployment (kustomize, the chart: tests/realcluster/test_chart.py)."""
    workloads = _workloads(objects)
    daemonsets = [w for w in workloads.values() if w["kind"] == "DaemonSet"]
    assert daemonsets
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    for name, workload in workloads.items():
        spec = workload["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            sources = [volume] + [s for s in volume.get("projected", {}).get("sources", [])]
            for source in sources:
                mounted = (source.get("secret") or {}).get("secretName")
                assert mounted not in secrets, (name, volume["name"], "mounts the CA's Secret")
                if workload["kind"] == "DaemonSet":
                    assert "secret" not in source, (name, volume["name"])
                    assert "csi" not in source, (name, volume["name"])
        if workload["kind"] == "DaemonSet":
            # Nothing of the node's own keys either (the kubelet's, the control plane's).
            paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
            assert not [p for p in paths if p.startswith(("/etc/kubernetes", "/var/lib"))]
    signer = next(w for w in workloads.values() if "signer" in w["metadata"]["name"])
    spec = signer["spec"]["template"]["spec"]
    # Off the worker nodes by default: scheduled only where the control plane is.
    assert "node-role.kubernetes.io/control-plane" in spec.get("nodeSelector", {})
    assert not spec.get("volumes"), "the signer reads its CA through the API, mounts nothing"


@pytest.mark.kubectl
def test_the_token_driver_example_changes_env_and_volumes_only() -> None:
    """The kustomize example puts an unchanged kubelet-plugin DaemonSet behind the gatekeeper:
    in-cluster config's env and service-account volume, and nothing else."""
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(TOKEN_DRIVER)], capture_output=True, text=True, check=True
    ).stdout
    after = next(d for d in yaml.safe_load_all(built) if d and d["kind"] == "DaemonSet")
    before = next(d for d in documents(TOKEN_DRIVER / "driver.yaml") if d["kind"] == "DaemonSet")
    spec = after["spec"]["template"]["spec"]
    assert spec.pop("automountServiceAccountToken") is False
    (plugin,) = spec["containers"]
    env = {e["name"]: e for e in plugin["env"]}
    assert (
        env.pop("KUBERNETES_SERVICE_HOST")["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    )
    assert env.pop("KUBERNETES_SERVICE_PORT")["value"] == "9443"
    plugin["env"] = list(env.values())
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    mount = mounts.pop("gatekeeper-serviceaccount")
    assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    plugin["volumeMounts"] = list(mounts.values())
    volumes = {v["name"]: v for v in spec["volumes"]}
    sources = volumes.pop("gatekeeper-serviceaccount")["projected"]["sources"]
    assert {next(iter(source)) for source in sources} == {
        "serviceAccountToken",
        "configMap",
        "downwardAPI",
    }
    spec["volumes"] = list(volumes.values())
    assert after == before


def test_daemonset_runs_beside_every_driver_hardened() -> None:
    spec = pod_spec()
    container = gatekeeper_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec.get("hostNetwork", False) is False
    for init in spec.get("initContainers", []):
        capabilities = init["securityContext"]["capabilities"]
        assert capabilities["drop"] == ["ALL"] and capabilities.get("add", ["CHOWN"]) == ["CHOWN"]
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["terminationGracePeriodSeconds"] > 20


def test_daemonset_volumes_policy_sockets_and_rotated_audit() -> None:
    spec = pod_spec()
    container = gatekeeper_container()
    args = container["args"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["sockets"]["hostPath"]["path"] == "/var/run/dra-gatekeeper"
    assert "--socket-dir=/var/run/dra-gatekeeper" in args
    assert mounts["sockets"]["mountPath"] == "/var/run/dra-gatekeeper"
    # The policy comes from the ConfigMap, mounted as a directory so updates reach the pod.
    assert volumes["policy"]["configMap"]["name"] == "dra-gatekeeper-policy"
    assert "subPath" not in mounts["policy"]
    assert f"--policy={mounts['policy']['mountPath']}/policy.yaml" in args
    assert volumes["audit"]["hostPath"]["path"] == "/var/log/dra-gatekeeper"
    assert "--audit-log=/var/log/dra-gatekeeper/audit.log" in args
    assert any(a.startswith("--audit-log-maxsize=") for a in args)
    assert any(a.startswith("--audit-log-maxbackup=") for a in args)
    # Nothing else of the host: not /var/lib/kubelet (every pod's volumes).
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/var/run/dra-gatekeeper", "/var/log/dra-gatekeeper"}
    health = next(a for a in args if a.startswith("--health-listen="))
    port = int(health.rsplit(":", 1)[1])
    assert {"name": "health", "containerPort": port, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_daemonset_args_are_accepted_by_serve() -> None:
    from gatekeeper.cli.main import build_parser

    ns = build_parser().parse_args(gatekeeper_container()["args"])
    assert ns.command == "serve" and ns.audit_log_maxsize == 100


def test_example_driver_mounts_only_its_own_socket_directory() -> None:
    docs = documents(DEPLOY / "examples" / "driver-pod.yaml")
    pod = next(d for d in docs if d["kind"] == "Pod")
    host_paths = [v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v]
    assert host_paths == ["/var/run/dra-gatekeeper/gpu.example.com"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert 65532 in pod["spec"]["securityContext"]["supplementalGroups"]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    kubeconfig = yaml.safe_load(configmap["data"]["kubeconfig"])
    assert kubeconfig["users"] == [{"name": "gpu.example.com", "user": {}}]
    container = pod["spec"]["containers"][0]
    socket_mount = next(m for m in container["volumeMounts"] if m["name"] == "gatekeeper-socket")
    assert f"--unix-socket {socket_mount['mountPath']}/api.sock" in container["command"][-1]


def _stages(text: str) -> list[list[tuple[str, str]]]:
    lines: list[str] = []
    for raw in text.replace("\\\n", " ").splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(raw.strip())
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def test_dockerfile_final_stage_is_slim_non_root_without_build_tools() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    base = next(
        line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ARG PYTHON_IMAGE=")
    )
    assert base.startswith("python:3.") and "-slim" in base
    stages = _stages(text)
    assert len(stages) >= 2, "multi-stage: the build tools stay in the build stage"
    final = stages[-1]
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0].isdigit(), "numeric: runAsNonRoot can check it"
    runs = " ".join(rest for instruction, rest in final if instruction == "RUN")
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in runs
    assert "pip uninstall" in runs
    copies = [rest for instruction, rest in final if instruction == "COPY"]
    assert copies == ["--from=build /opt/dra-gatekeeper /opt/dra-gatekeeper"]
    env = " ".join(rest for instruction, rest in final if instruction == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # nothing written under a read-only root
    entry = [rest for instruction, rest in final if instruction == "ENTRYPOINT"]
    assert entry == ['["/opt/dra-gatekeeper/bin/dra-gatekeeper"]']
    build_copies = [rest for instruction, rest in stages[0] if instruction == "COPY"]
    assert "gatekeeper ./gatekeeper" in build_copies


def _ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether docker leaves ``path`` out of the build context: the last pattern matching the
    path or one of its parent directories decides (``!`` re-includes)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, pattern in patterns:
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


def _dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.removeprefix("!")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        patterns.append((negated, re.compile(regex)))
    return patterns


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_big(
    tmp_path: Path,
) -> None:
    """The README's test command leaves a .venv of hundreds of MB in the repository: the
    context sent to the builder is only what the image is built from."""
    patterns = _dockerignore()
    present = [
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts
    ]
    context = [p for p in present if not _ignored(p, patterns)]
    for path in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "bench/run.py"):
        assert _ignored(path, patterns), path
    assert _ignored("gatekeeper/__pycache__/cli.cpython-311.pyc", patterns)
    copied = [rest.split()[:-1] for instr, rest in _stages((DEPLOY / "Dockerfile").read_text())[0]
              if instr == "COPY"]  # fmt: skip
    for sources in copied:
        for source in sources:
            assert source in context or any(p.startswith(source + "/") for p in context), source
    assert "gatekeeper/policies/default.yaml" in context and "gatekeeper/py.typed" in context
    assert sum((ROOT / p).stat().st_size for p in context) < 2_000_000, sorted(context)


IMAGE_BASE = os.environ.get("DRA_GATEKEEPER_IMAGE_TEST")
if IMAGE_BASE:
    # Needs a container engine and the base image (a registry, or a local substitute): run on
    # request (README.md#run-the-tests), never skipped for their absence.

    def test_the_image_builds_and_runs_as_65532() -> None:
        tag = "dra-gatekeeper:test"
        subprocess.run(
            ["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag,
             "--build-arg", f"PYTHON_IMAGE={IMAGE_BASE}", str(ROOT)],
            check=True,
            timeout=900,
        )  # fmt: skip
        run = ["docker", "run", "--rm", "--read-only"]
        out = subprocess.run(
            [*run, tag, "--version"], capture_output=True, text=True, check=True, timeout=120
        ).stdout
        assert out.startswith("dra-gatekeeper ")
        uid = subprocess.run(
            [*run, "--entrypoint", "id", tag, "-u"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        assert uid.strip() == "65532"
