"""Claim lists through the gatekeeper in front of a real kube-apiserver: a driver paging with
``limit=1`` in a namespace full of claims hidden from it learns nothing about them. The real
apiserver's continue token names the last key of its page (the finding this guards against);
the embedded API server's side of the same attack is ``tests/proxy/test_filtering.py``."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from tests.realcluster.cluster import Api, RealCluster
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
NAMESPACE = "tenant"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def _raw(
    api: Api, path: str, received: list[bytes], accept: str = "application/json"
) -> tuple[int, Any]:
    """Status and decoded body; the headers and body, as received, kept in ``received``."""
    request = urllib.request.Request(api.url + path, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, context=api.context, timeout=30) as answer:
            code, headers, body = answer.status, bytes(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        code, headers, body = error.code, bytes(error.headers), error.read()
    received.append(headers + body)
    return code, json.loads(body)


def _claim(admin: Api, name: str, driver: str | None, node: str = "node-a") -> dict[str, Any]:
    created = create_claim(admin, NAMESPACE, name)
    if driver is None:
        return created
    return allocate_claim(admin, created, [(driver, node, "dev-0")], node=node)


def test_a_driver_paging_with_limit_1_learns_nothing_of_hidden_claims(
    real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess, clean: None, journal: None
) -> None:
    admin = real_cluster.admin
    claims = CLAIMS.format(ns=NAMESPACE)
    secrets: list[str] = []
    for i in range(3):
        for name, driver, node in (
            (f"secret-nic-{i}", NIC, "node-a"),
            (f"secret-elsewhere-{i}", GPU, "node-b"),
            (f"secret-unallocated-{i}", None, "node-a"),
        ):
            secrets += [name, _claim(admin, name, driver, node)["metadata"]["uid"]]
    _claim(admin, "visible", GPU)
    stolen = admin.get(f"{claims}?limit=1")["metadata"]["continue"]
    assert b"secret" in base64.urlsafe_b64decode(stolen + "=" * (-len(stolen) % 4))
    driver = real_gatekeeper.driver_api(GPU)
    received: list[bytes] = []
    listing: Any = None
    for accept in ("application/json", TABLE, PARTIAL):
        for where in (claims, "/apis/resource.k8s.io/v1/resourceclaims"):
            code, listing = _raw(driver, f"{where}?limit=1", received, accept)
            assert code == 200 and listing["kind"] == "ResourceClaimList", listing
            names = {
                item["metadata"]["name"]
                for item in listing["items"]
                if item["metadata"]["namespace"] == NAMESPACE
            }
            assert names == {"visible"}
            assert set(listing["metadata"]) == {"resourceVersion"}
    forged = '{"v":"meta.k8s.io/v1","rv":1,"start":"/tenant/secret-nic-0\\u0000"}'
    forged = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
    for token in (stolen, forged):
        code, status = _raw(driver, f"{claims}?limit=1&continue={quote(token)}", received)
        assert code == 400 and status["message"].startswith("continue is not accepted")
    # A get by name answers with the name asked for: compared, not searched for secrets.
    _, absent = _raw(driver, f"{claims}/never-was", [])
    for name in ("secret-nic-0", "secret-elsewhere-0", "secret-unallocated-0"):
        code, status = _raw(driver, f"{claims}/{name}", [])
        assert code == 404
        assert status == json.loads(json.dumps(absent).replace("never-was", name))
    rv = listing["metadata"]["resourceVersion"]
    watch = urllib.request.Request(
        driver.url + f"{claims}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
    )
    with urllib.request.urlopen(watch, context=driver.context, timeout=60) as stream:
        _claim(admin, "secret-later", NIC)
        _claim(admin, "gpu-later", GPU)
        seen: list[str] = []
        while "gpu-later" not in seen:  # after every hidden event before it
            line = stream.readline()
            assert line, "the watch ended"
            received.append(line)
            seen.append(json.loads(line)["object"]["metadata"].get("name", ""))
    everything = b"".join(received)
    for secret in [*secrets, "secret-later"]:
        assert secret.encode() not in everything, secret
