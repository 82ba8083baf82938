"""``audit generate`` then ``audit check`` on the same log: 0 changes (property test).

For the packaged default and each policy in ``policies/``, random traffic of two drivers goes
through a real gatekeeper (Unix sockets, the embedded API server) with that policy; the audit
events of each example are written as a log, ``audit generate --base <the policy>`` makes a
policy from it, and ``audit check --policy <generated>`` re-decides the same log: nothing may
change. The traffic holds every kind of the policy in every version it lists (objects built at
the version's own paths), this node's Node (rule OwnNode, the GET the DRA slice publisher makes)
and claims.
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
from tests.paths import REPO

ROOT = REPO
# The packaged default, and the policies of policies/ that build on it.
POLICIES = [
    ROOT / "gatekeeper" / "policies" / "default.yaml",
    *sorted(p for p in (ROOT / "policies").glob("*.yaml") if not p.stem.endswith("_test")),
]
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
    return (driver, *draw(_node_local(policy, driver)))


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
