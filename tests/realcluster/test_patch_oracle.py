"""The differential patch oracle on the real kube-apiserver 1.36.3 (issue 39): more than ten
thousand seeded, reproducible random and mutated JSON and merge patches (nulls, escapes, ``-``
and odd array indexes, numeric strings, type changes, duplicate keys, deep paths,
``managedFields``) of a stored Node, Pod, ResourceSlice, ResourceClaim status and
DeviceTaintRule, each sent to the apiserver as a dry run and decided by the gatekeeper's own
prediction (gatekeeper/policy/stored.py), called directly.

Then JSON create and update bodies of the same objects with nulls in every part of them (and
client-go's ``metadata.creationTimestamp: null``), sent and decided the same way.

Wherever the gatekeeper decides on a result it computed, every field a rule reads is what the
apiserver stores (for a body: everything it says), or the write is refused; wherever it cannot
know, it decides on the apiserver's own dry run. ``DRA_GATEKEEPER_PATCH_SEED``,
``DRA_GATEKEEPER_PATCH_CASES`` and ``DRA_GATEKEEPER_BODY_CASES`` choose another run; the seed
and the counts are printed."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gatekeeper.listenerkind import ListenerKind
from gatekeeper.types import NODE_NAME_EXTRA, POD_NAME_EXTRA, POD_UID_EXTRA, Identity, UserInfo
from tests.policy.stored_cases import value_at
from tests.realcluster.cluster import ApiError, RealCluster
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim, ensure
from tests.realcluster.patchoracle import (
    Case,
    Tally,
    Target,
    Verdict,
    generate,
    generate_bodies,
    judge,
    send_all,
)

SEED = int(os.environ.get("DRA_GATEKEEPER_PATCH_SEED", "39"))
CASES = int(os.environ.get("DRA_GATEKEEPER_PATCH_CASES", "10400"))
BODY_CASES = int(os.environ.get("DRA_GATEKEEPER_BODY_CASES", "800"))
NAMESPACE = "gpu-system"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
TAINT_RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def _slice() -> dict[str, Any]:
    device = {
        "name": "gpu-0",
        "attributes": {"model": {"string": "a100"}, "cores": {"int": 80}, "ok": {"bool": True}},
        "capacity": {"memory": {"value": "40Gi"}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "oracle-node-a", "labels": {"gpu.example.com/tier": "a"}},
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a/oracle", "generation": 1, "resourceSliceCount": 1},
            "devices": [device, {"name": "gpu-1"}],
        },
    }


def _entry(driver: str, device: str) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True", "reason": "Up", "message": "",
                 "lastTransitionTime": "2026-12-01T10:00:00Z"}  # fmt: skip
    return {"driver": driver, "pool": "node-a/oracle", "device": device, "conditions": [condition]}


@pytest.fixture(scope="module")
def targets(real_cluster: RealCluster) -> Iterator[list[Target]]:
    """One stored object per rule a patch meets, as the apiserver serves it."""
    admin = real_cluster.admin
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpu-driver"}}
    ensure(admin, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", account)
    pod = ensure(admin, PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "oracle-pod", "labels": {"app": "gpu-driver"},
                     "annotations": {"example.org/note": "x"}},
        "spec": {"nodeName": "node-a", "serviceAccountName": "gpu-driver",
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    })  # fmt: skip
    created = ensure(admin, SLICES, _slice())
    claim = create_claim(admin, "tenant", "oracle-claim")
    results = [("gpu.example.com", "node-a/oracle", "gpu-0"),
               ("nic.example.com", "node-a/oracle", "nic-0")]  # fmt: skip
    claim = allocate_claim(admin, claim, results)
    claim["status"]["devices"] = [
        _entry("nic.example.com", "nic-0"),
        _entry("gpu.example.com", "gpu-0"),
    ]
    status = f"{CLAIMS.format(ns='tenant')}/oracle-claim/status"
    claim = admin.call("PUT", status, claim)
    ensure(admin, TAINT_RULES, {
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": "oracle-mine"},
        "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": "node-a/oracle"},
                 "taint": {"key": "gpu.example.com/unhealthy", "effect": "NoSchedule"}},
    })  # fmt: skip
    own_pod = Identity(
        "gpu.example.com",
        ListenerKind.TOKEN,
        user=UserInfo(
            f"system:serviceaccount:{NAMESPACE}:gpu-driver",
            extra={NODE_NAME_EXTRA: ("node-a",), POD_NAME_EXTRA: ("oracle-pod",),
                   POD_UID_EXTRA: (pod["metadata"]["uid"],)},
        ),
    )  # fmt: skip
    node = "/api/v1/nodes/node-a"
    yield [
        Target("node", node, admin.get(node)),
        Target("pod", f"{PODS}/oracle-pod", admin.get(f"{PODS}/oracle-pod"), own_pod),
        Target(
            "slice", f"{SLICES}/oracle-node-a", admin.get(f"{SLICES}/{created['metadata']['name']}")
        ),
        Target("claim-status", status, admin.get(status)),
        Target("taint-rule", f"{TAINT_RULES}/oracle-mine", admin.get(f"{TAINT_RULES}/oracle-mine")),
    ]
    for path in (f"{PODS}/oracle-pod", f"{SLICES}/oracle-node-a", status.removesuffix("/status"),
                 f"{TAINT_RULES}/oracle-mine"):  # fmt: skip
        try:
            admin.delete(path)
        except ApiError as error:
            assert error.code == 404


async def test_the_gatekeeper_decides_on_what_the_apiserver_stores(
    real_cluster: RealCluster, targets: list[Target]
) -> None:
    rng = random.Random(SEED)
    cases = generate(rng, targets, CASES)
    cases += generate_bodies(rng, targets, BODY_CASES, len(cases))
    oracle = real_cluster.user("patch-oracle", "patch-oracle", "system:masters")
    tally = Tally()
    verdicts: dict[int, Verdict] = {}

    def judged(case: Case, code: int, served: Any) -> None:
        verdicts[case.number] = verdict = judge(case, code, served)
        tally.add(verdict)

    started = time.monotonic()
    await send_all(real_cluster.url, oracle.context, cases, judged)
    elapsed = time.monotonic() - started
    unrefused = [
        v
        for v in verdicts.values()
        if v.divergence is not None and v.decision is not None and v.decision.allowed
    ]
    print("\n" + tally.report(SEED))
    print(f"sent and judged in {elapsed:.1f} s")
    in_order = [verdicts[case.number] for case in cases]
    _show("read-field divergences, all refused", [v for v in in_order if v.divergence])
    _show("answered 500 by the apiserver", [v for v in in_order if v.code == 500])
    patches = [v for v in in_order if v.case.method == "PATCH"]
    bodies = [v for v in in_order if v.case.method != "PATCH"]
    assert len(patches) >= 10_000 and len(bodies) >= BODY_CASES
    assert [(v.case.number, v.case.raw, v.divergence) for v in unrefused] == []
    # The corpus (the attacks of issue 39 among it): the apiserver still answers and stores
    # each as recorded there, and the gatekeeper refuses it or decides it as recorded.
    for verdict in in_order:
        entry = verdict.case.entry
        if entry is None:
            continue
        served = entry["apiserver"]
        assert verdict.code == served["code"], (entry["id"], verdict.served)
        if "at" in served:
            assert value_at(verdict.served, served["at"]) == served["stores"], entry["id"]
        decision = verdict.decision
        refused = verdict.prediction == "refused-parse" or (
            decision is not None and not decision.allowed and verdict.prediction != "dry-run"
        )
        outcome = (
            "dry-run" if verdict.prediction == "dry-run" else "refused" if refused else "local"
        )
        assert outcome == next(iter(entry["gatekeeper"])), (entry["id"], verdict.prediction)
    # Every JSON and merge patch a CEL scope decides is decided on the apiserver's dry run.
    cel = [v for v in patches if v.case.target.name == "taint-rule" and v.prediction == "local"]
    assert cel == []
    # A body that was asked about was the caller's (refused bodies asked nothing: judge), and
    # every kind of body was met: decided here, on the dry run, refused first.
    assert {v.prediction for v in bodies} >= {"local", "dry-run", "refused"}
    assert {v.case.method for v in bodies if v.prediction == "dry-run"} == {"POST", "PUT"}
    # The stored objects are as they were: the run sent dry runs only.
    for target in targets:
        again = real_cluster.admin.get(target.path)
        assert again["metadata"]["resourceVersion"] == target.stored["metadata"]["resourceVersion"]


def _show(what: str, verdicts: list[Verdict], first: int = 5) -> None:
    print(f"{what}: {len(verdicts)}, by target and type: " + ", ".join(
        f"{key} {count}" for key, count in sorted(Counter(
            f"{v.case.target.name} {v.case.media_type.split('/')[1]}" for v in verdicts).items())
    ))  # fmt: skip
    for verdict in verdicts[:first]:
        print(f"  case {verdict.case.number} ({verdict.prediction}): "
              f"{verdict.case.raw[:200].decode(errors='replace')} -> "
              f"{(verdict.divergence or str(verdict.served))[:160]}")  # fmt: skip
