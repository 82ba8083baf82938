"""``audit generate`` then ``audit check`` on the same log: 0 changes.

For the packaged default and each policy in ``policies/``, random traffic of two drivers goes
through a real gatekeeper (Unix sockets, the embedded API server) with that policy; the audit
events of each example are written as a log, ``audit generate --base <the policy>`` makes a
policy from it, and ``audit check --policy <generated>`` re-decides the same log: nothing may
change. The traffic holds every kind of the policy in every version it lists (objects built at
the version's own paths), this node's Node (rule OwnNode, the GET the DRA slice publisher makes)
and claims (a property test). Every other rule of the language round-trips from the events of
the rules test file (tests/policy/rules/rules_test.yaml) and from a whole driver's kube-apiserver
log (tests/audit/driverday.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.audit.tools.reader import DRIVERS_GROUP
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import KindRule, KindSpec, Policy, Scope
from gatekeeper.policy.model import Field
from gatekeeper.policyfile import load_policy
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    RecordingSink,
    running_gatekeeper,
)
from tests.audit.driverday import write_driver_day
from tests.audit.logs import SA_GPU
from tests.audit.ruleslog import RULES_POLICY, rules_events
from tests.paths import REPO

ROOT = REPO
# The packaged default, the policies of policies/ that build on it, and the policy with every
# rule of the language.
POLICIES = [
    ROOT / "gatekeeper" / "policies" / "default.yaml",
    *sorted(p for p in (ROOT / "policies").glob("*.yaml") if not p.stem.endswith("_test")),
    RULES_POLICY,
]
# Rules beyond NodeLocal and AllocatedToDriver, drawn by _other_rule.
OTHER_RULES = frozenset(KindRule) - {KindRule.NODE_LOCAL, KindRule.ALLOCATED_TO_DRIVER}
DRIVERS = [GPU, NIC]
NAMES = ["a", "b"]
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _collection(kind: KindSpec, version: str) -> str:
    prefix = f"/apis/{kind.group}/{version}" if kind.group else f"/api/{version}"
    namespace = "/namespaces/default" if kind.scope is Scope.NAMESPACED else ""
    return f"{prefix}{namespace}/{kind.resource}"


def _set(obj: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    for step in path[:-1]:
        obj = obj.setdefault(step, {})
    obj[path[-1]] = value


def _pools(kind: KindSpec, name: str, by_name: bool) -> list[str]:
    """Pool names of this node the kind allows (and one it does not)."""
    pools = [NODE, "node-b"]
    if "-" in kind.pool_separators:
        pools.append(f"{NODE}-{name}")
    if "/" in kind.pool_separators and not by_name:
        pools.append(f"{NODE}/{name}")
    return pools


@st.composite
def _node_local(draw: st.DrawFn, policy: Policy, driver: str) -> tuple[str, str, Any]:
    kinds = [k for k in policy.kinds.values() if k.rule is KindRule.NODE_LOCAL]
    kind = draw(st.sampled_from(kinds))
    version = draw(st.sampled_from(sorted(kind.versions)))
    spec = kind.versions[version]
    collection = _collection(kind, version)
    paths = spec.paths
    by_name = paths.get(Field.POOL) == ("metadata", "name")
    name = draw(st.sampled_from(NAMES))
    pool = draw(st.sampled_from(_pools(kind, name, by_name)))
    name = pool if by_name else f"{NODE}-{name}"
    body: dict[str, Any] = {
        "apiVersion": f"{kind.group}/{version}" if kind.group else version,
        "kind": kind.kind,
        "metadata": {"name": name},
    }
    _set(body, paths[Field.DRIVER], draw(st.sampled_from([driver, driver, "other.example.com"])))
    _set(body, paths[Field.NODE], draw(st.sampled_from([NODE, NODE, "node-b"])))
    if Field.POOL in paths and not by_name:
        _set(body, paths[Field.POOL], pool)
    selector = ",".join(
        f"{spec.selectors[fld]}={value}"
        for fld, value in ((Field.DRIVER, driver), (Field.NODE, NODE))
    )
    verb = draw(st.sampled_from(["create", "get", "list", "update", "patch", "apply", "delete"]))
    if verb == "apply":  # server-side apply: creates a missing object
        return "PATCH", f"{collection}/{name}?fieldManager=driver", body
    if verb == "create":
        return "POST", collection, body
    if verb == "list":
        return "GET", f"{collection}?fieldSelector={quote(selector, safe='')}", None
    if verb == "update":
        return "PUT", f"{collection}/{name}", body
    if verb == "patch":
        return "PATCH", f"{collection}/{name}", {"metadata": {"labels": {"seen": "yes"}}}
    return ("GET" if verb == "get" else "DELETE"), f"{collection}/{name}", None


@st.composite
def requests(draw: st.DrawFn, policy: Policy) -> tuple[str, str, str, Any]:
    """(driver, method, target, body); most of them allowed."""
    driver = draw(st.sampled_from(DRIVERS))
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return driver, "GET", f"/api/v1/nodes/{NODE}", None  # OwnNode
    if choice == 1:
        return driver, "GET", draw(st.sampled_from(["/version", "/apis", "/api/v1/secrets"])), None
    if choice == 2:
        return driver, "GET", draw(st.sampled_from([CLAIMS, f"{CLAIMS}/mine"])), None
    others = _entries(policy, OTHER_RULES)
    if choice in (3, 4) and others:
        return (driver, *draw(_other_rule(others, driver)))
    return (driver, *draw(_node_local(policy, driver)))


def _entries(policy: Policy, rules: frozenset[KindRule]) -> list[KindSpec]:
    return [e for kind in policy.kinds.values() for e in kind.entries if e.rule in rules]


@st.composite
def _other_rule(draw: st.DrawFn, entries: list[KindSpec], driver: str) -> tuple[str, str, Any]:
    """A request for an entry under another rule: its own node's labels (in and out of
    mayChange), pods on this node or another, the driver's namespace or another, a CEL-scoped
    object of the driver's pools or not; an own pod or the driver's credentials (refused on a
    socket)."""
    entry = draw(st.sampled_from(entries))
    version = draw(st.sampled_from(sorted(entry.versions)))
    spec = entry.versions[version]
    namespace = draw(st.sampled_from(["gpu-system", "default"]))
    collection = _collection(entry, version).replace(
        "/namespaces/default/", f"/namespaces/{namespace}/"
    )
    verb = draw(st.sampled_from(sorted(entry.verbs | {"get"})))
    if entry.rule is KindRule.OWN_NODE:
        keys = [key.replace("*", "x") for item in spec.may_change for key in item.keys]
        key = draw(st.sampled_from([*keys, "kubernetes.io/hostname"]))
        target = f"{collection}/{draw(st.sampled_from([NODE, 'node-b']))}"
        if verb in ("patch", "update"):
            return "PATCH", target, {"metadata": {"labels": {key: "v"}}}
        return "GET", target, None
    if entry.rule is KindRule.ON_NODE:
        node = draw(st.sampled_from([NODE, "node-b", ""]))
        if verb in ("list", "watch"):
            everywhere = _collection(entry, version).replace("/namespaces/default", "")
            pinned = f"?fieldSelector={spec.selectors[Field.NODE]}%3D{node}" if node else ""
            return "GET", f"{everywhere}{pinned}", None
        return "GET", f"{_collection(entry, version)}/{'pod-b' if node else 'pod-a'}", None
    body: dict[str, Any] = {
        "apiVersion": f"{entry.group}/{version}" if entry.group else version,
        "kind": entry.kind,
        "metadata": {"name": draw(st.sampled_from(NAMES))},
        "reportingComponent": draw(st.sampled_from([driver, "kubelet"])),
        "spec": {
            "deviceSelector": {
                "driver": draw(st.sampled_from([driver, "other.example.com"])),
                "pool": draw(st.sampled_from([f"{NODE}/gpus", "node-b/gpus"])),
            },
            "taint": {"key": "k", "effect": draw(st.sampled_from(["NoExecute", "Evict"]))},
        },
    }
    name = body["metadata"]["name"]
    if verb == "create":
        return "POST", collection, body
    if verb in ("list", "watch", "deletecollection"):
        return ("DELETE" if verb == "deletecollection" else "GET"), collection, None
    if verb in ("update", "patch"):
        return "PATCH", f"{collection}/{name}", {"metadata": {"labels": {"seen": "yes"}}}
    return ("DELETE" if verb == "delete" else "GET"), f"{collection}/{name}", None


async def _send(session: aiohttp.ClientSession, method: str, target: str, body: Any) -> int:
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
        if method == "PATCH":
            apply = "fieldManager=" in target
            headers["Content-Type"] = (
                f"application/{'apply-patch+yaml' if apply else 'merge-patch+json'}"
            )
    if method == "PUT" and body is not None:
        # An update carries the stored resourceVersion, as a client that read it first.
        async with session.get(target) as current:
            if current.status == 200:
                version = (await current.json())["metadata"]["resourceVersion"]
                body = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
                data = json.dumps(body).encode()
    async with session.request(method, target, data=data, headers=headers) as response:
        await response.read()
        return response.status


def _audit(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = run_audit_command(args)
    return code, out.getvalue()


def _allowed_resource_requests(events: list[dict[str, Any]]) -> int:
    return sum(
        1
        for e in events
        if e["stage"] == "ResponseComplete"
        and e["annotations"].get("authorization.k8s.io/decision") == "allow"
        and DRIVERS_GROUP in e["user"]["groups"]
        and e.get("objectRef", {}).get("resource")
    )


def _claim(name: str, driver: str) -> dict[str, Any]:
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    result = {"request": "r", "driver": driver, "pool": NODE, "device": "dev-0"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r"}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [selector]},
            }
        },
    }


@pytest.mark.parametrize("policy_path", POLICIES, ids=[p.name for p in POLICIES])
def test_generate_then_check_the_same_log_changes_nothing(
    policy_path: Path, pki: PKI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    policy = load_policy(str(policy_path)).with_drivers(frozenset(DRIVERS))
    loop = asyncio.new_event_loop()
    sink = RecordingSink()

    async def start() -> tuple[APIServer, Any, dict[str, aiohttp.ClientSession]]:
        apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
        await apiserver.start()
        context = running_gatekeeper(
            apiserver,
            policy,
            pki,
            audit_sink=sink,
            audit=AuditSettings(level=AuditLevel.REQUEST_RESPONSE),
        )
        running = await context.__aenter__()
        return apiserver, context, {d: running.unix_session(d) for d in DRIVERS}

    apiserver, context, sessions = loop.run_until_complete(start())
    checked: list[int] = []

    @settings(max_examples=settings().max_examples // 2)
    @given(st.lists(requests(policy), min_size=1, max_size=8))
    def run(sequence: list[tuple[str, str, str, Any]]) -> None:
        # Each example is a whole history: its log knows every object it touches.
        apiserver.reset()
        apiserver.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        apiserver.add(_claim("mine", GPU))
        if policy.kind_for("", "pods") is not None:
            for name, on in (("pod-a", NODE), ("pod-b", "node-b")):
                meta = {"name": name, "namespace": "default"}
                apiserver.add({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                               "spec": {"nodeName": on}})  # fmt: skip
        first = len(sink.events)
        for driver, method, target, body in sequence:
            status = loop.run_until_complete(_send(sessions[driver], method, target, body))
            note(f"{driver} {method} {target} -> {status}")
        events = sink.events[first:]
        directory = tmp_path_factory.mktemp("log")
        log, generated = directory / "audit.log", directory / "generated.yaml"
        log.write_text("".join(json.dumps(e) + "\n" for e in events))
        code, out = _audit(["generate", "--base", str(policy_path), "-o", str(generated), str(log)])
        if not _allowed_resource_requests(events):
            assert code == 3 and not generated.exists(), out  # nothing a policy can allow
            return
        assert code == 0, out
        note(generated.read_text())
        code, out = _audit(["check", "--policy", str(generated), str(log)])
        assert code == 0, out
        assert " 0 changed: 0 newly refused, 0 newly allowed" in out, out
        checked.append(len(events))

    try:
        run()
        assert len(checked) >= 5, "the property was checked on real traffic"
    finally:

        async def stop() -> None:
            for session in sessions.values():
                await session.close()
            await context.__aexit__(None, None, None)
            await apiserver.close()

        loop.run_until_complete(stop())
        loop.close()


# --- Every rule of the language: the rules test file's events, and a kube-apiserver log --------


def _write_log(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _round_trip(
    log: Path, base: Path | None = None, users: tuple[str, ...] = ()
) -> tuple[str, str]:
    """``generate`` then ``check`` on ``log``: the generated policy, and check's report."""
    generated = log.with_name("generated.yaml")
    mapped = [item for user in users for item in ("--driver-user", user)]
    based = ["--base", str(base)] if base else []
    code, out = _audit(["generate", *based, *mapped, "-o", str(generated), str(log)])
    assert code == 0, out
    code, report = _audit(["check", "--policy", str(generated), *mapped, str(log)])
    assert code == 0, report
    return generated.read_text(), report


@pytest.mark.parametrize("level", list(AuditLevel), ids=[level.value for level in AuditLevel])
async def test_every_rule_round_trips_from_the_gatekeepers_log(
    level: AuditLevel, tmp_path: Path
) -> None:
    """Generated with the policy the log was recorded under as the base: nothing changes, at
    every audit level (OwnNode and OwnPod with mayChange, OnNode, DriverNamespace with its
    validation, CEL with its scope and validation, DriverCredentials, the default's kinds)."""
    log = _write_log(tmp_path / "audit.log", await rules_events(level))
    text, report = _round_trip(log, RULES_POLICY)
    assert " 0 changed: 0 newly refused, 0 newly allowed" in report, report
    generated = load_policy(str(log.with_name("generated.yaml")))
    rules = {entry.rule for kind in generated.kinds.values() for entry in kind.entries}
    assert {KindRule.OWN_NODE, KindRule.OWN_POD, KindRule.ON_NODE, KindRule.DRIVER_NAMESPACE,
            KindRule.CEL, KindRule.DRIVER_CREDENTIALS} <= rules, text  # fmt: skip


async def test_without_the_recording_policy_only_what_a_log_cannot_show_changes(
    tmp_path: Path,
) -> None:
    """With the packaged default as the base (it knows none of these kinds), the rules are
    inferred from the log. What changes is what no log shows: two CEL validations that refused
    (an event's reportingComponent, a taint's effect), and a lease whose namespace only the
    recording policy's serviceAccounts named for a driver on a socket."""
    log = _write_log(tmp_path / "audit.log", await rules_events(AuditLevel.REQUEST_RESPONSE))
    generated = tmp_path / "generated.yaml"
    code, out = _audit(["generate", "-o", str(generated), str(log)])
    assert code == 0, out
    code, report = _audit(["check", "--policy", str(generated), str(log)])
    changed = sorted(line.split("  ")[0] + " " + line.split("  ")[3] for line in
                     report.splitlines() if " -> " in line)  # fmt: skip
    assert changed == [
        "ALLOW -> FORBID create /apis/coordination.k8s.io/v1/namespaces/gpu-system/leases",
        "FORBID -> ALLOW create /api/v1/namespaces/gpu-system/events",
        "FORBID -> ALLOW create /apis/resource.k8s.io/v1beta2/devicetaintrules",
    ], report
    assert code == 1


@pytest.mark.parametrize("level", ["Metadata", "Request", "RequestResponse"])
def test_a_whole_drivers_kube_apiserver_log_round_trips(level: str, tmp_path: Path) -> None:
    """Before the gatekeeper: every call a GPU kubelet plugin makes from its node, as the
    kube-apiserver logs its ServiceAccount. The generated policy allows each of them again."""
    log = write_driver_day(tmp_path / "kube-audit.log", level)
    text, report = _round_trip(log, users=(f"{SA_GPU}={GPU}",))
    assert " 0 changed: 0 newly refused, 0 newly allowed" in report, report
    policy = load_policy(str(log.with_name("generated.yaml")))
    rules = {
        (kind.qualified, entry.rule.value): sorted(entry.verbs)
        for kind in policy.kinds.values()
        for entry in kind.entries
    }
    expected = {
        ("nodes", "OwnNode"): ["get", "patch"],
        ("pods", "OwnPod"): ["patch"],
        ("pods", "OnNode"): ["get", "list", "watch"],
        ("events", "DriverNamespace"): ["create"],
        ("leases.coordination.k8s.io", "DriverNamespace"): ["create", "get", "update"],
        ("deployments.apps", "DriverNamespace"): ["create"],
        ("computedomains.resource.nvidia.com", "DriverCredentials"): ["update", "watch"],
        ("resourceslices.resource.k8s.io", "NodeLocal"): ["create", "list"],
        ("resourceclaims.resource.k8s.io", "AllocatedToDriver"): ["get"],
    }
    # Without objects (Metadata) no field locates a taint rule's driver and pool: forwarded under
    # the driver's own token, and said so.
    taints = "DriverCredentials" if level == "Metadata" else "CEL"
    expected[("devicetaintrules.resource.k8s.io", taints)] = ["create", "delete", "get", "list"]
    assert rules == expected, text
    assert policy.service_accounts == {SA_GPU: GPU}
    may_change = policy.kinds["", "nodes"].for_verb("patch").versions["v1"].may_change
    keys = {key for entry in may_change for key in entry.keys}
    if level == "Metadata":
        assert keys == {f"{GPU}/*"} and "mayChange must be written" in text
    else:
        assert keys == {"nvidia.com/gpu.clique", "resource.nvidia.com/computeDomain"}
