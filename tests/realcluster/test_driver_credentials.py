"""Kinds forwarded under the driver's own credentials (rule DriverCredentials) touch nothing of
the gatekeeper's (issue 39, item 5): over every verb and every body encoding (JSON, protobuf,
CBOR, JSON with nulls; merge, JSON, strategic-merge and apply patches), for a built-in kind
(configmaps) and a custom resource (ComputeDomains), the kube-apiserver's own audit log shows no
request by the gatekeeper's ServiceAccount for either, and every forwarded one made with the
driver's token.
Before, a protobuf or CBOR create was first previewed as a dry run under the gatekeeper's
account."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.codec.kubeproto import MAGIC
from gatekeeper.testing.protobuf import field
from tests.realcluster.cluster import Api, ApiError, RealCluster
from tests.realcluster.objects import GATEKEEPER_NS, bound_token
from tests.realcluster.processes import GatekeeperProcess
from tests.realcluster.wholedriver import (
    COMPUTE_DOMAINS,
    Journal,
    apply_rbac,
    install_compute_domains,
)

GPU = "gpu.example.com"
NAMESPACE, ACCOUNT, GATEKEEPER_SA = "gpu-system", "creds-driver", "creds-gatekeeper"
DRIVER_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
GATEKEEPER_USER = f"system:serviceaccount:{GATEKEEPER_NS}:{GATEKEEPER_SA}"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
DOMAINS = COMPUTE_DOMAINS.format(ns=NAMESPACE)
PROTOBUF, CBOR = "application/vnd.kubernetes.protobuf", "application/cbor"
POLICY = f"""\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [{GPU}]
serviceAccounts:
  {GPU}: [{NAMESPACE}/{ACCOUNT}]
kinds:
  - group: ""
    resource: configmaps
    kind: ConfigMap
    scope: Namespaced
    rule: DriverCredentials
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    encodings: [json, protobuf, cbor]
    versions:
      - names: [v1]
  - group: gpu.example.com
    resource: computedomains
    kind: ComputeDomain
    scope: Namespaced
    rule: DriverCredentials
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    subresources: [status]
    encodings: [json, protobuf, cbor]
    versions:
      - names: [v1beta1]
"""


@pytest.fixture(scope="module")
def driver(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Api, GatekeeperProcess]]:
    """The driver's own token on a gatekeeper of node-a whose policy forwards configmaps and
    ComputeDomains under it (and the RBAC ``policy rbac`` prints for both accounts)."""
    admin = real_cluster.admin
    workdir = tmp_path_factory.mktemp("creds")
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    install_compute_domains(admin)
    apply_rbac(admin, policy, f"{GATEKEEPER_NS}/{GATEKEEPER_SA}", "dra-gatekeeper-creds")
    token, _ = bound_token(real_cluster, GATEKEEPER_NS, GATEKEEPER_SA, "node-a")
    token_file = workdir / "gatekeeper.token"
    token_file.write_text(token)
    gatekeeper = GatekeeperProcess(real_cluster, policy, (GPU,), token_file, listen_token=True)
    try:
        gatekeeper.start()
        driver_token, _ = bound_token(real_cluster, NAMESPACE, ACCOUNT, "node-a")
        url = f"https://127.0.0.1:{gatekeeper.token_port}"
        yield Api(url, Path(gatekeeper.pki.path("ca.crt")), token=driver_token), gatekeeper
    finally:
        gatekeeper.stop()
        for path in (CONFIGMAPS, DOMAINS):
            admin.delete(path)


def configmap_protobuf(name: str) -> bytes:
    """A core/v1 ConfigMap as client-go's typed client sends it: ObjectMeta (1), data (2)."""
    raw = field(1, field(1, name)) + field(2, field(1, "k") + field(2, "v"))
    type_meta = field(1, "v1") + field(2, "ConfigMap")
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")


def cbor(value: Any) -> bytes:
    """CBOR as Kubernetes reads it: the self-described tag, then maps, text and integers."""

    def head(major: int, size: int) -> bytes:
        if size < 24:
            return bytes([major << 5 | size])
        return bytes([major << 5 | 25]) + size.to_bytes(2, "big")

    def item(v: Any) -> bytes:
        if isinstance(v, dict):
            return head(5, len(v)) + b"".join(item(k) + item(x) for k, x in v.items())
        if isinstance(v, int):
            return head(0, v)
        data = str(v).encode()
        return head(3, len(data)) + data

    return b"\xd9\xd9\xf7" + item(value)


def domain(name: str) -> dict[str, Any]:
    return {"apiVersion": "gpu.example.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": name}, "spec": {"numNodes": 1}}  # fmt: skip


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def _requests() -> list[tuple[str, str, Any, str]]:
    """(method, path, body, content type): every verb, every encoding, for both kinds."""
    merge, strategic = "application/merge-patch+json", "application/strategic-merge-patch+json"
    json_patch, apply = "application/json-patch+json", "application/apply-patch+yaml"
    label = {"metadata": {"labels": {"gpu.example.com/x": "1"}}}
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    out: list[tuple[str, str, Any, str]] = []
    for kind, collection, make in (("cm", CONFIGMAPS, configmap), ("cd", DOMAINS, domain)):
        one = f"{collection}/{kind}-json"
        applied = {**make(f"{kind}-applied"), "metadata": {"name": f"{kind}-applied"}}
        with_null = make(f"{kind}-null")
        with_null["metadata"]["labels"] = {"x": None}
        with_null["data" if kind == "cm" else "spec"] = {"k" if kind == "cm" else "numNodes": None}
        out += [
            ("POST", collection, make(f"{kind}-json"), "application/json"),
            # A null the apiserver may store otherwise: still nothing asked under the
            # gatekeeper's credentials (elsewhere, a dry run would decide it).
            ("POST", collection, with_null, "application/json"),
            ("POST", collection, configmap_protobuf(f"{kind}-proto"), PROTOBUF),
            ("POST", collection, cbor(make(f"{kind}-cbor")), CBOR),
            ("GET", one, None, ""),
            ("GET", collection, None, ""),
            ("GET", f"{collection}?watch=true&timeoutSeconds=1", None, ""),
            ("PATCH", one, label, merge),
            ("PATCH", one, ops, json_patch),
            ("PATCH", one, label, strategic),
            ("PATCH", f"{collection}/{kind}-applied?fieldManager=driver", applied, apply),
            ("PUT", one, make(f"{kind}-json"), "application/json"),
            ("PUT", f"{collection}/{kind}-proto", configmap_protobuf(f"{kind}-proto"), PROTOBUF),
            ("DELETE", one, None, ""),
            ("DELETE", collection, None, ""),
        ]
    out.append(("PUT", f"{DOMAINS}/cd-status/status", domain("cd-status"), "application/json"))
    return out


def _send(api: Api, method: str, path: str, body: Any, content_type: str) -> int:
    raw = body if isinstance(body, bytes) else None
    if content_type == "application/apply-patch+yaml":
        raw = json.dumps(body).encode()  # JSON is YAML
    try:
        api.call(method, path, None if raw is not None else body, raw=raw,
                 content_type=content_type or "application/json")  # fmt: skip
    except ApiError as error:
        return error.code
    except json.JSONDecodeError:
        return 200  # a watch: one JSON object per event
    return 200


def test_no_request_for_a_driver_credentials_kind_carries_the_gatekeepers_credentials(
    real_cluster: RealCluster, driver: tuple[Api, GatekeeperProcess]
) -> None:
    api, gatekeeper = driver
    journal = Journal(real_cluster, gatekeeper)
    real_cluster.admin.create(DOMAINS, domain("cd-status"))
    sent = _requests()
    answered = [_send(api, method, path, body, kind) for method, path, body, kind in sent]
    calls, events = journal.driver_calls(DRIVER_USER)
    assert len(calls) == len(sent)
    kinds = {"configmaps", "computedomains"}
    mine = [e for e in events.values() if e.get("objectRef", {}).get("resource") in kinds]
    by_gatekeeper = [f"{e['verb']} {e['requestURI']}" for e in mine
                     if e["user"]["username"] == GATEKEEPER_USER]  # fmt: skip
    assert by_gatekeeper == []
    # Each call reached the apiserver as the driver (its own RBAC decided), and the gatekeeper
    # says so on every one.
    assert not any(call.refused for call in calls)
    for call in calls:
        assert call.apiserver is not None, call.gatekeeper["requestURI"]
        assert call.apiserver["user"]["username"] == DRIVER_USER
        assert call.gatekeeper["annotations"]["dra-gatekeeper.io/credentials"] == "driver"
    assert sum(e["user"]["username"] == DRIVER_USER for e in mine) == len(calls)
    # The protobuf create of the built-in kind was stored as the driver sent it. kube-apiserver
    # 1.36.3 panics on a protobuf create or update of a custom resource (nil pointer dereference,
    # audit stage "Panic") and closes the connection: under the driver's own credentials only, as
    # if it had gone direct; before, the gatekeeper's own dry run of the create met it first.
    outcome = dict(zip([(m, p, t) for m, p, _, t in sent], answered, strict=True))
    assert outcome[("POST", CONFIGMAPS, PROTOBUF)] == 200
    panicked = [c.apiserver for c in calls if c.apiserver and c.apiserver["stage"] == "Panic"]
    assert [(e["requestURI"], e["user"]["username"]) for e in panicked] == [
        (DOMAINS, DRIVER_USER),
        (f"{DOMAINS}/cd-proto", DRIVER_USER),
    ]
    assert outcome[("POST", DOMAINS, PROTOBUF)] == 503
