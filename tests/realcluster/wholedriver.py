"""A whole driver behind the gatekeeper on the real tier: the policy of ``whole_driver.yaml``,
the RBAC ``dra-gatekeeper policy rbac`` prints for it (the gatekeeper's own ServiceAccount, and
apart from it the driver's own for its custom resource), that custom resource's CRD, and the
apiserver's own journal of what reached it, and as whom."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.realcluster.cluster import Api, ApiError, RealCluster, poll
from tests.realcluster.objects import ensure
from tests.realcluster.processes import GatekeeperProcess
from tests.recorded import parse

__all__ = [
    "COMPUTE_DOMAINS",
    "DRIVER_CREDENTIAL_RESOURCES",
    "POLICY",
    "Call",
    "Journal",
    "apply_rbac",
    "install_compute_domains",
]

POLICY = Path(__file__).with_name("whole_driver.yaml")
COMPUTE_DOMAINS = "/apis/gpu.example.com/v1beta1/namespaces/{ns}/computedomains"
DRIVER_CREDENTIAL_RESOURCES = frozenset({"computedomains"})
"""The resources ``whole_driver.yaml`` forwards under the driver's own token."""
_RBAC = "rbac.authorization.k8s.io"
_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})

_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_COMPUTE_DOMAIN_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "computedomains.gpu.example.com"},
    "spec": {
        "group": "gpu.example.com",
        "scope": "Namespaced",
        "names": {
            "plural": "computedomains",
            "singular": "computedomain",
            "kind": "ComputeDomain",
            "listKind": "ComputeDomainList",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": _OPEN,
                            "status": _OPEN,
                        },
                    }
                },
            }
        ],
    },
}


def install_compute_domains(admin: Api) -> None:
    """A small ComputeDomain CRD (namespaced, a status subresource), once it is served."""
    ensure(admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", _COMPUTE_DOMAIN_CRD)
    poll(
        "the ComputeDomain CRD to be served",
        lambda: admin.get(COMPUTE_DOMAINS.format(ns="gpu-system")) is not None,
        timeout=60,
    )


def _put_or_create(admin: Api, document: dict[str, Any]) -> None:
    kind, meta = document["kind"], document["metadata"]
    plural = {
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
    }[kind]
    where = f"namespaces/{meta['namespace']}/" if "namespace" in meta else ""
    collection = f"/apis/{_RBAC}/v1/{where}{plural}"
    try:
        admin.create(collection, document)
    except ApiError as error:
        if error.code != 409:
            raise
        admin.call("PUT", f"{collection}/{meta['name']}", document)


def apply_rbac(admin: Api, policy: Path, service_account: str, name: str) -> list[dict[str, Any]]:
    """Everything ``dra-gatekeeper policy rbac`` prints for ``policy`` (the gatekeeper's
    ClusterRole, its Roles in the drivers' namespaces, the drivers' own ClusterRoles for the
    kinds forwarded under their credentials, with bindings), and the ClusterRoleBinding of the
    gatekeeper's ClusterRole to ``service_account`` (namespace/name), created or replaced."""
    args = [sys.executable, "-m", "gatekeeper", "policy", "rbac", "--policy", str(policy)]
    args += ["--service-account", service_account, "--name", name]
    printed = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    documents = [d for d in yaml.safe_load_all(printed) if d]
    namespace, account = service_account.split("/", 1)
    documents.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    for document in documents:
        _put_or_create(admin, document)
    return documents


@dataclass(frozen=True)
class Call:
    """One request of the driver as the gatekeeper logged it, and the apiserver's event of the
    same request if it reached the apiserver (the gatekeeper forwards its own Audit-ID)."""

    gatekeeper: dict[str, Any]
    apiserver: dict[str, Any] | None

    @property
    def refused(self) -> bool:
        decision = self.gatekeeper["annotations"].get("authorization.k8s.io/decision")
        return bool(decision == "forbid")

    @property
    def reason(self) -> str:
        """The gatekeeper's reason for its decision (its audit annotation)."""
        return str(self.gatekeeper["annotations"].get("authorization.k8s.io/reason", ""))

    @property
    def forwarded(self) -> bool:
        """The gatekeeper logged an answer of the apiserver to it."""
        return "dra-gatekeeper.io/upstream-audit-id" in self.gatekeeper["annotations"]

    @property
    def resource(self) -> str:
        return str(self.gatekeeper.get("objectRef", {}).get("resource", ""))

    @property
    def verb(self) -> str:
        return str(self.gatekeeper["verb"])


class Journal:
    """Both audit logs from a mark on: the gatekeeper's (what the driver asked) and the
    kube-apiserver's own (what reached it, as whom). Only the apiserver log's new bytes are
    read, so a check costs what the test did, not what the session did before."""

    def __init__(self, cluster: RealCluster, gatekeeper: GatekeeperProcess) -> None:
        self.cluster = cluster
        self.gatekeeper = gatekeeper
        self.mark = gatekeeper.audit_mark()
        self.offset = cluster.audit_log.stat().st_size if cluster.audit_log.exists() else 0

    def apiserver_events(self) -> dict[str, dict[str, Any]]:
        """The apiserver's ResponseComplete events written since the mark, by audit ID."""
        with self.cluster.audit_log.open("rb") as log:
            log.seek(self.offset)
            lines = log.read().decode().splitlines()
        events = (parse(line) for line in lines if line.strip())
        return {e["auditID"]: e for e in events if e.get("stage") in ("ResponseComplete", "Panic")}

    def driver_calls(self, driver_user: str) -> tuple[list[Call], dict[str, dict[str, Any]]]:
        """The driver's requests since the mark (the gatekeeper's events whose token user is
        ``driver_user``), each with its apiserver event, once every forwarded one is logged;
        and all the apiserver's events since the mark."""
        self.gatekeeper.settle()
        ours = [
            e
            for e in self.gatekeeper.audit_events()[self.mark :]
            if e["user"].get("extra", {}).get("dra-gatekeeper.io/peer-serviceAccount")
            == [driver_user]
        ]
        forwarded = {
            e["annotations"]["dra-gatekeeper.io/upstream-audit-id"]
            for e in ours
            if "dra-gatekeeper.io/upstream-audit-id" in e["annotations"]
        }

        def logged() -> dict[str, dict[str, Any]] | None:
            events = self.apiserver_events()
            return events if forwarded <= events.keys() else None

        events = poll("the apiserver's audit log to hold every forwarded call", logged, timeout=10)
        return [Call(e, events.get(e["auditID"])) for e in ours], events

    def check(self, driver_user: str, gatekeeper_user: str) -> list[Call]:
        """What the apiserver saw of the driver's calls since the mark, asserted:

        - a call the gatekeeper refused (or did not decide: the driver left first) never
          reached the apiserver: no event with its Audit-ID; and no write other than the
          gatekeeper's own dry runs (previews of bodies it does not read itself, DESIGN §4.4)
          was made there by the gatekeeper's account that is not a call it allowed;
        - every forwarded call reached it as the identity intended: the driver's own
          ServiceAccount for the kinds forwarded under its credentials, the gatekeeper's own
          for everything else; the driver's token was used for nothing more.

        Returns the driver's calls for the test's own assertions.
        """
        calls, everything = self.driver_calls(driver_user)
        assert calls, "the driver made no call through the gatekeeper"
        reached = set()
        for call in calls:
            annotations = call.gatekeeper["annotations"]
            if call.forwarded:
                assert (
                    annotations["dra-gatekeeper.io/upstream-audit-id"]
                    == (call.gatekeeper["auditID"])
                ), annotations
            if call.apiserver is None:
                continue
            assert not call.refused, ("a refused call reached the apiserver", call.apiserver)
            assert annotations.get("authorization.k8s.io/decision") == "allow", annotations
            reached.add(call.apiserver["auditID"])
            driver_kind = call.resource in DRIVER_CREDENTIAL_RESOURCES
            expected = driver_user if driver_kind else gatekeeper_user
            assert call.apiserver["user"]["username"] == expected, (call.gatekeeper, call.apiserver)
            assert (annotations.get("dra-gatekeeper.io/credentials") == "driver") is driver_kind
        for event in everything.values():
            user = event["user"]["username"]
            if user == driver_user:
                # The driver's token reached the apiserver only on the calls forwarded with it.
                assert event["auditID"] in reached, event
            elif user == gatekeeper_user and _real_write(event):
                assert event["auditID"] in reached, ("a write nobody allowed", event)
        return calls


def _real_write(event: dict[str, Any]) -> bool:
    """A write the apiserver carried out (not a dry run, not a TokenReview)."""
    if event["verb"] not in _WRITES or "dryRun=All" in event["requestURI"]:
        return False
    return bool(event.get("objectRef", {}).get("resource") != "tokenreviews")
