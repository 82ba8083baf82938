"""The exported admission policy, proven against the real apiserver itself: the gatekeeper's own
pod-bound token names its node to the apiserver, and used directly (no gatekeeper in between)
it cannot take over what belongs to another node or driver: each try is refused by the
admission policy, with its message (docs/admission-policy.md)."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.policytest import load_test_file
from tests.paths import REPO
from tests.realcluster.admission import SLICES, denied_by, node_slice
from tests.realcluster.admissiondiff import realize, recorded_creates, send_both
from tests.realcluster.cluster import Api, ApiError, RealCluster, poll
from tests.realcluster.conftest import DRIVERS
from tests.realcluster.objects import (
    CLAIMS,
    GATEKEEPER_NS,
    GATEKEEPER_SA,
    allocate_claim,
    create_claim,
    ensure,
)
from tests.realcluster.processes import GatekeeperProcess

NODE_NAME = "authentication.kubernetes.io/node-name"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
DENIED = denied_by("dra-gatekeeper")
WRITTEN = "the object must name one of the node's drivers, this node, and a pool prefixed by"
STORED = "the stored object belongs to another node or driver"
CLAIM_NODE = "the claim is not allocated to the node's drivers on this node"
CLAIM_ENTRIES = "a status write may change only the entries of the node's drivers"


@pytest.fixture
def direct(real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess) -> Api:
    """The apiserver as the gatekeeper of node-a, with its own token (the gatekeeper's file)."""
    token = real_gatekeeper.token_file.read_text().strip()
    return Api(real_cluster.url, real_cluster.ca_file, token=token)


@pytest.fixture
def made(real_cluster: RealCluster) -> Iterator[list[str]]:
    """Paths of objects an admin made for a test: deleted after it."""
    paths: list[str] = []
    yield paths
    for path in paths:
        try:
            real_cluster.admin.delete(path)
        except ApiError as error:
            if error.code != 404:
                raise


def refusal(call: Callable[[], Any]) -> tuple[int, str]:
    try:
        answer = call()
    except ApiError as error:
        body = error.body if isinstance(error.body, dict) else {}
        return error.code, str(body.get("message", error.body))
    raise AssertionError(f"the apiserver accepted it: {answer}")


def test_the_gatekeepers_token_names_its_node_to_the_apiserver(direct: Api) -> None:
    review = direct.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{GATEKEEPER_NS}:{GATEKEEPER_SA}"
    assert user["extra"][NODE_NAME] == ["node-a"]


def test_its_own_slice_passes(direct: Api) -> None:
    """The control: the same token, its own node's slice (so the refusals below are not RBAC)."""
    stored = direct.create(f"{SLICES}?dryRun=All", node_slice("node-a", pool="node-a/gpus"))
    assert stored["spec"]["nodeName"] == "node-a"


CREATES = [
    ("another node's slice", SLICES, node_slice("node-b")),
    ("another driver's slice", SLICES, node_slice("node-a", driver="evil.example.com")),
    ("a pool outside the node prefix", SLICES, node_slice("node-a", pool="node-b/gpus")),
    ("a pool of a longer node name", SLICES, node_slice("node-a", pool="node-ab")),
    (
        "another node's DevicePool",
        POOLS,
        {
            "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
            "kind": "DevicePool",
            "metadata": {"name": "node-b"},
            "spec": {"driver": "gpu.example.com", "nodeName": "node-b"},
        },
    ),
]


@pytest.mark.parametrize(("what", "path", "body"), CREATES, ids=[c[0] for c in CREATES])
def test_a_takeover_create_is_refused_by_the_apiserver(
    direct: Api, what: str, path: str, body: dict[str, Any]
) -> None:
    code, message = refusal(lambda: direct.create(path, body))
    assert code == 403
    assert DENIED in message and WRITTEN in message, message


@pytest.mark.parametrize("verb", ["update", "delete"])
def test_another_nodes_slice_cannot_be_changed_or_deleted(
    real_cluster: RealCluster, direct: Api, made: list[str], verb: str
) -> None:
    stored = real_cluster.admin.create(SLICES, node_slice("node-b"))
    path = f"{SLICES}/{stored['metadata']['name']}"
    made.append(path)
    if verb == "delete":
        code, message = refusal(lambda: direct.delete(path))
    else:
        stored["metadata"]["labels"] = {"taken": "over"}
        code, message = refusal(lambda: direct.call("PUT", path, stored))
    assert code == 403
    # An update is refused for what it writes (node-b) before what is stored is looked at.
    assert DENIED in message and (WRITTEN if verb == "update" else STORED) in message
    assert "taken" not in (real_cluster.admin.get(path)["metadata"].get("labels") or {})


def _claim(real_cluster: RealCluster, made: list[str], name: str, node: str) -> dict[str, Any]:
    claim = create_claim(real_cluster.admin, "tenant", name)
    made.append(f"{CLAIMS.format(ns='tenant')}/{name}")
    results = [("gpu.example.com", node, "gpu-0"), ("evil.example.com", node, "evil-0")]
    return allocate_claim(real_cluster.admin, claim, results, node=node)


@pytest.fixture
def broad_claim_role(real_cluster: RealCluster) -> Iterator[None]:
    """The gatekeeper's account also granted every driver's claim status on any node (an
    over-broad ClusterRole): the apiserver's own ``resourceclaims/driver`` check then lets a
    takeover through, and the admission policy is the line that refuses it."""
    admin, name = real_cluster.admin, "dra-gatekeeper-admission-test-broad"
    rule = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
            "verbs": ["associated-node:update", "arbitrary-node:update"]}  # fmt: skip
    ensure(admin, f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": GATEKEEPER_SA, "namespace": GATEKEEPER_NS}
    ensure(
        admin,
        f"{RBAC}/clusterrolebindings",
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [subject],
        },
    )  # fmt: skip
    try:
        yield
    finally:
        admin.delete(f"{RBAC}/clusterrolebindings/{name}")
        admin.delete(f"{RBAC}/clusterroles/{name}")


@pytest.mark.parametrize(
    ("case", "node", "driver", "expected"),
    [
        ("another driver's entry", "node-a", "evil.example.com", CLAIM_ENTRIES),
        ("a claim on another node", "node-b", "gpu.example.com", CLAIM_NODE),
    ],
)
def test_a_claim_status_takeover_is_refused_by_both_layers_of_the_apiserver(
    real_cluster: RealCluster,
    direct: Api,
    made: list[str],
    case: str,
    node: str,
    driver: str,
    expected: str,
    request: pytest.FixtureRequest,
) -> None:
    name = f"admission-{node}-{driver.split('.')[0]}"
    claim = _claim(real_cluster, made, name, node)
    claim["status"]["devices"] = [
        {"driver": driver, "pool": node, "device": f"{driver.split('.')[0]}-0", "data": {"x": 1}}
    ]
    path = f"{CLAIMS.format(ns='tenant')}/{name}/status"
    # The apiserver's own check of the writer's right to the driver's entry comes first (422).
    code, message = refusal(lambda: direct.call("PUT", path, claim))
    assert code == 422 and 'resource="resourceclaims/driver"' in message, message
    request.getfixturevalue("broad_claim_role")
    # With that check passed by an over-broad role, the admission policy refuses (polled: RBAC
    # changes apply asynchronously; the write is refused either way, so nothing is stored).
    code, message = poll(
        "the broad role to apply",
        lambda: (answer := refusal(lambda: direct.call("PUT", path, claim)))[0] != 422 and answer,
    )
    assert code == 403
    assert DENIED in message and expected in message, message
    assert not real_cluster.admin.get(path[: -len("/status")])["status"].get("devices")


def test_a_gatekeeper_token_bound_to_no_pod_is_refused(
    real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess
) -> None:
    """A token of the gatekeeper's account that names no node (TokenRequest without a bound
    pod): nothing binds its writes to a node, so the admission policy refuses them all."""
    admin = real_cluster.admin
    ensure(
        admin,
        f"/api/v1/namespaces/{GATEKEEPER_NS}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": GATEKEEPER_SA}},
    )
    answer = admin.create(
        f"/api/v1/namespaces/{GATEKEEPER_NS}/serviceaccounts/{GATEKEEPER_SA}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    unbound = Api(real_cluster.url, real_cluster.ca_file, token=answer["status"]["token"])
    code, message = refusal(
        lambda: unbound.create(f"{SLICES}?dryRun=All", node_slice("node-a", pool="node-a/x"))
    )
    assert code == 403
    assert DENIED in message and "names no node" in message, message


# --- the two layers side by side ------------------------------------------------------------------

DEFAULT_TEST = REPO / "policies" / "default_test.yaml"
# Writes the gatekeeper refuses and the admission policy allows, by case name: what the apiserver
# cannot see or does not store (docs/admission-policy.md, "Proven on the real tier").
GATEKEEPER_ONLY = {
    "deletecollection without selector": "the gatekeeper refuses a collection delete that does "
    "not select the caller's own objects; the apiserver admits it object by object, and each "
    "one here is a node's driver's",
    "slice create as another driver's": "the caller is one node driver writing another's "
    "slice: the apiserver sees the gatekeeper, not which of the node's drivers called it",
    "update status of another driver's entry": "the same, for a claim status entry of another "
    "of the node's drivers",
    "patch of its spec through status": "the status subresource drops spec changes, so what "
    "the apiserver admits changes no spec; the gatekeeper refuses the request as written",
}


def test_the_policy_tests_writes_under_both_layers(
    real_cluster: RealCluster, direct: Api, clean: None
) -> None:
    """Every write of policies/default_test.yaml (the tier's policy and node): what the gatekeeper
    allows, the admission policy allows; what it refuses, the gatekeeper refuses too. The writes
    it allows and the gatekeeper refuses are what the apiserver cannot see (the calling driver
    among the node's drivers) or the gatekeeper refuses for the request itself."""
    test_file = load_test_file(str(DEFAULT_TEST))
    assert test_file.node == "node-a" and set(test_file.policy.drivers) <= set(DRIVERS)
    verdicts, left_out = [], {}
    for case in test_file.cases:
        found = realize(real_cluster, direct, case, DENIED)
        if isinstance(found, str):
            left_out[case.name] = found
        else:
            verdicts.append(found)
    false_refusals = [v for v in verdicts if v.gatekeeper_allows and v.admission_refuses]
    assert false_refusals == []
    refused = [v for v in verdicts if v.admission_refuses]
    allowed = [v for v in verdicts if v.gatekeeper_allows and v.code < 300]
    differences = [v for v in verdicts if not v.gatekeeper_allows and v.code < 300]
    other = Counter(
        (v.gatekeeper_allows, v.code) for v in verdicts if v.code >= 300 and not v.admission_refuses
    )
    summary = (
        f"{len(verdicts)} writes sent: {len(allowed)} allowed by both, {len(refused)} refused by "
        f"the admission policy (and the gatekeeper), {len(differences)} refused by the gatekeeper "
        f"alone; answered otherwise by the apiserver (gatekeeper allows, code): {dict(other)}; "
        f"{len(left_out)} cases left out"
    )
    print(summary)
    for verdict in differences:
        print(f"  gatekeeper only: {verdict.case}")
    for verdict in verdicts:
        if verdict.code >= 300 and not verdict.admission_refuses:
            print(f"  otherwise: {verdict.case}: {verdict.code} {verdict.message[:160]}")
    for name, why in sorted(left_out.items()):
        print(f"  left out: {name}: {why}")
    assert refused and allowed, summary
    unexplained = [v.case for v in differences if not any(k in v.case for k in GATEKEEPER_ONLY)]
    assert unexplained == [], summary


def test_audit_check_on_the_real_gatekeepers_log_shows_both_layers(
    real_gatekeeper: GatekeeperProcess,
    real_policy: Path,
    capsys: pytest.CaptureFixture[str],
    clean: None,
) -> None:
    api = real_gatekeeper.driver_api("gpu.example.com")
    stored = api.create(SLICES, node_slice("node-a", pool="node-a/audit"))
    path = f"{SLICES}/{stored['metadata']['name']}"
    stored["metadata"]["labels"] = {"step": "update"}
    api.call("PUT", path, stored)
    api.delete(path)
    real_gatekeeper.settle()
    capsys.readouterr()
    log = str(real_gatekeeper.audit_log)
    code = run_audit_command(["check", "--policy", str(real_policy), "--admission", "all", log])
    out = capsys.readouterr().out
    assert code == 0, out
    mine = [line for line in out.splitlines() if stored["metadata"]["name"] in line
            or (line.startswith("ADMISSION") and f"create {SLICES} " in line)]  # fmt: skip
    verdicts = {line.split()[4]: line.split()[1] for line in mine if line.startswith("ADMISSION")}
    assert verdicts == {"create": "ALLOWS", "update": "ALLOWS", "delete": "ALLOWS"}, out
    assert " 0 refused, " in out and "ADMISSION REFUSES" not in out, out


def _slash_pool(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with its ``<node>-<rest>`` pool (the recordings' form, node-dash.yaml's opt-in)
    as ``<node>/<rest>`` (the default policy's)."""
    changed = copy.deepcopy(body)
    spec = changed.get("spec") or {}
    node, pool = str(spec.get("nodeName", "")), (spec.get("pool") or {}).get("name")
    if node and isinstance(pool, str) and pool.startswith(f"{node}-"):
        spec["pool"]["name"] = f"{node}/{pool[len(node) + 1 :]}"
    return changed


@pytest.mark.parametrize("pools", ["as recorded", "node/ pools"])
def test_the_recorded_creates_under_both_layers(
    real_gatekeeper: GatekeeperProcess, direct: Api, pools: str
) -> None:
    """The recorded slice creates (dry runs), through the gatekeeper as the driver the slice
    names (else gpu.example.com) and straight with its token: the admission policy refuses
    nothing the gatekeeper lets through, and whatever it refuses the gatekeeper refused itself.
    As recorded, every pool is ``node-a-<rest>``, which the default policy does not allow;
    with ``node-a/<rest>`` the node's own creates pass both layers."""
    results = []
    for name, recorded in recorded_creates():
        body = recorded if pools == "as recorded" else _slash_pool(recorded)
        spec = body.get("spec") or {}
        driver = spec.get("driver") if spec.get("driver") in DRIVERS else DRIVERS[0]
        results.append(send_both(name, body, real_gatekeeper.driver_api(driver), direct, DENIED))
    print(*(f"{r.name}: through {r.through[0]}, direct {r.direct[0]}" for r in results), sep="\n")
    assert len(results) >= 15
    assert [r.name for r in results if r.admission_refuses and not r.gatekeeper_refuses] == []
    assert [r.name for r in results if DENIED in r.through[1]] == []
    assert any(r.admission_refuses for r in results)
    both = [r.name for r in results if r.direct[0] == 201 and r.through[0] == 201]
    assert bool(both) is (pools != "as recorded"), both
