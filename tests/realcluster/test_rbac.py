"""RBAC from the policy: the ClusterRole ``dra-gatekeeper policy rbac`` prints is exactly enough.

A gatekeeper of its own (its own service account, bound to its own copy of the ClusterRole)
runs the representative set of ``requestset``:

- with the role as printed, nothing it sends gets a 403 from the real apiserver (nor the 422
  of the ``resourceclaims/driver`` check), as the drivers see it and as the apiserver logged it;
- with any one rule, verb, resource name or non-resource URL taken out, the apiserver refuses
  at least one request of the set for exactly that permission.

The apiserver's default ``system:discovery`` and ``system:public-info-viewer`` bindings grant
every authenticated user the discovery paths, which would hide the role's own
``nonResourceURLs`` rule (needed where an operator has narrowed those bindings); this module
runs with them unbound from ``system:authenticated`` and binds them back afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.realcluster.admission import install_admission
from tests.realcluster.cluster import Api, RealCluster, poll
from tests.realcluster.conftest import DEFAULT_POLICY, DRIVERS
from tests.realcluster.objects import GATEKEEPER_NS, bound_token, ensure, rbac_objects
from tests.realcluster.processes import GatekeeperProcess, assert_refusals_never_reached
from tests.realcluster.requestset import (
    Outcome,
    apiserver_events_since,
    apiserver_offset,
    run_set,
)

SA = "gk-rbac"
USER = f"system:serviceaccount:{GATEKEEPER_NS}:{SA}"
GROUPS = [
    "system:serviceaccounts",
    f"system:serviceaccounts:{GATEKEEPER_NS}",
    "system:authenticated",
]
ROLE = "dra-gatekeeper-rbac-test"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
DEFAULT_DISCOVERY_BINDINGS = ("system:discovery", "system:public-info-viewer")
OPEN_GROUPS = {"system:authenticated", "system:unauthenticated"}
# A concrete path for each nonResourceURLs pattern (what the set requests under it).
CONCRETE = {"/api/*": "/api/v1", "/apis/*": "/apis/resource.k8s.io", "/openapi/*": "/openapi/v3"}

_ROLE = rbac_objects(DEFAULT_POLICY, DRIVERS)
RULES: list[dict[str, Any]] = _ROLE["rules"]


# --- one permission taken out -------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """One piece of the role taken out: a whole rule, or one verb, resource name or URL of it."""

    index: int
    verb: str | None = None
    name: str | None = None
    url: str | None = None

    @property
    def rule(self) -> dict[str, Any]:
        return RULES[self.index]

    @property
    def id(self) -> str:
        rule = self.rule
        what = rule.get("resources", ["nonResourceURLs"])[0]
        piece = self.verb or self.name or self.url
        return f"{what}:{piece}" if piece else f"{what}:rule"

    def rules(self) -> list[dict[str, Any]]:
        rules = copy.deepcopy(RULES)
        rule = rules[self.index]
        for key, value in (("verbs", self.verb), ("resourceNames", self.name)):
            if value is not None:
                rule[key].remove(value)
        if self.url is not None:
            rule["nonResourceURLs"].remove(self.url)
        if not (self.verb or self.name or self.url):
            del rules[self.index]
        return rules

    def review(self) -> dict[str, Any]:
        """A SubjectAccessReview spec the removal turns from allowed to denied."""
        rule = self.rule
        spec: dict[str, Any] = {"user": USER, "groups": GROUPS}
        if "nonResourceURLs" in rule:
            url = self.url or rule["nonResourceURLs"][0]
            spec["nonResourceAttributes"] = {"path": CONCRETE.get(url, url), "verb": "get"}
            return spec
        resource, _, subresource = rule["resources"][0].partition("/")
        names = rule.get("resourceNames") or [""]
        spec["resourceAttributes"] = {
            "group": rule["apiGroups"][0],
            "resource": resource,
            "subresource": subresource,
            "verb": self.verb or rule["verbs"][0],
            "name": self.name or names[0],
            "namespace": "tenant",
        }
        return spec

    def refused(self, event: dict[str, Any]) -> bool:
        """Whether the apiserver's audit ``event`` is its refusal of what this removal took."""
        rule, code = self.rule, event["responseStatus"]["code"]
        if "nonResourceURLs" in rule:
            path = event["requestURI"].split("?")[0]
            urls = [self.url] if self.url else rule["nonResourceURLs"]
            return code == 403 and any(_url_matches(u, path) for u in urls)
        ref = event.get("objectRef") or {}
        resource, _, subresource = rule["resources"][0].partition("/")
        verbs = [self.verb] if self.verb else rule["verbs"]
        if subresource == "driver":
            # Not an endpoint: the apiserver checks it inside a claim status write and answers
            # 422 naming the verb and the driver (the resource name of the check).
            message = str((event.get("responseObject") or {}).get("message", ""))
            names = [self.name] if self.name else rule.get("resourceNames", [])
            return (
                code == 422
                and ref.get("subresource") == "status"
                and any(f"associated-node:{event['verb']}" == v for v in verbs)
                and 'resource="resourceclaims/driver"' in message
                and any(f'"{name}" is forbidden' in message for name in names)
            )
        return (
            code == 403
            and ref.get("apiGroup", "") == rule["apiGroups"][0]
            and ref.get("resource") == resource
            and ref.get("subresource", "") == subresource
            and event["verb"] in verbs
        )


def _url_matches(pattern: str, path: str) -> bool:
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


def removals() -> list[Removal]:
    found: list[Removal] = []
    for index, rule in enumerate(RULES):
        found.append(Removal(index))
        if len(rule["verbs"]) > 1:
            found += [Removal(index, verb=v) for v in rule["verbs"]]
        if len(rule.get("resourceNames", [])) > 1:
            found += [Removal(index, name=n) for n in rule["resourceNames"]]
        if len(rule.get("nonResourceURLs", [])) > 1:
            found += [Removal(index, url=u) for u in rule["nonResourceURLs"]]
    return found


REMOVALS = removals()


# --- the module's cluster state -------------------------------------------------------------------


def _put(admin: Api, path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Read-modify-write of an RBAC object as the admin."""
    current = admin.get(path)
    change(current)
    admin.call("PUT", path, current)


def _allowed(admin: Api, spec: dict[str, Any]) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    answer = admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def _set_subjects(admin: Api, name: str, subjects: list[dict[str, Any]]) -> None:
    _put(admin, f"{RBAC}/clusterrolebindings/{name}", lambda b: b.update(subjects=subjects))


def _set_rules(admin: Api, rules: list[dict[str, Any]]) -> None:
    _put(admin, f"{RBAC}/clusterroles/{ROLE}", lambda r: r.update(rules=rules))


@pytest.fixture(scope="module")
def hardened(real_cluster: RealCluster) -> Iterator[None]:
    """The default discovery bindings without ``system:authenticated``/``unauthenticated``."""
    admin = real_cluster.admin
    saved = {
        name: admin.get(f"{RBAC}/clusterrolebindings/{name}").get("subjects", [])
        for name in DEFAULT_DISCOVERY_BINDINGS
    }
    # Anyone authenticated, with no role of its own: what the default bindings alone grant.
    anyone = {
        "user": "system:serviceaccount:default:nobody",
        "groups": ["system:authenticated"],
        "nonResourceAttributes": {"path": "/version", "verb": "get"},
    }
    try:
        for name, subjects in saved.items():
            _set_subjects(admin, name, [s for s in subjects if s["name"] not in OPEN_GROUPS])
        poll("the default discovery bindings to stop applying", lambda: not _allowed(admin, anyone))
        yield
    finally:
        for name, subjects in saved.items():
            _set_subjects(admin, name, subjects)
        poll("the default discovery bindings to apply again", lambda: _allowed(admin, anyone))


@pytest.fixture(scope="module")
def rbac_gatekeeper(real_cluster: RealCluster, hardened: None) -> Iterator[GatekeeperProcess]:
    """A gatekeeper of node-a whose service account has only its own copy of the role, so that
    taking pieces out of it touches no other test."""
    admin = real_cluster.admin
    role = {**copy.deepcopy(_ROLE), "metadata": {"name": ROLE}}
    ensure(admin, f"{RBAC}/clusterroles", role)
    _set_rules(admin, RULES)
    ensure(
        admin,
        f"{RBAC}/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": GATEKEEPER_NS}],
        },
    )
    # Under its own export of the admission policy, as every gatekeeper of the tier.
    install_admission(
        real_cluster, DEFAULT_POLICY, DRIVERS, service_account=SA, name="dra-gatekeeper-rbac"
    )
    token, _ = bound_token(real_cluster, GATEKEEPER_NS, SA, "node-a")
    token_file = real_cluster.workdir / f"{SA}.token"
    token_file.write_text(token)
    process = GatekeeperProcess(real_cluster, DEFAULT_POLICY, DRIVERS, token_file).start()
    try:
        poll("the role to apply", lambda: all(_allowed(admin, r.review()) for r in REMOVALS))
        yield process
    finally:
        process.stop()


@pytest.fixture
def private_journal(
    real_cluster: RealCluster, rbac_gatekeeper: GatekeeperProcess
) -> Iterator[GatekeeperProcess]:
    """The ``journal`` check for this module's own gatekeeper."""
    mark = rbac_gatekeeper.audit_mark()
    yield rbac_gatekeeper
    assert_refusals_never_reached(real_cluster, rbac_gatekeeper, mark)


def _refused_by_apiserver(cluster: RealCluster, offset: int) -> list[dict[str, Any]]:
    """What the apiserver refused the gatekeeper's account since ``offset``: 403s, and the 422
    of a claim status write whose ``resourceclaims/driver`` check failed."""
    return [
        e
        for e in apiserver_events_since(cluster, offset)
        if e["user"]["username"] == USER and e["responseStatus"]["code"] in (403, 422)
    ]


def _summary(outcomes: list[Outcome]) -> list[str]:
    return [f"{o.label}: {o.got} (want {o.want}) {o.message}" for o in outcomes if not o.ok]


def test_role_is_enough(
    real_cluster: RealCluster, private_journal: GatekeeperProcess, journal: None, clean: None
) -> None:
    gatekeeper = private_journal
    offset, mark = apiserver_offset(real_cluster), gatekeeper.audit_mark()
    outcomes = run_set(real_cluster, gatekeeper)
    assert _summary(outcomes) == []
    assert _refused_by_apiserver(real_cluster, offset) == []
    # Every request the gatekeeper forwarded, as the apiserver logged it under the Audit-ID the
    # gatekeeper sent: none refused.
    gatekeeper.settle()
    forwarded = {
        e["annotations"]["dra-gatekeeper.io/upstream-audit-id"]: e
        for e in gatekeeper.audit_events()[mark:]
        if "dra-gatekeeper.io/upstream-audit-id" in e["annotations"]
    }
    logged = poll(
        "the apiserver to log every forwarded request",
        lambda: (
            found
            if set(found := {e["auditID"]: e for e in apiserver_events_since(real_cluster, offset)})
            >= set(forwarded)
            else None
        ),
        timeout=10,
    )
    codes = {logged[i]["responseStatus"]["code"] for i in forwarded}
    assert forwarded, "the set must reach the apiserver"
    assert codes <= {200, 201}, codes


@pytest.mark.parametrize("removal", REMOVALS, ids=[r.id for r in REMOVALS])
def test_each_permission_is_needed(
    removal: Removal,
    real_cluster: RealCluster,
    private_journal: GatekeeperProcess,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    review = removal.review()
    _set_rules(admin, removal.rules())
    try:
        poll(f"{removal.id} to be taken out", lambda: not _allowed(admin, review))
        offset = apiserver_offset(real_cluster)
        outcomes = run_set(real_cluster, private_journal)
        refused = poll(
            "the apiserver's refusal in its log",
            lambda: (
                [e for e in _refused_by_apiserver(real_cluster, offset) if removal.refused(e)]
                or None
            ),
            timeout=10,
        )
    finally:
        _set_rules(admin, RULES)
        poll(f"{removal.id} to be back", lambda: _allowed(admin, review))
    assert refused
    assert _summary(outcomes), "a driver must see the failure"
