"""The embedded API server as the token listener's tests need it (TokenRequest, TokenReview), and
a client of the gatekeeper's token listener."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from gatekeeper.apiserver import TOKEN_KINDS, APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import Policy
from gatekeeper.server.config import token_ssl_context
from gatekeeper.testing.harness import (
    NODE,
    NODE_TOKEN,
    PKI,
    RecordingSink,
    Running,
    running_gatekeeper,
)

__all__ = [
    "REVIEWS",
    "SA",
    "TokenGatekeeper",
    "call",
    "reviews_of",
    "start",
    "token",
    "token_cluster",
]

SA = "system:serviceaccount:gpu-system:gpu-driver"
"""The service account the token tests' policies map to the GPU driver."""
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


@asynccontextmanager
async def token_cluster(policy: Policy) -> AsyncIterator[APIServer]:
    """The embedded API server with what TokenRequests need: nodes, service accounts, pods
    (the driver's on this node and on node-b, and another service account's)."""
    api = APIServer((*served_kinds(policy), *TOKEN_KINDS), token=NODE_TOKEN)
    await api.start()
    for node in (NODE, "node-b"):
        api.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for name in ("gpu-driver", "other"):
        api.add(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": "gpu-system"},
            }
        )
    for pod, node, account in (
        ("plugin-a", NODE, "gpu-driver"),
        ("plugin-b", "node-b", "gpu-driver"),
        ("other-a", NODE, "other"),
    ):
        api.add(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": "gpu-system"},
                "spec": {"nodeName": node, "serviceAccountName": account},
            }
        )
    try:
        yield api
    finally:
        await api.close()


def token(
    cluster: APIServer, pod: str | None = "plugin-a", account: str = "gpu-driver", **kw: Any
) -> str:
    """A TokenRequest's token of ``account``, bound to ``pod``."""
    return cluster.tokens.mint("gpu-system", account, pod=pod, **kw)


def reviews_of(cluster: APIServer, secret: str | None = None, since: int = 0) -> int:
    """TokenReviews the API server received from journal entry ``since`` on (of ``secret``)."""
    return sum(
        1
        for entry in cluster.journal[since:]
        if entry.path == REVIEWS and (secret is None or secret.encode() in entry.body)
    )


@dataclass
class TokenGatekeeper:
    running: Running
    sink: RecordingSink

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.running.server.token_port}"

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.running.pki.path("ca.crt"))

    def session(self) -> aiohttp.ClientSession:
        """A client keeping one connection alive (every request on the same connection)."""
        connector = aiohttp.TCPConnector(ssl=self.context(), limit=1)
        return aiohttp.ClientSession(base_url=self.url, connector=connector)


@asynccontextmanager
async def start(
    cluster: APIServer, policy: Policy, pki: PKI, **options: Any
) -> AsyncIterator[TokenGatekeeper]:
    """A gatekeeper with only the token listener, auditing to a RecordingSink."""
    sink = RecordingSink()
    async with running_gatekeeper(
        cluster,
        policy,
        pki,
        audit_sink=sink,
        listen=None,
        listen_tls=None,
        listen_token=("127.0.0.1", 0),
        token_tls=token_ssl_context(pki.path("server.crt"), pki.path("server.key")),
        **options,
    ) as running:
        yield TokenGatekeeper(running, sink)


async def call(
    gk: TokenGatekeeper,
    method: str,
    target: str,
    bearer: str | None,
    body: Any = None,
    session: aiohttp.ClientSession | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request with ``bearer`` (on ``session``'s connection, or a new one)."""
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    if session is not None:
        async with session.request(method, target, headers=headers, json=body) as answer:
            return answer.status, dict(answer.headers), await answer.json()
    async with gk.session() as own:
        return await call(gk, method, target, bearer, body, own)
