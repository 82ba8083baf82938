"""Kinds and versions are policy data: a kind the code has never heard of, a ResourceSlice
version that does not exist yet, the five real slice versions, DevicePools and the fill option
all get the full enforcement from a policy file alone, end to end over real sockets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.codec.jsonpath import get_field, parse_field_path, set_field
from gatekeeper.policy import Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NIC, NODE, NODE_TOKEN, PKI, Running, running_gatekeeper

POLICY = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gpu.example.com, nic.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      - {names: [v1alpha2], driver: driverName, node: nodeName}
      - names: [v1alpha3, v1beta1, v1beta2, v1]
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
        forbidden: [spec.nodeSelector, spec.allNodes]
      - names: [v2]            # a version that does not exist yet, with its own layout
        driver: spec.owner.driver
        node: spec.owner.node
        pool: spec.owner.pool
        forbidden: [spec.everywhere]
        fieldSelectors: {driver: spec.owner.driver, node: spec.owner.node}
  - group: example.com         # a kind the code has never heard of
    resource: widgets
    kind: Widget
    scope: Namespaced
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    fill: [driver, node, pool]
    versions:
      - names: [v1]
        driver: spec.controller
        node: placement.host
        pool: placement.bucket
"""


@dataclass(frozen=True)
class Layout:
    """Where one version keeps driver, node and pool (pool None: the version has none)."""

    group_version: str
    resource: str
    kind: str
    driver: str
    node: str
    pool: str | None
    namespace: str = ""

    @property
    def collection(self) -> str:
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"/apis/{self.group_version}{ns}/{self.resource}"

    def pinned(self, driver: str = GPU, node: str = NODE) -> str:
        selector = f"{self.driver}={driver},{self.node}={node}"
        return f"{self.collection}?fieldSelector={quote(selector, safe='')}"

    def obj(
        self, name: str, driver: str = GPU, node: str = NODE, pool: str | None = "node-a/pool"
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": self.group_version,
            "kind": self.kind,
            "metadata": {"name": name},
        }
        if self.namespace:
            body["metadata"]["namespace"] = self.namespace
        pool_path = None if self.pool == "metadata.name" else self.pool  # the name is the pool
        for path, value in ((self.driver, driver), (self.node, node), (pool_path, pool)):
            if path is not None and value is not None:
                set_field(body, parse_field_path(path), value)
        return body


SPEC = ("spec.driver", "spec.nodeName", "spec.pool.name")
SLICE_VERSIONS = {
    "v1alpha2": Layout("resource.k8s.io/v1alpha2", "resourceslices", "ResourceSlice",
                       "driverName", "nodeName", None),
    **{v: Layout(f"resource.k8s.io/{v}", "resourceslices", "ResourceSlice", *SPEC)
       for v in ("v1alpha3", "v1beta1", "v1beta2", "v1")},
    "v2": Layout("resource.k8s.io/v2", "resourceslices", "ResourceSlice",
                 "spec.owner.driver", "spec.owner.node", "spec.owner.pool"),
}  # fmt: skip
WIDGETS = Layout(
    "example.com/v1", "widgets", "Widget", "spec.controller", "placement.host",
    "placement.bucket", namespace="team-a",
)  # fmt: skip
POOLS = Layout(
    "devmgmtproto.k8s.io/v1alpha1", "devicepools", "DevicePool", "spec.driver",
    "spec.nodeName", "metadata.name",
)  # fmt: skip


@dataclass
class Stack:
    apiserver: APIServer
    gatekeeper: Running


@pytest.fixture
def custom_policy(tmp_path: Path) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return load_policy(str(path))


async def start(policy: Policy, pki: PKI) -> AsyncIterator[Stack]:
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await apiserver.start()
    try:
        async with running_gatekeeper(apiserver, policy, pki) as gatekeeper:
            yield Stack(apiserver, gatekeeper)
    finally:
        await apiserver.close()


@pytest.fixture
async def custom(custom_policy: Policy, pki: PKI) -> AsyncIterator[Stack]:
    async for stack in start(custom_policy, pki):
        yield stack


@pytest.fixture
async def default(pki: PKI) -> AsyncIterator[Stack]:
    async for stack in start(load_policy(None).with_drivers(frozenset({GPU, NIC})), pki):
        yield stack


async def send(
    session: aiohttp.ClientSession, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    data = None if body is None else json.dumps(body)
    async with session.request(method, path, data=data, headers=headers) as response:
        return response.status, await response.json()


async def check_full_enforcement(stack: Stack, layout: Layout) -> None:
    """Every NodeLocal rule, allowed and refused, for one kind and version."""
    pool = layout.pool is not None
    name = NODE if layout.pool == "metadata.name" else "own"
    async with stack.gatekeeper.unix_session(GPU) as gpu:
        code, created = await send(gpu, "POST", layout.collection, layout.obj(name))
        assert code == 201, created
        own = f"{layout.collection}/{name}"
        refusals = [
            (layout.obj("x1", driver=NIC), f'{layout.driver} "{NIC}" does not match the calling'),
            (layout.obj("x2", node="node-b"), f'{layout.node} "node-b" does not match this node'),
        ]
        if pool and layout.pool != "metadata.name":
            refusals.append(
                (layout.obj("x3", pool="gpus"), f'{layout.pool} "gpus" is not prefixed by node')
            )
        if layout.pool == "metadata.name":
            refusals.append((layout.obj("gpus"), 'metadata.name "gpus" is not prefixed by node'))
        for body, message in refusals:
            code, status = await send(gpu, "POST", layout.collection, body)
            assert (code, message in status["message"]) == (403, True), (layout, status)
        assert (await send(gpu, "GET", layout.pinned()))[0] == 200
        code, status = await send(gpu, "GET", layout.collection)
        assert code == 403 and f"{layout.driver}={GPU}" in status["message"]
        code, status = await send(gpu, "GET", layout.pinned(node="node-b"))
        assert code == 403
        assert (await send(gpu, "GET", own))[0] == 200
        code, updated = await send(gpu, "PUT", own, created)
        assert code == 200, updated
        moved = layout.obj(name, node="node-b")
        moved["metadata"] = updated["metadata"]
        code, status = await send(gpu, "PUT", own, moved)
        assert code == 403 and "does not match this node" in status["message"]
    async with stack.gatekeeper.unix_session(NIC) as nic:
        code, status = await send(nic, "GET", own)
        assert code == 403 and "the stored object's" in status["message"]
        assert (await send(nic, "DELETE", own))[0] == 403
    async with stack.gatekeeper.unix_session(GPU) as gpu:
        assert (await send(gpu, "DELETE", own))[0] == 200
    writes = [e.method for e in stack.apiserver.journal if e.method != "GET"]
    assert writes == ["POST", "PUT", "DELETE"]  # refused writes never arrived


@pytest.mark.parametrize("version", list(SLICE_VERSIONS))
async def test_every_slice_version_from_a_policy_file(custom: Stack, version: str) -> None:
    await check_full_enforcement(custom, SLICE_VERSIONS[version])


@pytest.mark.parametrize("version", ["v1alpha2", "v1alpha3", "v1beta1", "v1beta2", "v1"])
async def test_every_slice_version_in_the_default_policy(default: Stack, version: str) -> None:
    await check_full_enforcement(default, SLICE_VERSIONS[version])


async def test_a_new_version_has_its_own_forbidden_fields(custom: Stack) -> None:
    layout = SLICE_VERSIONS["v2"]
    body = layout.obj("own")
    body["spec"]["everywhere"] = True
    async with custom.gatekeeper.unix_session(GPU) as gpu:
        code, status = await send(gpu, "POST", layout.collection, body)
    assert code == 403 and "spec.everywhere is set" in status["message"]
    v1 = SLICE_VERSIONS["v1"].obj("own")
    v1["spec"]["everywhere"] = True  # not a forbidden field of v1
    async with custom.gatekeeper.unix_session(GPU) as gpu:
        assert (await send(gpu, "POST", SLICE_VERSIONS["v1"].collection, v1))[0] == 201


async def test_a_kind_the_code_never_heard_of(custom: Stack) -> None:
    await check_full_enforcement(custom, WIDGETS)
    async with custom.gatekeeper.unix_session(GPU) as gpu:
        code, status = await send(gpu, "GET", "/apis/example.com/v1/widgets/w")
        assert code == 400 and "namespaced" in status["message"]
        discovery = await gpu.get("/apis/example.com/v1")
        assert discovery.status == 200


async def test_devicepools_in_the_default_policy(default: Stack) -> None:
    await check_full_enforcement(default, POOLS)
    generated = POOLS.obj("x")
    # Strict pool names: "node-a-<random>" may be another node's name, and a
    # DevicePool's name is its pool, so the default policy names a pool after its node only.
    generated["metadata"] = {"generateName": "node-a-"}
    async with default.gatekeeper.unix_session(GPU) as gpu:
        code, status = await send(gpu, "POST", POOLS.collection, generated)
        assert code == 403 and 'must start with node name "node-a" followed by "/"' in str(status)
        generated["metadata"] = {"generateName": "gpus-"}
        code, status = await send(gpu, "POST", POOLS.collection, generated)
        assert code == 403 and 'generateName "gpus-" must start with node name' in status["message"]


FILLS = [
    ("all-empty", {}, 201, None),
    ("driver-empty-string", {"driver": ""}, 201, None),
    ("wrong-driver-still-refused", {"driver": NIC}, 403, "does not match the calling driver"),
    ("wrong-node-still-refused", {"node": "node-b"}, 403, "does not match this node"),
    ("wrong-pool-still-refused", {"pool": "gpus"}, 403, "is not prefixed by node name"),
]


@pytest.mark.parametrize(
    ("given", "code", "message"), [c[1:] for c in FILLS], ids=[c[0] for c in FILLS]
)
async def test_fill_sets_empty_fields_only(
    custom: Stack, given: dict[str, str], code: int, message: str | None
) -> None:
    body = WIDGETS.obj("w", driver=given.get("driver"), node=given.get("node"),
                       pool=given.get("pool"))  # fmt: skip
    async with custom.gatekeeper.unix_session(GPU) as gpu:
        seen, answer = await send(gpu, "POST", WIDGETS.collection, body)
    assert seen == code, answer
    if message is not None:
        assert message in answer["message"]
        return
    stored = custom.apiserver.get("example.com", "widgets", "w", "team-a")
    assert stored is not None
    assert get_field(stored, ("spec", "controller")) == GPU
    assert get_field(stored, ("placement", "host")) == NODE
    assert get_field(stored, ("placement", "bucket")) == NODE  # pool = node name


async def test_fill_on_update_and_off_by_default(custom: Stack, default: Stack) -> None:
    async with custom.gatekeeper.unix_session(GPU) as gpu:
        code, created = await send(gpu, "POST", WIDGETS.collection, WIDGETS.obj("w"))
        assert code == 201
        del created["spec"]["controller"]
        code, updated = await send(gpu, "PUT", f"{WIDGETS.collection}/w", created)
        assert code == 200, updated
        assert updated["spec"]["controller"] == GPU
    empty = SLICE_VERSIONS["v1"].obj("s", driver="")
    async with default.gatekeeper.unix_session(GPU) as gpu:
        code, status = await send(gpu, "POST", SLICE_VERSIONS["v1"].collection, empty)
    assert (
        code == 403 and "spec.driver is empty: it must be the calling driver" in status["message"]
    )
