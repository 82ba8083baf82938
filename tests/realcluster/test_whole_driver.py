"""A whole driver behind the gatekeeper (issue 27): the Go driver on client-go, with in-cluster
config unchanged (its ServiceAccount token, the env and CA of its pod), makes the calls real
drivers make from the node beyond slices and claims through the token listener, each decided by
a rule of ``whole_driver.yaml``; the kube-apiserver's own audit log then shows that no refused
call reached it and that each forwarded call was made as the identity intended: the
gatekeeper's own ServiceAccount, or the driver's for its own custom resource."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.realcluster.admission import install_admission
from tests.realcluster.build import Binaries
from tests.realcluster.cluster import ApiError, RealCluster
from tests.realcluster.objects import (
    CLAIMS,
    GATEKEEPER_NS,
    allocate_claim,
    bound_token,
    create_claim,
)
from tests.realcluster.processes import (
    DriverProcess,
    GatekeeperProcess,
    in_cluster_env,
    in_pod,
    service_account_volume,
)
from tests.realcluster.wholedriver import (
    COMPUTE_DOMAINS,
    POLICY,
    Call,
    Journal,
    apply_rbac,
    install_compute_domains,
)

GPU = "gpu.example.com"
NAMESPACE, ACCOUNT = "gpu-system", "whole-driver"
POD = f"{ACCOUNT}-node-a"
DRIVER_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
GATEKEEPER_SA = "whole-gatekeeper"
GATEKEEPER_USER = f"system:serviceaccount:{GATEKEEPER_NS}:{GATEKEEPER_SA}"
NODE = "/api/v1/nodes/node-a"
TAINT_RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
CLIQUE = "gpu.example.com/clique"
ADMISSION_WHOLE = "ValidatingAdmissionPolicy 'dra-gatekeeper-whole' with binding"


@dataclass(frozen=True)
class Whole:
    gatekeeper: GatekeeperProcess
    driver: DriverProcess
    pod: dict[str, Any]


@pytest.fixture(scope="module")
def whole(
    binaries: Binaries, real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Whole]:
    """The gatekeeper of node-a with ``whole_driver.yaml`` (its own ServiceAccount, bound to
    its pod there, with exactly the RBAC ``policy rbac`` prints), and the driver in its pod."""
    admin = real_cluster.admin
    workdir = tmp_path_factory.mktemp("whole")
    install_compute_domains(admin)
    token, _ = bound_token(real_cluster, GATEKEEPER_NS, GATEKEEPER_SA, "node-a")
    token_file = workdir / "gatekeeper.token"
    token_file.write_text(token)
    apply_rbac(admin, POLICY, f"{GATEKEEPER_NS}/{GATEKEEPER_SA}", "dra-gatekeeper-whole")
    install_admission(
        real_cluster, POLICY, (GPU,), service_account=GATEKEEPER_SA, name="dra-gatekeeper-whole"
    )
    gatekeeper = GatekeeperProcess(real_cluster, POLICY, (GPU,), token_file, listen_token=True)
    try:
        gatekeeper.start()
        driver_token, pod = bound_token(real_cluster, NAMESPACE, ACCOUNT, "node-a")
        volume = service_account_volume(
            workdir / "serviceaccount", driver_token, gatekeeper.pki.path("ca.crt"), NAMESPACE
        )
        with DriverProcess(
            binaries["dradriver"],
            "incluster",
            env=in_cluster_env(gatekeeper),
            wrap=in_pod(volume),
        ) as driver:
            yield Whole(gatekeeper, driver, pod)
    finally:
        gatekeeper.stop()
        admin.call("PATCH", NODE, {"metadata": {"labels": {CLIQUE: None}}},
                   content_type="application/merge-patch+json")  # fmt: skip
        admin.delete(TAINT_RULES)


@pytest.fixture
def journal(real_cluster: RealCluster, whole: Whole) -> Journal:
    return Journal(real_cluster, whole.gatekeeper)


def checked(journal: Journal) -> list[Call]:
    return journal.check(DRIVER_USER, GATEKEEPER_USER)


def refusal(answer: dict[str, Any], code: int = 403) -> str:
    assert (answer["ok"], answer.get("code")) == (False, code), answer
    return str(answer["message"])


def test_own_node_labels_under_the_prefix_only(
    real_cluster: RealCluster, whole: Whole, journal: Journal
) -> None:
    answer = whole.driver("patch-node-labels", labels={CLIQUE: "7"})
    assert answer["ok"], answer
    outside = whole.driver("patch-node-labels", labels={"example.org/clique": "7"})
    # The gatekeeper reads a strategic merge patch before asking the apiserver's dry run: a key
    # outside mayChange is its own refusal, and nothing of the patch goes upstream
    # (docs/security.md, "Patches refused before any dry run").
    why = (
        "metadata.labels[example.org/clique] can change: a write may change only "
        "metadata.labels[gpu.example.com/*] (policy mayChange)"
    )
    assert why in refusal(outside)
    labels = real_cluster.admin.get(NODE)["metadata"]["labels"]
    assert labels.get(CLIQUE) == "7" and "example.org/clique" not in labels
    calls = checked(journal)
    assert [(c.verb, c.refused, c.reason) for c in calls] == [
        ("patch", False, "only what mayChange names changes"),
        ("patch", True, why),
    ]


def test_own_pod_label(real_cluster: RealCluster, whole: Whole, journal: Journal) -> None:
    answer = whole.driver("patch-pod-labels", namespace=NAMESPACE, name=POD, labels={CLIQUE: "a"})
    assert answer["ok"], answer
    outside = whole.driver("patch-pod-labels", namespace=NAMESPACE, name=POD, labels={"app": "x"})
    assert "metadata.labels[app] changes" in refusal(outside)
    stored = real_cluster.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
    assert stored["metadata"]["labels"] == {CLIQUE: "a"}
    assert [(c.verb, c.refused) for c in checked(journal)] == [("patch", False), ("patch", True)]


def test_event_from_the_recorder(real_cluster: RealCluster, whole: Whole, journal: Journal) -> None:
    about_pod = {"namespace": NAMESPACE, "name": POD, "uid": whole.pod["metadata"]["uid"]}
    answer = whole.driver("record-event", reason="Prepared", message="ready", **about_pod)
    assert (answer["ok"], answer.get("verb")) == (True, "create"), answer
    name = answer["object"]["metadata"]["name"]
    stored = real_cluster.admin.get(f"/api/v1/namespaces/{NAMESPACE}/events/{name}")
    assert (stored["reportingComponent"], stored["involvedObject"]["name"]) == (GPU, POD)
    posing = whole.driver("record-event", reason="Evicted", component="kubelet", **about_pod)
    assert "an event names the driver as its reportingComponent" in refusal(posing)
    calls = checked(journal)
    # client-go's recorder (tools/record) writes core/v1 Events, in JSON: its sink posts through
    # the REST client, not the generated (protobuf-preferring) typed client.
    assert [(c.gatekeeper["requestURI"], c.refused) for c in calls] == [
        (f"/api/v1/namespaces/{NAMESPACE}/events", False),
        (f"/api/v1/namespaces/{NAMESPACE}/events", True),
    ]
    assert calls[1].gatekeeper["annotations"]["dra-gatekeeper.io/validation"] == "reports-itself"


def test_lease_as_leader_election_takes_and_releases_it(
    real_cluster: RealCluster, whole: Whole, journal: Journal
) -> None:
    answer = whole.driver("lead", namespace=NAMESPACE, name="gpu-example-com-node-a")
    assert answer == {"op": "lead", "ok": True, "led": True, "identity": f"{GPU}/node-a"}
    lease = real_cluster.admin.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpu-example-com-node-a"
    )
    # Released on cancel: the update that gives it up (no holder, 1 s) was stored.
    assert lease["spec"].get("holderIdentity", "") == ""
    assert lease["spec"]["leaseDurationSeconds"] == 1
    # A renewal may start before the callback cancels the election: left unfinished (499), it
    # never reached the apiserver (checked). A get is answered from the gatekeeper's own read.
    answered = [(c.verb, c.gatekeeper["responseStatus"]["code"]) for c in checked(journal)]
    answered = [call for call in answered if call[1] != 499]
    assert answered[:2] == [("get", 404), ("create", 201)], answered
    assert answered[-2:] == [("get", 200), ("update", 200)], answered


def taint_rule(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "gpu.example.com/unhealthy", "effect": "NoExecute"},
        },
    }


def test_device_taint_rules_bound_to_the_driver_and_node(
    real_cluster: RealCluster, whole: Whole, journal: Journal
) -> None:
    mine = taint_rule("mine", {"driver": GPU, "pool": "node-a/gpus", "device": "gpu-0"})
    assert whole.driver("create-taint-rule", object=mine)["ok"]
    for name, selector in [
        ("everything", {}),
        ("other-driver", {"driver": "nic.example.com", "pool": "node-a/nics"}),
        ("other-node", {"driver": GPU, "pool": "node-b/gpus"}),
    ]:
        answer = whole.driver("create-taint-rule", object=taint_rule(name, selector))
        assert ADMISSION_WHOLE in refusal(answer) and "scope" in refusal(answer), answer
    stored = real_cluster.admin.get(TAINT_RULES)["items"]
    assert [item["metadata"]["name"] for item in stored] == ["mine"]
    calls = checked(journal)
    # Protobuf bodies, decided on the apiserver's dry-run preview: the exported admission policy
    # refuses the preview of each taken-over scope before the gatekeeper's own scope check.
    assert [(c.refused, c.forwarded) for c in calls] == [(False, True)] + [(False, False)] * 3
    assert {c.reason for c in calls[1:]} == {"the apiserver rejected the create preview"}


def test_custom_resource_status_under_the_drivers_own_credentials(
    real_cluster: RealCluster, whole: Whole, journal: Journal
) -> None:
    admin = real_cluster.admin
    domains = COMPUTE_DOMAINS.format(ns=NAMESPACE)
    admin.create(
        domains,
        {
            "apiVersion": "gpu.example.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": "domain-a"},
            "spec": {"numNodes": 1},
        },
    )
    answer = whole.driver(
        "update-custom-status",
        resource="computedomains.v1beta1.gpu.example.com",
        namespace=NAMESPACE,
        name="domain-a",
        status={"nodes": [{"name": "node-a", "status": "Ready"}]},
    )
    assert answer["ok"], answer
    assert admin.get(f"{domains}/domain-a")["status"]["nodes"][0]["status"] == "Ready"
    calls = checked(journal)
    assert [(c.verb, c.gatekeeper["objectRef"].get("subresource")) for c in calls] == [
        ("get", None),
        ("update", "status"),
    ]
    extra = calls[1].apiserver["user"]["extra"] if calls[1].apiserver else {}
    assert extra["authentication.kubernetes.io/node-name"] == ["node-a"]
    # Only the driver's RBAC lets this through: the gatekeeper's own account has none for it.
    for user, allowed in [(GATEKEEPER_USER, False), (DRIVER_USER, True)]:
        assert can(real_cluster, user, "update", "computedomains", "status") is allowed


def can(cluster: RealCluster, user: str, verb: str, resource: str, sub: str = "") -> bool:
    review = cluster.admin.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                "resourceAttributes": {
                    "group": "gpu.example.com",
                    "resource": resource,
                    "subresource": sub,
                    "verb": verb,
                    "namespace": NAMESPACE,
                },
            },
        },
    )
    return bool(review["status"]["allowed"])


@pytest.fixture
def allocated(real_cluster: RealCluster) -> Iterator[dict[str, Any]]:
    admin = real_cluster.admin
    claim = create_claim(admin, "tenant", "whole-applied")
    yield allocate_claim(admin, claim, [(GPU, "node-a", "gpu-0")])
    try:
        admin.delete(f"{CLAIMS.format(ns='tenant')}/whole-applied")
    except ApiError as error:
        assert error.code == 404


def test_claim_status_by_forced_server_side_apply(
    real_cluster: RealCluster, whole: Whole, allocated: dict[str, Any], journal: Journal
) -> None:
    entry = {
        "driver": GPU,
        "pool": "node-a",
        "device": "gpu-0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Configured",
                "message": "",
                "lastTransitionTime": "2026-12-03T10:00:00Z",
            }
        ],
    }
    answer = whole.driver(
        "apply-status", namespace="tenant", name="whole-applied", apply=[entry], force=True
    )
    assert answer["ok"], answer
    stored = real_cluster.admin.get(f"{CLAIMS.format(ns='tenant')}/whole-applied")
    assert stored["status"]["devices"][0]["conditions"][0]["reason"] == "Configured"
    managers = {(m["manager"], m["operation"], m.get("subresource")) for m in
                stored["metadata"]["managedFields"]}  # fmt: skip
    assert (GPU, "Apply", "status") in managers
    (call,) = checked(journal)
    assert "force=true" in call.gatekeeper["requestURI"]
    assert f"fieldManager={GPU}" in call.gatekeeper["requestURI"]


def test_pods_on_this_node(whole: Whole, journal: Journal) -> None:
    answer = whole.driver("list-pods", fieldSelector="spec.nodeName=node-a")
    assert answer["ok"], answer
    pods = answer["pods"]
    assert {p["nodeName"] for p in pods} == {"node-a"}
    assert {"namespace": NAMESPACE, "name": POD, "nodeName": "node-a"} in pods
    everywhere = whole.driver("list-pods")
    assert "spec.nodeName" in refusal(everywhere)
    assert [c.refused for c in checked(journal)] == [False, True]
