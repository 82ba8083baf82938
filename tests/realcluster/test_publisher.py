"""The upstream DRA helper's ResourceSlice publishing, unchanged, through the gatekeeper.

The Go driver runs ``kubeletplugin.Start`` with its NodeName and no NodeUID (so the helper's
ResourceSlice controller reads the Node for the owner reference) and ``PublishResources``:
two pools, then changed devices, then one pool removed. What counts is what the real
apiserver stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import RealCluster, poll
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU = "gpu.example.com"
CONTENT_TYPE = ""
MINE = (
    "/apis/resource.k8s.io/v1/resourceslices"
    "?fieldSelector=spec.driver%3Dgpu.example.com%2Cspec.nodeName%3Dnode-a"
)


def devices(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "attributes": {"model": {"string": "a100"}}} for n in names]


def stored_pools(cluster: RealCluster) -> dict[str, list[str]]:
    """Pool name → device names of the GPU driver's slices on node-a, as the apiserver has them."""
    pools: dict[str, list[str]] = {}
    for item in cluster.admin.get(MINE)["items"]:
        spec = item["spec"]
        pools.setdefault(spec["pool"]["name"], []).extend(d["name"] for d in spec["devices"])
    return {k: sorted(v) for k, v in pools.items()}


def connections(gatekeeper: GatekeeperProcess, tmp_path: Path) -> dict[str, str]:
    return {
        "mtls": f"kubeconfig={gatekeeper.driver_kubeconfig(GPU, tmp_path)}",
        "socket": f"socket={gatekeeper.socket(GPU)}",
    }


@pytest.mark.parametrize("via", ["mtls", "socket"])
def test_helper_publishes_changes_and_removes_pools(
    via: str,
    binaries: Binaries,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    tmp_path: Path,
    journal: None,
    clean: None,
) -> None:
    connect = connections(real_gatekeeper, tmp_path)[via]
    with DriverProcess(binaries["dradriver"], connect, content_type=CONTENT_TYPE) as driver:
        assert driver(
            "publish", pools={"node-a": devices("gpu-0", "gpu-1"), "node-a/extra": devices("gpu-2")}
        )["ok"]
        want = {"node-a": ["gpu-0", "gpu-1"], "node-a/extra": ["gpu-2"]}
        poll("both pools stored", lambda: stored_pools(real_cluster) == want)

        assert driver(
            "publish",
            pools={"node-a": devices("gpu-0", "gpu-1", "gpu-3"), "node-a/extra": devices("gpu-2")},
        )["ok"]
        want = {"node-a": ["gpu-0", "gpu-1", "gpu-3"], "node-a/extra": ["gpu-2"]}
        poll("the changed devices stored", lambda: stored_pools(real_cluster) == want)

        assert driver("publish", pools={"node-a": devices("gpu-0", "gpu-1", "gpu-3")})["ok"]
        want = {"node-a": ["gpu-0", "gpu-1", "gpu-3"]}
        poll("the removed pool gone", lambda: stored_pools(real_cluster) == want)

        node = real_cluster.admin.get("/api/v1/nodes/node-a")
        for item in real_cluster.admin.get(MINE)["items"]:
            owner = item["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["uid"]) == (
                "Node",
                "node-a",
                node["metadata"]["uid"],
            )
        assert driver.events_of("helper-error") == [], driver.stderr_tail()
