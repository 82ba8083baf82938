"""Who is calling, from the accepted connection itself: real Unix sockets, real mTLS, plain TCP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.errors import Refusal
from gatekeeper.listen.identity import (
    NODE_NAME_EXTRA,
    Identity,
    identify,
    shown_token,
    token_identity,
)
from gatekeeper.policy.model import UnboundTokens
from gatekeeper.policyfile import load_policy
from gatekeeper.server.config import server_ssl_context
from gatekeeper.testing.harness import GPU, PKI
from gatekeeper.upstream.tokenreview import ReviewOutcome

Outcome = Identity | Refusal


@asynccontextmanager
async def identifying(
    socket_drivers: Callable[[str], Mapping[str, str]],
    *,
    unix: bool = False,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[str | int, asyncio.Queue[Outcome]]]:
    """A listener that answers nothing and records what :func:`identify` says of each peer."""
    seen: asyncio.Queue[Outcome] = asyncio.Queue()
    directory = Path(tempfile.mkdtemp(prefix="gk-id-"))
    path = str(directory / "api.sock")

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.put_nowait(identify(writer.transport, socket_drivers(path)))
        except Refusal as refusal:
            seen.put_nowait(refusal)
        writer.close()

    if unix:
        server = await asyncio.start_unix_server(accepted, path)
        address: str | int = path
    else:
        server = await asyncio.start_server(accepted, "127.0.0.1", 0, ssl=tls)
        address = server.sockets[0].getsockname()[1]
    try:
        yield address, seen
    finally:
        server.close()
        await server.wait_closed()
        Path(path).unlink(missing_ok=True)
        directory.rmdir()


async def connect_unix(path: str) -> None:
    _, writer = await asyncio.open_unix_connection(path)
    writer.close()


async def connect_tcp(port: int, context: ssl.SSLContext | None = None) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.close()


async def test_a_unix_socket_names_its_driver_and_the_peer() -> None:
    async with identifying(lambda path: {path: GPU}, unix=True) as (path, seen):
        assert isinstance(path, str)
        await connect_unix(path)
        identity = await asyncio.wait_for(seen.get(), 10)
    assert isinstance(identity, Identity)
    assert (identity.driver, identity.transport) == (GPU, "unix")
    assert identity.peer == {
        "pid": str(os.getpid()),
        "uid": str(os.getuid()),
        "gid": str(os.getgid()),
    }


async def test_a_unix_socket_bound_to_no_driver_is_401() -> None:
    async with identifying(lambda path: {}, unix=True) as (path, seen):
        assert isinstance(path, str)
        await connect_unix(path)
        refusal = await asyncio.wait_for(seen.get(), 10)
    assert isinstance(refusal, Refusal)
    assert refusal.code == 401 and "no driver is bound to socket" in refusal.reason
    assert refusal.message == f"Unauthorized: {refusal.reason}"


async def test_an_mtls_client_is_its_certificate_cn(pki: PKI) -> None:
    tls = server_ssl_context(pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt"))
    context = tls.context
    async with identifying(lambda path: {}, tls=context) as (port, seen):
        assert isinstance(port, int)
        await connect_tcp(port, pki.client_context(GPU))
        identity = await asyncio.wait_for(seen.get(), 10)
        # The listener's context requires the certificate: a client without one is refused at
        # the handshake and never reaches identification (the next one seen is GPU again).
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await connect_tcp(port, pki.client_context(None))
        await connect_tcp(port, pki.client_context(GPU))
        again = await asyncio.wait_for(seen.get(), 10)
    assert isinstance(identity, Identity) and isinstance(again, Identity)
    assert (identity.driver, identity.transport) == (GPU, "mtls")
    assert identity.peer["certSerial"] and identity.peer["certNotAfter"]


async def test_tls_without_a_client_certificate_is_401(pki: PKI) -> None:
    """Where a TLS listener lets a handshake end without a certificate, identification is
    still refused (the mTLS listener requires one at the handshake)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.path("server.crt"), pki.path("server.key"))
    async with identifying(lambda path: {}, tls=context) as (port, seen):
        assert isinstance(port, int)
        await connect_tcp(port, pki.client_context(None))
        anonymous = await asyncio.wait_for(seen.get(), 10)
    assert isinstance(anonymous, Refusal) and anonymous.code == 401
    assert anonymous.reason == "no verified client certificate with a subject CN"


async def test_plain_tcp_and_a_closed_connection_have_no_identity() -> None:
    async with identifying(lambda path: {}) as (port, seen):
        assert isinstance(port, int)
        await connect_tcp(port)
        refusal = await asyncio.wait_for(seen.get(), 10)
    assert isinstance(refusal, Refusal) and refusal.code == 401
    assert refusal.reason == "no identity: use the driver's Unix socket or mTLS"
    with pytest.raises(Refusal) as closed:
        identify(None, {})
    assert closed.value.reason == "connection closed before identification"


def test_identity_is_the_dependency_free_value() -> None:
    from gatekeeper import types

    assert Identity is types.Identity
    caller: Any = Identity(driver=GPU, transport="unix")
    with pytest.raises(AttributeError):
        caller.driver = "other"


# --- service-account tokens: the reviewed user → a driver on this node --------------------------

SA = "system:serviceaccount:gpu-system:plugin"
TOKEN_POLICY = load_policy(None).with_drivers(frozenset({"gpu.example.com"}))
TOKEN_POLICY = replace(TOKEN_POLICY, service_accounts={SA: "gpu.example.com"})
BOUND = {
    "authentication.kubernetes.io/node-name": ("node-a",),
    "authentication.kubernetes.io/node-uid": ("n-uid",),
    "authentication.kubernetes.io/pod-name": ("plugin-x",),
    "authentication.kubernetes.io/pod-uid": ("p-uid",),
    "authentication.kubernetes.io/credential-id": ("JTI=abc",),
}


def test_a_bound_token_of_a_mapped_service_account_is_its_driver() -> None:
    identity = token_identity(ReviewOutcome(True, SA, extra=BOUND), TOKEN_POLICY, "node-a")
    assert (identity.driver, identity.transport) == ("gpu.example.com", "token")
    assert identity.peer == {
        "serviceAccount": SA,
        "podName": "plugin-x",
        "podUID": "p-uid",
        "nodeName": "node-a",
        "credentialID": "JTI=abc",
    }


@pytest.mark.parametrize(
    ("outcome", "code", "message"),
    [
        (
            ReviewOutcome(False, error="service account token has expired"),
            401,
            "Unauthorized: service account token has expired",
        ),
        (
            ReviewOutcome(True, "system:serviceaccount:gpu-system:other", extra=BOUND),
            403,
            "service account gpu-system/other is not listed under serviceAccounts",
        ),
        (
            ReviewOutcome(True, "alice", extra=BOUND),
            403,
            'User "alice" is not a driver on node "node-a"',
        ),
        (
            ReviewOutcome(True, SA, extra={**BOUND, NODE_NAME_EXTRA: ("node-b",)}),
            403,
            'bound to a pod on node "node-b", not this node "node-a"',
        ),
        (
            ReviewOutcome(True, SA, extra={"authentication.kubernetes.io/credential-id": ("x",)}),
            403,
            "policy unboundTokens: Refuse",
        ),
        (ReviewOutcome(True, SA), 403, "legacy Secret token"),
    ],
    ids=["expired", "unmapped", "not-a-service-account", "other-node", "unbound", "legacy"],
)
def test_tokens_that_do_not_identify_a_driver_here(
    outcome: ReviewOutcome, code: int, message: str
) -> None:
    with pytest.raises(Refusal) as refused:
        token_identity(outcome, TOKEN_POLICY, "node-a")
    assert refused.value.code == code
    assert message in refused.value.message


def test_unbound_tokens_only_where_the_policy_allows_them() -> None:
    policy = replace(TOKEN_POLICY, unbound_tokens=UnboundTokens.ALLOW)
    identity = token_identity(ReviewOutcome(True, SA), policy, "node-a")
    assert identity.driver == "gpu.example.com"
    with pytest.raises(Refusal):  # a token that names another node still does not pass
        token_identity(
            ReviewOutcome(True, SA, extra={NODE_NAME_EXTRA: ("node-b",)}), policy, "node-a"
        )


@pytest.mark.parametrize(
    "header", ["", "Basic abc", "Bearer", "Bearer ", "bearer a b", "Token abc"]
)
def test_the_token_listener_needs_a_shown_token(header: str) -> None:
    with pytest.raises(Refusal) as refused:
        shown_token({"Authorization": header} if header else {})
    assert refused.value.code == 401 and "Bearer" in refused.value.message
    assert shown_token({"Authorization": "Bearer abc.def"}) == "abc.def"
