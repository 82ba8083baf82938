"""The token listener: drivers keep their ServiceAccount and ``rest.InClusterConfig()``; the
gatekeeper asks the apiserver (TokenReview, here the embedded API server's) who holds the
token, maps the service account to a driver and checks that its pod is on this node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from kubernetes.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    InClusterConfigLoader,
)

from gatekeeper.apiserver import APIServer
from gatekeeper.policy import Policy
from gatekeeper.policyfile import parse_policy
from gatekeeper.testing.harness import (
    GPU,
    NODE,
    NODE_TOKEN,
    PINNED,
    PKI,
    metric_value,
    running_gatekeeper,
    slice_body,
)
from tests.tokencluster import (
    REVIEWS,
    SA,
    TokenGatekeeper,
    call,
    start,
    token,
    token_cluster,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def token_policy(policy: Policy) -> Policy:
    return replace(policy, service_accounts={SA: GPU})


@pytest.fixture
async def cluster(token_policy: Policy) -> AsyncIterator[APIServer]:
    async with token_cluster(token_policy) as api:
        yield api


@pytest.fixture
async def gk(cluster: APIServer, token_policy: Policy, pki: PKI) -> AsyncIterator[TokenGatekeeper]:
    async with start(cluster, token_policy, pki) as started:
        yield started


async def test_the_official_client_as_in_a_pod(
    gk: TokenGatekeeper, cluster: APIServer, tmp_path: Path
) -> None:
    """``load_incluster_config()``'s own loader, reading the env, the token file and the CA file
    (only their directory differs from a pod's)."""
    (tmp_path / "token").write_text(token(cluster))
    port = gk.url.rsplit(":", 1)[1]
    environ = {SERVICE_HOST_ENV_NAME: "127.0.0.1", SERVICE_PORT_ENV_NAME: port}

    def in_pod() -> tuple[list[str], str]:
        configuration = client.Configuration()
        InClusterConfigLoader(
            token_filename=str(tmp_path / "token"),
            cert_filename=gk.running.pki.path("ca.crt"),
            environ=environ,
        ).load_and_set(configuration)
        api = client.ApiClient(configuration)
        resource = client.ResourceV1Api(api)
        resource.create_resource_slice(slice_body())
        listed = resource.list_resource_slice(
            field_selector=f"spec.driver={GPU},spec.nodeName={NODE}"
        )
        node = client.CoreV1Api(api).read_node(NODE)
        return [item.metadata.name for item in listed.items], node.metadata.name

    names, node = await asyncio.to_thread(in_pod)
    assert names == ["node-a-gpu-0"] and node == NODE
    assert cluster.get("resource.k8s.io", "resourceslices", "node-a-gpu-0") is not None
    (event, *_) = [e for e in gk.sink.events if e["verb"] == "create"]
    assert event["user"]["username"] == GPU
    assert event["user"]["extra"]["dra-gatekeeper.io/peer-serviceAccount"] == [SA]
    assert event["user"]["extra"]["dra-gatekeeper.io/peer-podName"] == ["plugin-a"]
    assert event["user"]["extra"]["dra-gatekeeper.io/transport"] == ["token"]


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda c: token(c, pod="plugin-b"), 403, 'bound to a pod on node "node-b"'),
        (
            lambda c: token(c, pod="other-a", account="other"),
            403,
            "gpu-system/other is not listed under serviceAccounts",
        ),
        (lambda c: token(c, seconds=-60), 401, "service account token has expired"),
        (lambda c: "garbage.not-a.jwt", 401, "invalid bearer token"),
        (lambda c: c.tokens.mint_legacy("gpu-system", "gpu-driver"), 403, "unboundTokens: Refuse"),
        (lambda c: token(c, pod=None), 403, "names no node"),
        (
            lambda c: token(c, audiences=["someone-else"]),
            401,
            "is invalid for the target audiences",
        ),
        (lambda c: None, 401, "Authorization: Bearer"),
    ],
    ids=["other-node", "unmapped", "expired", "garbage", "legacy", "unbound", "audience", "none"],
)
async def test_tokens_that_are_not_a_driver_here(
    gk: TokenGatekeeper, cluster: APIServer, make: Any, code: int, message: str
) -> None:
    before = len(cluster.journal)
    status, headers, body = await call(gk, "GET", f"{SLICES}?{PINNED}", make(cluster))
    assert (status, body["kind"]) == (code, "Status")
    assert message in body["message"]
    assert headers["Audit-Id"]
    (event,) = gk.sink.by_id(headers["Audit-Id"])
    assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
    # Nothing reached the upstream but the review itself.
    assert {e.path for e in cluster.journal[before:]} <= {REVIEWS}


async def test_the_drivers_token_is_never_forwarded_or_logged(
    gk: TokenGatekeeper, cluster: APIServer
) -> None:
    secret = token(cluster)
    status, _, _ = await call(gk, "POST", SLICES, secret, slice_body())
    assert status == 201
    for entry in cluster.journal:
        assert secret not in entry.headers.get("Authorization", "")
        if entry.path != REVIEWS:
            assert secret.encode() not in entry.body
    assert secret not in json.dumps(gk.sink.events)


async def test_one_review_per_token_however_many_requests(
    gk: TokenGatekeeper, cluster: APIServer
) -> None:
    secret = token(cluster)
    before = len(cluster.journal)
    answers = await asyncio.gather(
        *(call(gk, "GET", f"{SLICES}?{PINNED}", secret) for _ in range(20))
    )
    assert [status for status, _, _ in answers] == [200] * 20
    reviews = [e for e in cluster.journal[before:] if e.path == REVIEWS]
    assert len(reviews) == 1
    metrics = gk.running.server.metrics
    assert (
        metric_value(
            metrics.render().decode(), "dra_gatekeeper_token_reviews_total", result="authenticated"
        )
        == 1
    )
    assert (
        metric_value(
            metrics.render().decode(), "dra_gatekeeper_token_reviews_total", result="cached"
        )
        >= 1
    )


async def test_a_deleted_pods_token_stops_working_when_the_cache_expires(
    cluster: APIServer, token_policy: Policy, pki: PKI
) -> None:
    async with start(cluster, token_policy, pki, token_cache_ttl=0.3) as started:
        secret = token(cluster)
        assert (await call(started, "GET", f"{SLICES}?{PINNED}", secret))[0] == 200
        cluster.store.delete(("", "pods"), ("gpu-system", "plugin-a"))
        statuses = []
        for _ in range(100):  # bounded: 0.3 s of cache, then the review says invalidated
            status, _, body = await call(started, "GET", f"{SLICES}?{PINNED}", secret)
            statuses.append(status)
            if status == 401:
                assert "has been invalidated" in body["message"]
                break
            await asyncio.sleep(0.05)
        assert statuses[-1] == 401 and set(statuses[:-1]) <= {200}


async def test_a_review_outage_is_503_and_fails_closed(
    gk: TokenGatekeeper, cluster: APIServer
) -> None:
    url = cluster.url
    await cluster.close()
    status, headers, body = await call(gk, "GET", f"{SLICES}?{PINNED}", token(cluster))
    assert status == 503 and headers["Retry-After"] == "1"
    assert "cannot review the driver's token" in body["message"]
    host, port = url.removeprefix("http://").rsplit(":", 1)
    await cluster.start(host, int(port))
    assert (await call(gk, "GET", f"{SLICES}?{PINNED}", token(cluster)))[0] == 200


async def test_the_connection_counts_as_its_drivers(
    gk: TokenGatekeeper, cluster: APIServer
) -> None:
    secret = token(cluster)
    connector = aiohttp.TCPConnector(ssl=gk.context(), limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(2):
            async with session.get(
                gk.url + f"{SLICES}?{PINNED}", headers={"Authorization": f"Bearer {secret}"}
            ) as answer:
                assert answer.status == 200
        metrics = gk.running.server.metrics
        assert (
            metric_value(
                metrics.render().decode(),
                "dra_gatekeeper_connections_open",
                listener="token",
                caller=GPU,
            )
            == 1
        )


WIDGETS = "/apis/example.com/v1/namespaces/gpu-system/widgets"
WIDGET_KIND = """\
  - group: example.com
    resource: widgets
    kind: Widget
    scope: Namespaced
    rule: DriverCredentials
    verbs: [get, create]
    versions:
      - names: [v1]
"""


@pytest.fixture
def credentials_policy(token_policy: Policy, tmp_path: Path) -> Policy:
    """The token policy plus a CRD forwarded under the driver's own credentials."""
    widgets = parse_policy(
        "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\nkinds:\n" + WIDGET_KIND, "w.yaml"
    ).kinds
    return replace(token_policy, kinds={**token_policy.kinds, **widgets})


async def test_a_kind_under_the_drivers_credentials_carries_its_token_not_the_nodes(
    credentials_policy: Policy, pki: PKI
) -> None:
    """DESIGN §4.3a: the apiserver sees the driver's own token (it decides with the driver's
    RBAC); the node's credential never goes with it, and the audit event says whose it was."""
    async with (
        token_cluster(credentials_policy) as api,
        start(api, credentials_policy, pki) as gk,
    ):
        bearer = token(api)
        body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}}
        code, headers, _ = await call(gk, "POST", WIDGETS, bearer, body)
        assert code == 201
        (sent,) = [e for e in api.journal if e.path == WIDGETS]
        authorization = {k.lower(): v for k, v in sent.headers.items()}["authorization"]
        assert authorization == f"Bearer {bearer}" and NODE_TOKEN not in authorization
        events = gk.sink.by_id(headers["Audit-Id"])
        (event,) = [e for e in events if e["stage"] == "ResponseComplete"]
        assert event["annotations"]["dra-gatekeeper.io/credentials"] == "driver"
        assert bearer not in json.dumps(event)  # the token is never audited


async def test_a_kind_under_the_drivers_credentials_is_refused_on_a_socket(
    credentials_policy: Policy, cluster: APIServer, pki: PKI
) -> None:
    async with (
        running_gatekeeper(cluster, credentials_policy, pki) as running,
        running.unix_session(GPU) as session,
        session.get(WIDGETS + "/w1") as answer,
    ):
        assert answer.status == 403
        message = (await answer.json())["message"]
    assert "a driver connected by unix shows none" in message
    assert not [e for e in cluster.journal if e.path.startswith(WIDGETS)]
