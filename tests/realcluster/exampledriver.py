"""The reference driver on the real tier: dra-example-driver's own kubelet plugin (the binary
``dra-example-kubeletplugin`` of ``sigs.k8s.io/dra-example-driver``, built unchanged), started
as its Helm chart starts it; the kubelet's side of its gRPC API (``cmd/kubeletdra``); and a
gatekeeper deployed for a policy as ``dra-gatekeeper policy deploy`` says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tests.realcluster.admission import await_admission
from tests.realcluster.build import MODULE
from tests.realcluster.cluster import RealCluster, free_port, poll, remove_workdir
from tests.realcluster.kubectl import Kubectl, kubectl_binary
from tests.realcluster.objects import bound_token, ensure
from tests.realcluster.processes import (
    GatekeeperProcess,
    in_pod,
    service_account_volume,
    terminate,
)

__all__ = [
    "ACCOUNT",
    "DRIVER",
    "DRIVER_USER",
    "NAMESPACE",
    "POD",
    "Kubelet",
    "Plugin",
    "PluginError",
    "Refused",
    "account_of",
    "apply_deployment",
    "bind_cluster_role",
    "calls_of",
    "chart_env",
    "chart_rules",
    "deploy_gatekeeper",
    "launch",
    "plugin_events",
    "refusals",
    "slices_of",
    "start_gatekeeper",
]

DRIVER = "gpu.example.com"
NAMESPACE = "dra-example-driver"
ACCOUNT = "dra-example-driver-service-account"
"""The chart's namespace and ServiceAccount, as deploy/examples/dra-example-driver/values.yaml
pins them (and policies/dra-example-driver.yaml maps them to the driver)."""
DRIVER_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
POD = "dra-example-driver-kubeletplugin-x7k2p"
"""The plugin's pod (its DaemonSet's, on each node: ``<POD>-<node>``)."""
_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_RBAC = "rbac.authorization.k8s.io"


def chart_env(node: str, pod_uid: str, health_port: int, **changes: str) -> dict[str, str]:
    """The kubelet plugin's environment as the chart's DaemonSet sets it (v0.3.0,
    deployments/helm/dra-example-driver/templates/kubeletplugin.yaml, default values), its
    kubelet paths left to :class:`Plugin`; ``changes`` override or add (``GPU_PARTITIONS``)."""
    env = {
        "DRIVER_NAME": DRIVER,
        "DEVICE_PROFILE": "gpu",
        "NODE_NAME": node,  # fieldRef spec.nodeName
        "NAMESPACE": NAMESPACE,  # fieldRef metadata.namespace
        "NUM_DEVICES": "8",
        "HEALTHCHECK_PORT": str(health_port),  # the chart's 51515, free here
        "GPU_PARTITIONS": "0",
        "POD_UID": pod_uid,  # fieldRef metadata.uid: sockets named for seamless upgrades
    }
    return env | changes


class PluginError(RuntimeError):
    """The plugin exited before it registered."""


class Plugin:
    """One run of ``dra-example-kubeletplugin``: its kubelet plugin and registry directories and
    its CDI root in a temporary directory of its own; what its pod gives it (``env``, and
    ``wrap``, the mount namespace holding its service-account volume) from the caller."""

    def __init__(self, binary: str, env: dict[str, str], wrap: list[str]) -> None:
        # Short: its gRPC sockets' paths (with the pod's uid) must fit sockaddr_un.
        self.workdir = Path(tempfile.mkdtemp(prefix="gk-plugin-"))
        self.registry = self.workdir / "plugins_registry"
        self.plugins = self.workdir / "plugins"
        self.cdi = self.workdir / "cdi"
        for directory in (self.registry, self.plugins, self.cdi):
            directory.mkdir(parents=True, exist_ok=True)
        self.env = {
            **env,
            "CDI_ROOT": str(self.cdi),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.registry),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.plugins),
        }
        self.log = self.workdir / "plugin.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*wrap, binary],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env},
            )
        try:
            poll("the plugin's registration socket", self._registered, timeout=60)
        except BaseException:
            self.stop()
            raise

    def _registered(self) -> bool:
        if self.process.poll() is not None:
            raise PluginError(f"the plugin exited {self.process.returncode}: {self.log_tail()}")
        return any(self.registry.glob(f"{DRIVER}-*reg.sock"))

    @property
    def health_port(self) -> int:
        return int(self.env["HEALTHCHECK_PORT"])

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """The CDI spec files it wrote, by file name."""
        return {path.name: yaml.safe_load(path.read_text()) for path in sorted(self.cdi.glob("*"))}

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops its container; it shuts down by itself."""
        terminate(self.process)
        remove_workdir(self.workdir)

    def __enter__(self) -> Plugin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Kubelet:
    """The kubelet's calls to a plugin (``cmd/kubeletdra``): registration, prepare, unprepare,
    the liveness probe."""

    binary: str
    plugin: Plugin

    def call(self, op: str, *claims: dict[str, Any]) -> dict[str, Any]:
        """What the plugin answered (``{"error": ...}`` when the call itself failed)."""
        args = [self.binary, f"-op={op}", f"-registry={self.plugin.registry}", f"-driver={DRIVER}"]
        args += [f"-health-port={self.plugin.health_port}"]
        for claim in claims:
            meta = claim["metadata"]
            args.append(f"-claim={meta['namespace']}/{meta['name']}/{meta['uid']}")
        done = subprocess.run(args, capture_output=True, text=True, timeout=90)
        assert done.stdout, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout)
        assert (done.returncode == 0) is ("error" not in answer), (done.returncode, answer)
        return answer

    def prepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        return self.call("prepare", *claims)

    def unprepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        return self.call("unprepare", *claims)


def slices_of(cluster: RealCluster, node: str) -> list[dict[str, Any]]:
    """The driver's ResourceSlices of ``node`` as the apiserver stores them (read as an admin)."""
    selector = f"spec.driver={DRIVER},spec.nodeName={node}"
    items: list[dict[str, Any]] = cluster.admin.get(f"{_SLICES}?fieldSelector={selector}")["items"]
    return items


def deploy_gatekeeper(
    cluster: RealCluster,
    policy: Path,
    account: tuple[str, str],
    name: str,
    workdir: Path,
) -> GatekeeperProcess:
    """``dra-gatekeeper policy deploy --out`` for ``policy`` and the gatekeeper's ServiceAccount
    ``account`` (namespace, name), applied (:func:`apply_deployment`), and node-a's gatekeeper
    started with it (:func:`start_gatekeeper`)."""
    namespace, service_account = account
    out = workdir / "deployed"
    args = [sys.executable, "-m", "gatekeeper", "policy", "deploy", "--policy", str(policy)]
    args += ["--service-account", f"{namespace}/{service_account}", "--name", name]
    subprocess.run([*args, "--out", str(out)], check=True, capture_output=True, text=True)
    apply_deployment(cluster, out, account, name, workdir)
    return start_gatekeeper(cluster, policy, account, workdir)


def apply_deployment(
    cluster: RealCluster, out: Path, account: tuple[str, str], name: str, workdir: Path
) -> None:
    """What ``policy deploy --out`` wrote in ``out`` (the gatekeeper's ClusterRole, the
    admission policy holding it to its node, the APF objects) applied by an admin with
    ``kubectl apply``, and the ClusterRoleBinding the chart adds; returns once the admission
    policy is enforced."""
    namespace, service_account = account
    cert = cluster.client_cert(f"admin-{name}", "admin", "system:masters")
    kubeconfig = cluster.kubeconfig(workdir / f"{name}.kubeconfig", cert=cert)
    Kubectl(kubectl_binary(), kubeconfig, workdir / "kubectl-cache").run("apply", "-f", str(out))
    bind_cluster_role(cluster, name, account)
    await_admission(cluster, namespace, service_account, name)


def bind_cluster_role(cluster: RealCluster, role: str, account: tuple[str, str]) -> None:
    """The ClusterRoleBinding ``role`` of the ClusterRole ``role`` to ``account`` (namespace,
    name), as a chart makes it."""
    namespace, name = account
    ensure(
        cluster.admin,
        f"/apis/{_RBAC}/v1/clusterrolebindings",
        {
            "apiVersion": f"{_RBAC}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )


def start_gatekeeper(
    cluster: RealCluster, policy: Path, account: tuple[str, str], workdir: Path
) -> GatekeeperProcess:
    """node-a's gatekeeper serving ``policy``, with a token of ``account`` bound to its pod
    there, and its token listener."""
    token, _ = bound_token(cluster, *account, "node-a")
    token_file = workdir / f"{account[1]}.token"
    token_file.write_text(token)
    drivers = tuple(yaml.safe_load(policy.read_text()).get("drivers", ()))
    return GatekeeperProcess(cluster, policy, drivers, token_file, listen_token=True).start()


_PORT_ATTEMPTS = 3


def launch(
    binary: str,
    cluster: RealCluster,
    node: str,
    server: tuple[int, str],
    workdir: Path,
    **env: str,
) -> Plugin:
    """The plugin in its pod on ``node``, with a token of the chart's ServiceAccount bound to
    the pod, reaching ``server`` (the port and CA file of the gatekeeper's token listener, or
    of an apiserver) as its in-cluster config."""
    token, pod = bound_token(cluster, NAMESPACE, ACCOUNT, node, pod=f"{POD}-{node}")
    port, ca_file = server
    volume = service_account_volume(
        Path(tempfile.mkdtemp(prefix="sa-", dir=workdir)), token, ca_file, NAMESPACE
    )
    for attempt in range(_PORT_ATTEMPTS):
        environment = chart_env(node, pod["metadata"]["uid"], free_port(), **env)
        environment |= {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(port),
        }
        try:
            return Plugin(binary, environment, in_pod(volume))
        except PluginError as exc:
            # free_port() finds a port that was free a moment ago; the plugin binds its
            # healthcheck port itself (on every address), and a test on another worker may
            # take the port first.
            if "address already in use" not in str(exc) or attempt == _PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def plugin_events(gatekeeper: GatekeeperProcess, since: int = 0) -> list[dict[str, Any]]:
    """The gatekeeper's audit events of the plugin's requests (its client-go user agent) after
    ``since``, once every answered request is logged."""
    gatekeeper.settle()
    return [
        event
        for event in gatekeeper.audit_events()[since:]
        if event["userAgent"].startswith("dra-example-kubeletplugin/")
    ]


def account_of(event: dict[str, Any]) -> str:
    """The ServiceAccount of the token a request was identified by ("" when none was)."""
    accounts = event["user"].get("extra", {}).get("dra-gatekeeper.io/peer-serviceAccount", [""])
    return str(accounts[0])


class Refused(NamedTuple):
    """A request the gatekeeper refused, as its audit event says."""

    verb: str
    path: str
    code: int
    rule: str
    reason: str


def refusals(events: Iterable[dict[str, Any]]) -> list[Refused]:
    """The requests the gatekeeper refused among ``events``."""
    return [
        Refused(
            event["verb"],
            event["requestURI"].split("?")[0],
            event["responseStatus"]["code"],
            event["annotations"].get("dra-gatekeeper.io/rule", ""),
            event["annotations"].get("authorization.k8s.io/reason", ""),
        )
        for event in events
        if event["annotations"].get("authorization.k8s.io/decision") != "allow"
    ]


def calls_of(events: Iterable[dict[str, Any]]) -> Iterator[tuple[str, str, str, str]]:
    """(verb, resource[/subresource], apiVersion, request encoding) of each event."""
    for event in events:
        ref = event.get("objectRef", {})
        resource = ref.get("resource", event["requestURI"].split("?")[0])
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        version = "/".join(part for part in (ref.get("apiGroup"), ref.get("apiVersion")) if part)
        encoding = event["annotations"].get("dra-gatekeeper.io/content-type", "")
        yield event["verb"], resource, version, encoding


def module_file(relative: str) -> Path:
    """A file of the dra-example-driver module this Go module requires (its pinned version), from
    the Go module cache (downloaded by the build)."""
    done = subprocess.run(
        ["go", "list", "-m", "-json", "sigs.k8s.io/dra-example-driver"],
        cwd=MODULE,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return Path(json.loads(done.stdout)["Dir"]) / relative


def chart_rules() -> list[dict[str, Any]]:
    """The rules of the ClusterRole the driver's chart gives its ServiceAccount (its
    templates/clusterrole.yaml: the rules are plain YAML after the templated metadata)."""
    template = module_file("deployments/helm/dra-example-driver/templates/clusterrole.yaml")
    rules: list[dict[str, Any]] = yaml.safe_load(template.read_text().split("\nrules:\n", 1)[1])
    return rules
