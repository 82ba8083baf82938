"""Adopting a driver from its own traffic, end to end, as docs/adopting-a-driver.md says it: the
reference driver (dra-example-driver v0.3.0's kubelet plugin, unchanged) runs direct against a
kube-apiserver recording with the page's audit policy; the page's commands run as printed
(``audit generate``, ``dra-gatekeeper test`` on the tests it wrote, ``policy deploy``); then the
same driver, its chart's RBAC taken away, runs behind a gatekeeper serving the generated policy,
and the gatekeeper refuses none of its requests. What each run cost the apiserver is compared:
through the gatekeeper, the driver's own requests and only the reads and dry runs the design
needs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import ApiError, RealCluster, poll
from tests.realcluster.exampledriver import (
    ACCOUNT,
    DRIVER,
    DRIVER_USER,
    NAMESPACE,
    Kubelet,
    Plugin,
    apply_deployment,
    bind_cluster_role,
    chart_rules,
    launch,
    plugin_events,
    refusals,
    slices_of,
    start_gatekeeper,
)
from tests.realcluster.objects import CLAIMS, GATEKEEPER_NS, allocate_claim, create_claim, ensure
from tests.recorded import parse

DOC = Path(__file__).resolve().parents[2] / "docs" / "adopting-a-driver.md"
GATEKEEPER_ACCOUNT = "adopted-gatekeeper"
GATEKEEPER_USER = f"system:serviceaccount:{GATEKEEPER_NS}:{GATEKEEPER_ACCOUNT}"
NAME = "dra-gatekeeper-adopted"
CHART_ROLE = "dra-example-driver-role"
_RBAC_GROUP = "rbac.authorization.k8s.io"
_RBAC = f"/apis/{_RBAC_GROUP}/v1"
_SLICES = "/apis/resource.k8s.io/v1/resourceslices"

Launch = Callable[..., Plugin]


def doc_audit_policy() -> dict[str, Any]:
    """The page's audit policy."""
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
                if "apiVersion: audit.k8s.io/v1" in b]  # fmt: skip
    policy: dict[str, Any] = yaml.safe_load(block)
    return policy


def doc_commands(**values: str) -> str:
    """The page's shell block as a script: its assignments given ``values``, its commands run
    by this checkout's Python (``.venv/bin/dra-gatekeeper`` is ``python -m gatekeeper``)."""
    (block,) = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    lines = []
    for line in block.strip().splitlines():
        name, sep, _ = line.partition("=")
        if sep and name.isupper() and name in values:
            line = f"{name}={shlex.quote(values[name])}"
        lines.append(line.replace(".venv/bin/dra-gatekeeper", f"{sys.executable} -m gatekeeper"))
    return "set -e\n" + "\n".join(lines) + "\n"


def _devices(cluster: RealCluster, count: int) -> list[dict[str, Any]]:
    def published() -> list[dict[str, Any]] | None:
        items = slices_of(cluster, "node-a")
        return items if sum(len(s["spec"].get("devices", [])) for s in items) == count else None

    return poll(f"{count} devices published", published, timeout=60)


def cycle(start: Launch, kubelet: str, cluster: RealCluster, claim: dict[str, Any]) -> Any:
    """Start with partitioned GPUs, stop; start with whole GPUs, prepare and unprepare the
    claim as the kubelet does, stop. What was published and prepared, for comparing runs."""
    with start(GPU_PARTITIONS="2"):
        partitioned = _devices(cluster, 24)
    with start() as plugin:
        whole = _devices(cluster, 8)
        calls = Kubelet(kubelet, plugin)
        prepared = calls.prepare(claim)["claims"]
        specs = plugin.cdi_specs()
        unprepared = calls.unprepare(claim)["claims"]
    uid = claim["metadata"]["uid"]
    return (
        sorted(_published(s) for s in partitioned),
        [_published(s) for s in whole],
        prepared,
        [spec for name, spec in specs.items() if uid in name],
        unprepared,
    )


def _published(stored: dict[str, Any]) -> Any:
    spec = stored["spec"]
    return (
        spec["pool"]["name"],
        spec["pool"]["resourceSliceCount"],
        sorted(d["name"] for d in spec.get("devices", [])),
        sorted(c["name"] for c in spec.get("sharedCounters", [])),
    )


def _clear_slices(cluster: RealCluster) -> None:
    cluster.admin.delete(f"{_SLICES}?fieldSelector=spec.driver%3D{DRIVER}")
    poll("no slices of the driver", lambda: slices_of(cluster, "node-a") == [], timeout=30)


def _requests(events: Iterator[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """(verb, resource) of the apiserver's finished requests; a dry run named as such."""
    counted: Counter[tuple[str, str]] = Counter()
    for event in events:
        if event.get("stage") != "ResponseComplete":
            continue
        resource = event.get("objectRef", {}).get("resource", event["requestURI"])
        dry = " (dry run)" if "dryRun=All" in event["requestURI"] else ""
        counted[(event["verb"] + dry, resource)] += 1
    return counted


def _log_events(path: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    with path.open("rb") as log:
        log.seek(offset)
        for line in log.read().decode().splitlines():
            if line.strip():
                yield parse(line)


@pytest.fixture
def allocated(real_cluster: RealCluster) -> Iterator[dict[str, Any]]:
    admin = real_cluster.admin
    path = CLAIMS.format(ns="tenant")
    claim = create_claim(admin, "tenant", "adopted")
    yield allocate_claim(admin, claim, [(DRIVER, "node-a", "gpu-3")])
    admin.delete(f"{path}/adopted")


def test_adopting_the_reference_driver_from_its_own_traffic(
    binaries: Binaries, real_cluster: RealCluster, allocated: dict[str, Any], tmp_path: Path
) -> None:
    admin = real_cluster.admin
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    ensure(admin, "/api/v1/namespaces", namespace)
    _clear_slices(real_cluster)
    plugin, kubelet = binaries["dra-example-kubeletplugin"], binaries["kubeletdra"]

    # 1. The driver as it runs today: its chart's RBAC, straight to an apiserver recording with
    # the page's audit policy.
    url, log = real_cluster.another_apiserver("audited-apiserver", doc_audit_policy())
    role = {"apiVersion": f"{_RBAC_GROUP}/v1", "kind": "ClusterRole",
            "metadata": {"name": CHART_ROLE}, "rules": chart_rules()}  # fmt: skip
    ensure(admin, f"{_RBAC}/clusterroles", role)
    bind_cluster_role(real_cluster, CHART_ROLE, (NAMESPACE, ACCOUNT))
    direct_server = (int(url.rsplit(":", 1)[1]), str(real_cluster.ca_file))

    def direct(**env: str) -> Plugin:
        return launch(plugin, real_cluster, "node-a", direct_server, tmp_path, **env)

    before = cycle(direct, kubelet, real_cluster, allocated)
    direct_cost = poll(
        "the recording apiserver to log the driver's last watch",
        lambda: (c := _requests(_log_events(log))).get(("watch", "resourceslices")) == 2 and c,
    )

    # 2. to 4. The page's commands: the policy and its tests generated, the tests run, deployed.
    workdir = tmp_path / "adoption"
    workdir.mkdir()
    script = doc_commands(LOG=str(log))
    # This gatekeeper's own ServiceAccount and names: the tier's others keep theirs.
    own = f"--service-account {GATEKEEPER_NS}/{GATEKEEPER_ACCOUNT} --name {NAME}"
    assert " --out generated/\n" in script
    script = script.replace(" --out generated/\n", f" --out generated/ {own}\n")
    done = subprocess.run(["bash", "-c", script], cwd=workdir, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = done.stdout.splitlines()
    assert ran[-1].endswith(" passed, 0 failed") and int(ran[-1].split()[0]) >= 20, done.stdout
    policy = workdir / "my-policy.yaml"
    generated = yaml.safe_load(policy.read_text())
    assert {(k["resource"], k["rule"]): k["verbs"] for k in generated["kinds"]} == {
        ("nodes", "OwnNode"): ["get"],
        ("resourceclaims", "AllocatedToDriver"): ["get"],
        ("resourceslices", "NodeLocal"): ["create", "delete", "update", "watch"],
    }
    account = (GATEKEEPER_NS, GATEKEEPER_ACCOUNT)
    apply_deployment(real_cluster, workdir / "generated", account, NAME, workdir)

    # 5. Behind the gatekeeper: the chart's RBAC for the driver gone, the same runs.
    admin.delete(f"{_RBAC}/clusterrolebindings/{CHART_ROLE}")
    _clear_slices(real_cluster)
    gatekeeper = start_gatekeeper(real_cluster, policy, account, workdir)
    try:
        mark = gatekeeper.audit_mark()
        offset = real_cluster.audit_log.stat().st_size
        behind_server = (gatekeeper.token_port, gatekeeper.pki.path("ca.crt"))

        def behind(**env: str) -> Plugin:
            return launch(plugin, real_cluster, "node-a", behind_server, tmp_path, **env)

        after = cycle(behind, kubelet, real_cluster, allocated)
        events = plugin_events(gatekeeper, mark)
        assert refusals(events) == []
        assert after == before
    finally:
        gatekeeper.stop()
        _clear_slices(real_cluster)
    with pytest.raises(ApiError):
        admin.get(f"{_RBAC}/clusterrolebindings/{CHART_ROLE}")

    # What each run cost the apiserver: through the gatekeeper, the driver's own requests, and
    # only what the design adds (docs/adopting-a-driver.md#what-it-costs-the-apiserver).
    through = _requests(
        e for e in _log_events(real_cluster.audit_log, offset)
        if e["user"]["username"] == GATEKEEPER_USER and e["requestURI"] != "/version"
    )  # fmt: skip
    # The token of each of the plugin's two pods is reviewed when it first shows it, and again
    # when it shows it more than --token-cache-ttl (2 s) after the last review.
    reviews = through.pop(("create", "tokenreviews"))
    assert 2 <= reviews <= len(events), reviews
    expected = direct_cost.copy()
    for write in ("create", "update"):  # protobuf bodies: the apiserver decodes them first
        expected[(f"{write} (dry run)", "resourceslices")] = direct_cost[(write, "resourceslices")]
    # A delete is checked on the stored object, and pinned to it.
    expected[("get", "resourceslices")] = direct_cost[("delete", "resourceslices")]
    assert through == expected
    # The driver's token reached the apiserver only in the gatekeeper's TokenReviews.
    assert not any(
        e["user"]["username"] == DRIVER_USER for e in _log_events(real_cluster.audit_log, offset)
    )
