"""End to end, the gatekeeper forwards exactly what the apiserver would act on.

Through a running gatekeeper in front of the embedded API server (faithful to recordings
148-205): delete options, deletecollection bodies, server-side apply (kubectl), reads of the
node's own Node, a get answered from the object checked, and 405 for a POST to a named path.
Each test names the recording it follows and fails on a gatekeeper that does not follow it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    InterleavedUpstream,
    Kubectl,
    Running,
    running_gatekeeper,
    slice_manifest,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from tests.recorded import recording

GROUP = "resource.k8s.io"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
SELECTOR = f"fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}"
NAME = "node-a-gpu-0"
APPLY = "application/apply-patch+yaml"


def stored(apiserver: APIServer, name: str = NAME) -> dict[str, Any] | None:
    return apiserver.get(GROUP, "resourceslices", name)


def upstream_writes(apiserver: APIServer, since: int = 0) -> list[tuple[str, str, bytes]]:
    return [(e.method, e.path, e.body) for e in apiserver.journal[since:] if e.method != "GET"]


async def send(
    gatekeeper: Running,
    method: str,
    target: str,
    body: Any = None,
    *,
    media_type: str = "application/json",
    accept: str = "application/json",
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    headers = {"Accept": accept}
    if data is not None:
        headers["Content-Type"] = media_type
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.request(method, target, data=data, headers=headers)
        return response.status, await response.json(content_type=None)


# --- 1: delete options (recordings 148-160) ---------------------------------------------------


async def test_a_dry_run_delete_keeps_the_object(gatekeeper: Running, apiserver: APIServer) -> None:
    """149: with a body the apiserver ignores ``?dryRun=All``; the gatekeeper's body carries it."""
    apiserver.add(slice_manifest(NAME))
    status, answer = await send(gatekeeper, "DELETE", f"{SLICES}/{NAME}?dryRun=All")
    assert status == 200, answer
    assert stored(apiserver) is not None, "a dry-run delete must not delete"
    ((_, _, body),) = upstream_writes(apiserver)
    assert json.loads(body)["dryRun"] == ["All"]
    status, answer = await send(gatekeeper, "DELETE", f"{SLICES}/{NAME}", {"dryRun": ["All"]})
    assert status == 200 and stored(apiserver) is not None


async def test_query_delete_options_reach_the_apiserver(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """157-158: ``?propagationPolicy=Orphan`` without a body sets the orphan finalizer and the
    object stays; the gatekeeper's preconditions body must carry it along."""
    apiserver.add(slice_manifest(NAME))
    target = f"{SLICES}/{NAME}?propagationPolicy=Orphan&gracePeriodSeconds=0"
    status, answer = await send(gatekeeper, "DELETE", target)
    assert status == 200, answer
    left = stored(apiserver)
    assert left is not None and left["metadata"]["finalizers"] == ["orphan"]
    ((_, _, body),) = upstream_writes(apiserver)
    sent = json.loads(body)
    assert sent["propagationPolicy"] == "Orphan" and sent["gracePeriodSeconds"] == 0
    assert set(sent["preconditions"]) == {"uid", "resourceVersion"}


async def test_delete_options_body_is_checked(gatekeeper: Running, apiserver: APIServer) -> None:
    apiserver.add(slice_manifest(NAME))
    status, answer = await send(gatekeeper, "DELETE", f"{SLICES}/{NAME}", {"dryrun": ["All"]})
    assert status == 400 and 'DeleteOptions has no field "dryrun"' in answer["message"]
    wrong = {"preconditions": {"uid": "not-the-uid"}}
    status, answer = await send(gatekeeper, "DELETE", f"{SLICES}/{NAME}", wrong)
    assert status == 409 and "Precondition failed: UID" in answer["message"]
    assert upstream_writes(apiserver) == [] and stored(apiserver) is not None


# --- 2: deletecollection bodies (recordings 161-166) ------------------------------------------


async def test_a_dry_run_deletecollection_keeps_the_slices(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """163-164: client-go sends its DeleteOptions as a body; forwarded, the dry run holds."""
    apiserver.add(slice_manifest("node-a-gpu-0"))
    apiserver.add(slice_manifest("node-a-gpu-1"))
    body = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]}
    status, answer = await send(gatekeeper, "DELETE", f"{SLICES}?{SELECTOR}", body)
    assert status == 200, answer
    assert [item["metadata"]["name"] for item in answer["items"]] == [
        "node-a-gpu-0",
        "node-a-gpu-1",
    ]
    assert stored(apiserver, "node-a-gpu-0") and stored(apiserver, "node-a-gpu-1")
    ((method, _, sent),) = upstream_writes(apiserver)
    assert method == "DELETE" and json.loads(sent) == body


async def test_a_deletecollection_body_that_is_no_delete_options_is_400(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    apiserver.add(slice_manifest("node-a-gpu-0"))
    for body in ({"kind": "ResourceSlice"}, {"dryRun": "All"}, {"orphan": True}):
        status, answer = await send(gatekeeper, "DELETE", f"{SLICES}?{SELECTOR}", body)
        assert status == 400, (body, answer)
    assert upstream_writes(apiserver) == [] and stored(apiserver, "node-a-gpu-0")


# --- 3: server-side apply (recordings 167-177) ------------------------------------------------


def _apply_manifest(model: str) -> str:
    manifest = slice_manifest(NAME)
    manifest["spec"]["devices"] = [{"name": "gpu-0", "attributes": {"model": {"string": model}}}]
    return yaml.safe_dump(manifest)


@pytest.mark.kubectl
async def test_kubectl_applies_again_and_again(kubectl: Kubectl, apiserver: APIServer) -> None:
    """167-168 vs 169-170: an apply-create forwarded as a create leaves the fields to an Update
    manager, and the next apply that changes a value is a 409 conflict with "kubectl"."""
    for model in ("A100", "H100", "B200"):
        code, out, err = await kubectl(
            "apply", "--server-side", "-f", "-", stdin=_apply_manifest(model)
        )
        assert code == 0, err
        assert "serverside-applied" in out
        obj = stored(apiserver)
        assert obj is not None
        assert obj["spec"]["devices"][0]["attributes"]["model"] == {"string": model}
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert managers == {("kubectl", "Apply")}


def _pool(name: str, driver: str = GPU) -> dict[str, Any]:
    return {
        "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
        "kind": "DevicePool",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": NODE},
    }


async def test_an_apply_create_of_a_kind_without_immutable_owners_is_a_create(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """The DevicePool CRD declares no ``immutable``: its apply-create stays a POST."""
    target = f"{POOLS}/{NODE}?fieldManager=gpu-driver"
    status, answer = await send(gatekeeper, "PATCH", target, _pool(NODE), media_type=APPLY)
    assert status == 201, answer
    assert [(m, p) for m, p, _ in upstream_writes(apiserver)] == [("POST", POOLS)]


class _CreatesInBetween(InterleavedUpstream):
    """Another driver creates ``obj`` right after the gatekeeper's read of the name (when the
    read found nothing)."""

    def __init__(self, apiserver: APIServer, obj: dict[str, Any]) -> None:
        config = UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)
        super().__init__(config, after_read=self._after)
        self.apiserver, self.obj = apiserver, obj

    def _after(self, path: str) -> None:
        group, resource = self.obj["apiVersion"].rpartition("/")[0], path.split("/")[-2]
        if self.apiserver.get(group, resource, self.obj["metadata"]["name"]) is None:
            self.apiserver.add(self.obj)


async def test_the_apply_create_race_stays_closed_for_both_kinds(
    apiserver: APIServer, policy: Any, pki: PKI
) -> None:
    """The slice apply lands on the NIC driver's slice: the apiserver refuses to change its
    driver (422; recordings 171-173). The DevicePool create finds the name taken (409)."""
    theirs = slice_manifest(NAME, driver=NIC)
    upstream = _CreatesInBetween(apiserver, theirs)
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        target = f"{SLICES}/{NAME}?fieldManager=gpu-driver&force=true"
        status, answer = await send(
            running, "PATCH", target, slice_manifest(NAME), media_type=APPLY
        )
    assert status == 422 and "field is immutable" in answer["message"], answer
    assert stored(apiserver)["spec"]["driver"] == NIC  # type: ignore[index]

    upstream = _CreatesInBetween(apiserver, _pool(NODE, driver=NIC))
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        target = f"{POOLS}/{NODE}?fieldManager=gpu-driver&force=true"
        status, answer = await send(running, "PATCH", target, _pool(NODE), media_type=APPLY)
    assert status == 409 and answer["reason"] == "AlreadyExists", answer
    pool = apiserver.get("devmgmtproto.k8s.io", "devicepools", NODE)
    assert pool is not None and pool["spec"]["driver"] == NIC


# --- 6: the node's own Node (recordings 197-198) ----------------------------------------------


async def test_a_driver_reads_its_own_node_and_nothing_else(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    for name in (NODE, "node-b"):
        apiserver.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    status, node = await send(gatekeeper, "GET", f"/api/v1/nodes/{NODE}")
    assert status == 200, node
    assert node == apiserver.get("", "nodes", NODE)
    since = len(apiserver.journal)
    for target in ("/api/v1/nodes/node-b", "/api/v1/nodes", "/api/v1/nodes?watch=true"):
        status, answer = await send(gatekeeper, "GET", target)
        assert status == 403, (target, answer)
    merge = "application/merge-patch+json"
    patch = {"metadata": {"labels": {"x": "y"}}}
    status, answer = await send(
        gatekeeper, "PATCH", f"/api/v1/nodes/{NODE}", patch, media_type=merge
    )
    assert status == 403
    assert apiserver.journal[since:] == [], "refusals never reach the apiserver"


# --- 7: a get answered from the object checked -------------------------------------------------


class _ReplacesAfterRead(InterleavedUpstream):
    """Another driver deletes the object and creates its own under the name, right after the
    gatekeeper's read of it."""

    def __init__(self, apiserver: APIServer) -> None:
        config = UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)
        super().__init__(config, after_read=self._after)
        self.apiserver = apiserver

    def _after(self, path: str) -> None:
        current = self.apiserver.get(GROUP, "resourceslices", NAME)
        if current is not None and current["spec"]["driver"] == GPU:
            self.apiserver.store.delete((GROUP, "resourceslices"), ("", NAME))
            self.apiserver.add(slice_manifest(NAME, driver=NIC))


async def test_a_plain_json_get_is_answered_from_the_object_checked(
    apiserver: APIServer, policy: Any, pki: PKI
) -> None:
    mine = apiserver.add(slice_manifest(NAME))
    async with running_gatekeeper(
        apiserver, policy, pki, upstream=_ReplacesAfterRead(apiserver)
    ) as running:
        since = len(apiserver.journal)
        status, answer = await send(
            running, "GET", f"{SLICES}/{NAME}", accept="application/json, */*"
        )
    assert status == 200
    assert answer == mine, "the NIC driver's object, read after the check, must not reach GPU"
    assert [e.path for e in apiserver.journal[since:]] == [f"{SLICES}/{NAME}"], "one read"


async def test_a_negotiated_get_is_forwarded(gatekeeper: Running, apiserver: APIServer) -> None:
    apiserver.add(slice_manifest(NAME))
    table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    since = len(apiserver.journal)
    status, answer = await send(gatekeeper, "GET", f"{SLICES}/{NAME}", accept=table)
    assert status == 200 and answer["kind"] == "Table"
    accepts = [e.headers.get("Accept") for e in apiserver.journal[since:]]
    assert accepts == ["application/json", table], "checked on JSON, answered as negotiated"


# --- 8: POST to a named path (recording 199) ---------------------------------------------------


async def test_a_post_to_a_named_path_is_405_as_the_apiserver_says(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    recorded = recording(199)
    status, answer = await send(gatekeeper, "POST", f"{SLICES}/rec2-x", slice_manifest("rec2-x"))
    assert (status, answer) == (recorded["status"], recorded["response_body"])
    assert apiserver.journal == []
