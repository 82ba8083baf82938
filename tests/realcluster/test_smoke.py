"""The tier itself: the apiserver serves DRA as configured, and the gatekeeper reaches it with
its own (not admin) credentials."""

from __future__ import annotations

from tests.realcluster.cluster import RealCluster
from tests.realcluster.processes import GatekeeperProcess


def test_resource_versions_served(real_cluster: RealCluster) -> None:
    group = real_cluster.admin.get("/apis/resource.k8s.io")
    served = {v["version"] for v in group["versions"]}
    assert {"v1", "v1beta2", "v1beta1"} <= served


def test_gatekeeper_lists_pinned_slices(real_gatekeeper: GatekeeperProcess, journal: None) -> None:
    api = real_gatekeeper.driver_api("gpu.example.com")
    answer = api.get(
        "/apis/resource.k8s.io/v1/resourceslices"
        "?fieldSelector=spec.driver%3Dgpu.example.com%2Cspec.nodeName%3Dnode-a"
    )
    assert answer["kind"] == "ResourceSliceList"


def test_the_apiserver_says_its_release(real_cluster: RealCluster) -> None:
    version = real_cluster.admin.get("/version")
    assert (version["major"], version["minor"]) == ("1", "36")
    assert version["gitVersion"].startswith("v1.36.")
