"""A representative set of driver requests through a gatekeeper: every verb, subresource and
discovery path the default policy forwards, so that every permission of the ClusterRole
``dra-gatekeeper policy rbac`` prints is used by at least one request of the set.

``run_set`` resets its objects as an admin (the allocated claim included, as the scheduler
would write it), runs the set as the drivers and returns what each request got; it never raises
on a refusal, so a set run under a reduced ClusterRole reports what broke.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.realcluster.cluster import Api, ApiError, RealCluster
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import GatekeeperProcess
from tests.recorded import parse

__all__ = ["Outcome", "apiserver_events_since", "apiserver_offset", "run_set"]

GPU, NIC = "gpu.example.com", "nic.example.com"
NAMESPACE, CLAIM = "tenant", "rbac-claim"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
SLICE, POOL = "rbac-node-a-gpu", "node-a"
# Every nonResourceURLs entry of the role has a path here: "/api/*" is "/api/v1", and so on;
# the trailing-slash forms are the official Python client's.
DISCOVERY = (
    "/api",
    "/api/v1",
    "/apis",
    "/apis/resource.k8s.io",
    "/apis/resource.k8s.io/v1",
    "/apis/resource.k8s.io/v1/",
    "/apis/devmgmtproto.k8s.io/v1alpha1",
    "/version",
    "/version/",
    "/openapi/v3",
    "/openapi/v3/apis/resource.k8s.io/v1",
    "/openapi/v3/api/v1",
)


def _selector(*terms: str) -> str:
    return urllib.parse.quote(",".join(terms), safe="")


_MINE = _selector(f"spec.driver={GPU}", "spec.nodeName=node-a")
_MY_POOL = _selector(f"spec.driver={GPU}", "spec.nodeName=node-a", f"metadata.name={POOL}")


@dataclass(frozen=True)
class Outcome:
    """One request of the set: who sent what, the code it was meant to get and the one it got."""

    label: str
    driver: str
    method: str
    path: str
    want: int
    got: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.got == self.want


@dataclass
class _Run:
    gatekeeper: GatekeeperProcess
    outcomes: list[Outcome] = field(default_factory=list)

    def call(
        self,
        label: str,
        driver: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        want: int = 200,
    ) -> Any:
        api = self.gatekeeper.driver_api(driver)
        try:
            answer = api.call(method, path, body, content_type=content_type)
            got, message = want, ""
        except ApiError as error:
            answer, got, message = None, error.code, str(error)
        self.outcomes.append(Outcome(label, driver, method, path, want, got, message))
        return answer

    def watch(self, label: str, driver: str, path: str) -> None:
        """Open a watch, take its status line, and hang up: the status is what RBAC decides
        (the apiserver checks before it streams), and closing ends the watch at once."""
        api = self.gatekeeper.driver_api(driver)
        request = urllib.request.Request(api.url + path, headers={"Accept": "application/json"})
        message = ""
        try:
            with urllib.request.urlopen(request, context=api.context, timeout=30) as answer:
                got = answer.status
        except urllib.error.HTTPError as error:
            got, message = error.code, error.read().decode(errors="replace")
        self.outcomes.append(Outcome(label, driver, "GET", path, 200, got, message))


def _slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": GPU,
            "nodeName": "node-a",
            "pool": {"name": "node-a/rbac", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def _pool() -> dict[str, Any]:
    return {
        "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
        "kind": "DevicePool",
        "metadata": {"name": POOL},
        "spec": {"driver": GPU, "nodeName": "node-a"},
    }


def _reset(admin: Api) -> None:
    """The set's starting point: no slice or pool of its own, and a fresh claim allocated to
    both drivers on node-a."""
    for path in (f"{SLICES}/{SLICE}", f"{POOLS}/{POOL}", f"{CLAIMS.format(ns=NAMESPACE)}/{CLAIM}"):
        try:
            admin.call("DELETE", path, {"gracePeriodSeconds": 0})
        except ApiError as error:
            if error.code != 404:
                raise
    claim = create_claim(admin, NAMESPACE, CLAIM)
    allocate_claim(admin, claim, [(GPU, "node-a", "gpu-0"), (NIC, "node-a", "nic-0")])


def _node_local(run: _Run, label: str, collection: str, name: str, body: dict[str, Any]) -> None:
    """Every verb of a node-local kind, as its driver uses them."""
    selector = _MY_POOL if collection == POOLS else _MINE
    run.call(f"{label} create", GPU, "POST", collection, body, want=201)
    run.call(f"{label} get", GPU, "GET", f"{collection}/{name}")
    run.call(f"{label} list", GPU, "GET", f"{collection}?fieldSelector={_MINE}")
    run.watch(f"{label} watch", GPU, f"{collection}?watch=true&fieldSelector={_MINE}")
    changed = json.loads(json.dumps(body))
    changed["metadata"]["labels"] = {"step": "update"}
    run.call(f"{label} update", GPU, "PUT", f"{collection}/{name}", changed)
    run.call(
        f"{label} patch",
        GPU,
        "PATCH",
        f"{collection}/{name}",
        {"metadata": {"labels": {"step": "patch"}}},
        content_type="application/merge-patch+json",
    )
    run.call(f"{label} delete", GPU, "DELETE", f"{collection}/{name}")
    run.call(f"{label} create again", GPU, "POST", collection, body, want=201)
    run.call(f"{label} deletecollection", GPU, "DELETE", f"{collection}?fieldSelector={selector}")


def _claim_status(run: _Run, driver: str, device: str) -> None:
    """A driver's own status.devices entry: written whole (update), then changed (patch)."""
    path = f"{CLAIMS.format(ns=NAMESPACE)}/{CLAIM}"
    claim = run.call(f"claim get as {driver}", driver, "GET", path)
    if claim is not None:
        devices = claim.setdefault("status", {}).setdefault("devices", [])
        devices.append({"driver": driver, "pool": "node-a", "device": device, "data": {"n": 1}})
        claim = run.call(f"claim status update as {driver}", driver, "PUT", f"{path}/status", claim)
    # At the version it wrote, not the newest: forwarded, not answered from the gatekeeper's
    # read of the claim (so it needs the role's get of resourceclaims/status).
    version = ((claim or {}).get("metadata") or {}).get("resourceVersion")
    status = f"{path}/status" + (f"?resourceVersion={version}" if version else "")
    stored = run.call(f"claim status get as {driver}", driver, "GET", status)
    entries = ((stored or {}).get("status") or {}).get("devices") or []
    index = next((i for i, e in enumerate(entries) if e.get("driver") == driver), 0)
    run.call(
        f"claim status patch as {driver}",
        driver,
        "PATCH",
        f"{path}/status",
        [{"op": "replace", "path": f"/status/devices/{index}/data", "value": {"n": 2}}],
        content_type="application/json-patch+json",
    )


def run_set(cluster: RealCluster, gatekeeper: GatekeeperProcess) -> list[Outcome]:
    """Reset the set's objects (as an admin), then send the set through ``gatekeeper``."""
    _reset(cluster.admin)
    run = _Run(gatekeeper)
    for path in DISCOVERY:
        run.call(f"discovery {path}", GPU, "GET", path)
    run.call("own node get", GPU, "GET", "/api/v1/nodes/node-a")
    _node_local(run, "slice", SLICES, SLICE, _slice())
    _node_local(run, "pool", POOLS, POOL, _pool())
    claims = "/apis/resource.k8s.io/v1/resourceclaims"
    run.call("claims list", GPU, "GET", claims)
    run.watch("claims watch", GPU, f"{claims}?watch=true")
    _claim_status(run, GPU, "gpu-0")
    _claim_status(run, NIC, "nic-0")
    return run.outcomes


# --- the apiserver's journal from a point on ----------------------------------------------------


def apiserver_offset(cluster: RealCluster) -> int:
    """Where the apiserver's audit log ends now (a mark for :func:`apiserver_events_since`)."""
    path: Path = cluster.audit_log
    return path.stat().st_size if path.exists() else 0


def apiserver_events_since(cluster: RealCluster, offset: int) -> Iterator[dict[str, Any]]:
    """The apiserver's completed audit events written after ``offset``."""
    with cluster.audit_log.open("rb") as log:
        log.seek(offset)
        for line in log:
            if line.strip():
                event = parse(line.decode())  # deep: see RealCluster.audit_events
                if event.get("stage") in ("ResponseComplete", "Panic"):
                    yield event
