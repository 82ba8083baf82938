"""The pipeline end to end: real drivers over real Unix sockets and mTLS, the embedded API server
as upstream over real HTTP. Every refusal is checked against the upstream's journal."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.policy.decision import REJECTED_PREVIEW
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PINNED,
    SLICES,
    InterleavedUpstream,
    RecordingSink,
    Running,
    raw_request,
    running_gatekeeper,
    seed,
    slice_body,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession


def driver_requests(apiserver: APIServer, since: int) -> list[tuple[str, str]]:
    return [(entry.method, entry.path) for entry in apiserver.journal[since:]]


@pytest.mark.parametrize("transport", ["unix", "mtls"])
async def test_dra_helper_sequence(
    gatekeeper: Running, apiserver: APIServer, transport: str
) -> None:
    """list + watch pinned, create with generateName, update, delete with preconditions."""
    session = gatekeeper.unix_session(GPU) if transport == "unix" else gatekeeper.tls_session(GPU)
    async with session:
        listed = await session.get(f"{SLICES}?{PINNED}")
        assert listed.status == 200, await listed.text()
        listing = await listed.json()
        assert listing["kind"] == "ResourceSliceList" and listing["items"] == []
        rv = listing["metadata"]["resourceVersion"]

        watch = await session.get(
            f"{SLICES}?{PINNED}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
            "&timeoutSeconds=30"
        )
        assert watch.status == 200

        created = await session.post(SLICES, json=slice_body(name=None))
        assert created.status == 201, await created.text()
        obj = await created.json()
        assert obj["metadata"]["name"].startswith(f"{NODE}-{GPU}-")
        assert created.headers["Audit-Id"]

        event = json.loads(await asyncio.wait_for(watch.content.readline(), 10))
        assert event["type"] == "ADDED"
        assert event["object"]["metadata"]["name"] == obj["metadata"]["name"]

        obj["spec"]["devices"].append({"name": "gpu-1"})
        updated = await session.put(f"{SLICES}/{obj['metadata']['name']}", json=obj)
        assert updated.status == 200, await updated.text()
        obj = await updated.json()
        assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0", "gpu-1"]
        event = json.loads(await asyncio.wait_for(watch.content.readline(), 10))
        assert event["type"] == "MODIFIED"

        deleted = await session.delete(
            f"{SLICES}/{obj['metadata']['name']}",
            json={
                "preconditions": {
                    "uid": obj["metadata"]["uid"],
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                }
            },
        )
        assert deleted.status == 200, await deleted.text()
        event = json.loads(await asyncio.wait_for(watch.content.readline(), 10))
        assert event["type"] == "DELETED"
        watch.close()
    assert apiserver.get("resource.k8s.io", "resourceslices", obj["metadata"]["name"]) is None
    delete = next(e for e in apiserver.journal if e.method == "DELETE")
    assert json.loads(delete.body)["preconditions"] == {
        "uid": obj["metadata"]["uid"],
        "resourceVersion": obj["metadata"]["resourceVersion"],
    }


async def test_same_answers_as_the_api_server(gatekeeper: Running, apiserver: APIServer) -> None:
    seed(apiserver)
    seed(apiserver, name="node-b-gpu", node="node-b", pool="node-b")
    headers = {"Authorization": f"Bearer {NODE_TOKEN}"}
    async with (
        gatekeeper.unix_session(GPU) as proxied,
        aiohttp.ClientSession(apiserver.url) as direct,
    ):
        for path in (f"{SLICES}?{PINNED}", f"{SLICES}/node-a-gpu-0", f"{SLICES}/missing"):
            via = await proxied.get(path)
            straight = await direct.get(path, headers=headers)
            assert via.status == straight.status
            assert await via.json() == await straight.json()


async def test_driver_authorization_never_reaches_upstream(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    seed(apiserver)
    async with gatekeeper.unix_session(GPU) as session:
        for method, path in (("GET", f"{SLICES}/node-a-gpu-0"), ("GET", f"{SLICES}?{PINNED}")):
            response = await session.request(
                method,
                path,
                headers={
                    "Authorization": "Bearer driver-secret",
                    "Cookie": "a=b",
                    "Proxy-Authorization": "Basic eA==",
                },
            )
            assert response.status == 200
    assert apiserver.journal
    for entry in apiserver.journal:
        assert entry.headers.get("Authorization") == f"Bearer {NODE_TOKEN}"
        assert "Cookie" not in entry.headers and "Proxy-Authorization" not in entry.headers


REFUSALS = [
    (
        "other-driver",
        "POST",
        SLICES,
        slice_body(driver=NIC),
        403,
        "does not match the calling driver",
    ),
    ("other-node", "POST", SLICES, slice_body(node="node-b"), 403, "does not match this node"),
    ("bad-pool", "POST", SLICES, slice_body(pool="gpus"), 403, "is not prefixed by node name"),
    ("cluster-wide-list", "GET", SLICES, None, 403, "list requires fieldSelector"),
    ("cluster-wide-watch", "GET", f"{SLICES}?watch=1", None, 403, "watch requires fieldSelector"),
    (
        "other-node-list",
        "GET",
        f"{SLICES}?fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3Dnode-b",
        None,
        403,
        "pins",
    ),
    ("unpinned-deletecollection", "DELETE", SLICES, None, 403, "deletecollection requires"),
    (
        "secrets",
        "GET",
        "/api/v1/namespaces/kube-system/secrets",
        None,
        403,
        'cannot list resource "secrets"',
    ),
    ("pods", "POST", "/api/v1/namespaces/default/pods", {"kind": "Pod"}, 403, "does not allow"),
    ("nodes", "GET", "/api/v1/nodes", None, 403, "a driver may only get this node's own Node"),
    (
        "clusterroles",
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        None,
        403,
        "does not allow",
    ),
    (
        "dot-dot",
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices/../../../api/v1/secrets",
        None,
        400,
        'path segment 5 is ".."',
    ),
    (
        "escaped-slash",
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices/a%2Fb",
        None,
        400,
        "path segment 5 contains a '%' escape",
    ),
    (
        "escaped-dots",
        "GET",
        "/api/v1/namespaces/%2e%2e/secrets",
        None,
        400,
        "path segment 4 contains a '%' escape",
    ),
    (
        "double-slash",
        "GET",
        "/apis/resource.k8s.io/v1//resourceslices",
        None,
        400,
        "path segment 4 is empty",
    ),
    ("trailing-slash", "GET", f"{SLICES}/", None, 400, f"path \"{SLICES}/\" ends with '/'"),
    ("semicolon", "GET", f"{SLICES};x=y", None, 400, 'request target has ";" at offset 39'),
    (
        "backslash",
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices\\x",
        None,
        400,
        'request target has "\\\\" at offset 39',
    ),
    (
        "lowercase-fieldselector",
        "GET",
        f"{SLICES}?fieldselector=spec.nodeName%3D{NODE}",
        None,
        400,
        "not recognized",
    ),
    (
        "repeated-query",
        "GET",
        f"{SLICES}?{PINNED}&{PINNED}",
        None,
        400,
        'query parameter "fieldSelector" is given more than once',
    ),
    (
        "watch-prefix",
        "GET",
        "/apis/resource.k8s.io/v1/watch/resourceslices",
        None,
        400,
        "the /watch/ path prefix is not supported",
    ),
    (
        "namespaced-slice",
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/x/resourceslices/y",
        None,
        400,
        "cluster-scoped",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "message"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
async def test_refusals_never_reach_upstream(
    gatekeeper: Running,
    apiserver: APIServer,
    method: str,
    path: str,
    body: Any,
    code: int,
    message: str,
) -> None:
    code_seen, headers, status = await raw_request(gatekeeper, method, path, body)
    assert code_seen == code
    assert headers["content-type"].startswith("application/json")
    assert status["kind"] == "Status" and status["code"] == code and status["status"] == "Failure"
    assert message in status["message"]
    assert apiserver.journal == []


async def test_a_core_group_refusal_is_laid_out_as_the_apiservers(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """The real apiserver leaves the empty core group out of a 403's details (omitempty):
    recorded on the real tier for a user without RBAC (tests/realcluster/test_refusals.py)."""
    code, _, status = await raw_request(gatekeeper, "GET", "/api/v1/namespaces/default/secrets/s1")
    assert code == 403
    assert status["details"] == {"kind": "secrets", "name": "s1"}
    code, _, status = await raw_request(gatekeeper, "GET", "/api/v1/namespaces/default/secrets")
    assert status["details"] == {"kind": "secrets"}
    assert apiserver.journal == []


HEADER_TRICKS = [
    ("impersonate-user", {"Impersonate-User": "system:admin"}),
    ("impersonate-group", {"Impersonate-Group": "system:masters"}),
    ("impersonate-extra", {"Impersonate-Extra-Scopes": "x"}),
    ("x-remote-user", {"X-Remote-User": "admin"}),
    ("x-remote-group", {"X-Remote-Group": "system:masters"}),
    ("method-override", {"X-HTTP-Method-Override": "DELETE"}),
    ("upgrade", {"Connection": "Upgrade", "Upgrade": "websocket"}),
]


@pytest.mark.parametrize(
    "headers", [c[1] for c in HEADER_TRICKS], ids=[c[0] for c in HEADER_TRICKS]
)
async def test_header_tricks_are_refused(
    gatekeeper: Running, apiserver: APIServer, headers: dict[str, str]
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.get(f"{SLICES}?{PINNED}", headers=headers)
        assert response.status == 403
        assert (await response.json())["reason"] == "Forbidden"
    assert apiserver.journal == []


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "PROPFIND"])
async def test_other_methods_are_refused(
    gatekeeper: Running, apiserver: APIServer, method: str
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.request(method, f"{SLICES}?{PINNED}")
        assert response.status == 403
    assert apiserver.journal == []


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("CONNECT", "/api"),
        ("CONNECT", SLICES),
        ("CONNECT", "localhost:443"),
        ("OPTIONS", "*"),
    ],
)
async def test_every_target_form_is_a_status_and_an_event(
    apiserver: APIServer, policy: Any, pki: Any, method: str, target: str
) -> None:
    """aiohttp reads a CONNECT target as an authority, so even ``CONNECT /api`` matches no
    route: the pipeline still answers it, with a Status, an Audit-Id and an event."""
    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as running:
        code, headers, status = await raw_request(running, method, target)
    assert code == 403 and headers["content-type"].startswith("application/json")
    assert status["kind"] == "Status" and f"method {method} is not allowed" in status["message"]
    (event,) = sink.by_id(headers["audit-id"])
    assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
    assert event["responseStatus"]["code"] == 403
    assert apiserver.journal == []


async def test_foreign_objects_are_checked_before_any_write(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    foreign = seed(apiserver, name="node-a-nic", driver=NIC)
    elsewhere = seed(apiserver, name="node-b-gpu", node="node-b", pool="node-b")
    async with gatekeeper.unix_session(GPU) as session:
        for obj in (foreign, elsewhere):
            name = obj["metadata"]["name"]
            for method, body in (("GET", None), ("PUT", obj), ("DELETE", None)):
                response = await session.request(method, f"{SLICES}/{name}", json=body)
                assert response.status == 403, (method, name)
                message = (await response.json())["message"]
                # A PUT of the object as stored (its resourceVersion in it) is decided on its
                # body alone (docs/security.md, "Updates without a read"): it names another
                # driver or node, refused the same, before anything is read.
                whose = "does not match" if method == "PUT" else "the stored object's"
                assert whose in message, (method, name, message)
    # Only the gatekeeper's own reads of the stored objects arrived; no write did.
    assert {entry.method for entry in apiserver.journal} == {"GET"}
    assert apiserver.get("resource.k8s.io", "resourceslices", "node-a-nic") is not None


async def test_mtls_identity(gatekeeper: Running, apiserver: APIServer) -> None:
    async with gatekeeper.tls_session("evil.example.com") as stranger:
        response = await stranger.get("/version")
        assert response.status == 403
        assert 'driver "evil.example.com" is not allowed' in (await response.json())["message"]
    async with gatekeeper.tls_session(None) as anonymous:
        # No certificate, no connection: refused at the handshake
        # (docs/operating.md#troubleshooting).
        with pytest.raises(aiohttp.ClientError):
            await (await anonymous.get("/version")).read()
    async with gatekeeper.tls_session(NIC) as nic:
        response = await nic.post(SLICES, json=slice_body(driver=NIC))
        assert response.status == 201, await response.text()
    assert [entry.method for entry in apiserver.journal] == ["POST"]


async def test_certificate_from_another_ca_fails_the_handshake(
    gatekeeper: Running, apiserver: APIServer, tmp_path: Any
) -> None:
    import ssl

    from gatekeeper.cli.certs import create_ca, issue_client_cert, write_pem

    rogue = issue_client_cert(create_ca("rogue"), GPU)
    write_pem(tmp_path / "c.crt", rogue.cert_pem)
    write_pem(tmp_path / "c.key", rogue.key_pem, private=True)
    context = ssl.create_default_context(cafile=gatekeeper.pki.path("ca.crt"))
    context.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        with pytest.raises(aiohttp.ClientError):
            response = await session.get(f"{gatekeeper.tls_url}/version")
            await response.read()
    assert apiserver.journal == []


async def test_discovery_passes_for_policy_groups(gatekeeper: Running) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        paths = ("/version", "/apis", "/api", "/apis/resource.k8s.io/v1", "/openapi/v3")
        # The openapi documents of the policy's groups, the core one (Node) included.
        paths += ("/openapi/v3/apis/resource.k8s.io/v1", "/openapi/v3/api/v1")
        for path in paths:
            response = await session.get(path)
            assert response.status == 200, path


async def test_upstream_unreachable_is_503_with_retry_after(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    await apiserver.close()
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.get(f"{SLICES}?{PINNED}")
        body = await response.json()
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert body["details"]["retryAfterSeconds"] == 1


async def test_watch_events_arrive_as_they_happen(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        watch = await session.get(f"{SLICES}?{PINNED}&watch=true&timeoutSeconds=60")
        assert watch.status == 200
        for index in range(3):
            seed(apiserver, name=f"node-a-gpu-{index}")
            event = json.loads(await asyncio.wait_for(watch.content.readline(), 5))
            assert (event["type"], event["object"]["metadata"]["name"]) == (
                "ADDED",
                f"node-a-gpu-{index}",
            )
        seed(apiserver, name="node-a-nic", driver=NIC)  # filtered upstream by the pinned selector
        seed(apiserver, name="node-a-gpu-3")
        event = json.loads(await asyncio.wait_for(watch.content.readline(), 5))
        assert event["object"]["metadata"]["name"] == "node-a-gpu-3"
        watch.close()


async def test_upstream_breaking_mid_watch_breaks_the_drivers_stream(
    apiserver: APIServer, policy: Any, pki: Any
) -> None:
    """After the status line no Status can follow: the driver must see the break, not hang."""
    sent = b'{"type":"ADDED","object":{"kind":"ResourceSlice"}}\n'

    async def dying_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(sent):x}\r\n".encode() + sent + b"\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()

    server = await asyncio.start_server(dying_upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream = UpstreamSession(UpstreamConfig(server=url, token=NODE_TOKEN))
    try:
        async with (
            running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running,
            running.unix_session(GPU) as session,
        ):
            watch = await session.get(f"{SLICES}?{PINNED}&watch=true")
            assert watch.status == 200
            assert await asyncio.wait_for(watch.content.readline(), 5) == sent
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(watch.content.read(), 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_driver_disconnecting_mid_stream_is_a_driver_disconnect(
    apiserver: APIServer, policy: Any, pki: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver that goes away during its watch is audited as 499, not as an upstream failure."""
    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as running:
        reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
        writer.write(f"GET {SLICES}?{PINNED}&watch=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        writer.transport.abort()
        # Bounded: each new object is a watch event the gatekeeper tries to write to the driver.
        for index in range(200):
            seed(apiserver, name=f"node-a-gpu-{index}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sink.completed.wait(), 0.05)
            if sink.completed.is_set():
                break
    complete = [event for event in sink.events if event["stage"] == "ResponseComplete"]
    assert len(complete) == 1
    assert complete[0]["responseStatus"]["code"] == 499
    assert complete[0]["annotations"]["authorization.k8s.io/decision"] == "allow"
    assert not [r for r in caplog.records if "upstream" in r.getMessage()]


async def test_a_patch_preview_the_apiserver_rejects_is_answered_as_it_said(
    apiserver: APIServer, policy: Any, pki: Any
) -> None:
    """The object changes between the fetch and the dry run: the apiserver's 409 reaches the
    driver as it was given, and the event is an allowed request the apiserver refused."""
    seed(apiserver)

    def change(path: str) -> None:
        apiserver.store.delete(("resource.k8s.io", "resourceslices"), ("", "node-a-gpu-0"))
        seed(apiserver)

    sink = RecordingSink()
    config = UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)
    upstream = InterleavedUpstream(config, after_read=change)
    async with (
        running_gatekeeper(apiserver, policy, pki, upstream=upstream, audit_sink=sink) as running,
        running.unix_session(GPU) as session,
    ):
        response = await session.patch(
            f"{SLICES}/node-a-gpu-0",
            data=json.dumps({"metadata": {"labels": {"a": "b"}}}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        status = await response.json()
    assert response.status == 409
    assert status["reason"] == "Conflict" and status["code"] == 409
    dry_runs = [e for e in apiserver.journal if e.method == "PATCH"]
    assert len(dry_runs) == 1 and "dryRun=All" in dry_runs[0].query_string
    (event,) = sink.events
    assert event["responseStatus"]["code"] == 409
    assert event["annotations"]["authorization.k8s.io/decision"] == "allow"
    assert event["annotations"]["authorization.k8s.io/reason"] == REJECTED_PREVIEW


async def test_a_fault_of_the_gatekeeper_is_audited_with_its_true_code(
    apiserver: APIServer, policy: Any, pki: Any
) -> None:
    """Not 499 "client disconnected": the driver got a 500, and the event says so."""

    served = policy

    class Broken:
        node_name = NODE

        @property
        def policy(self) -> Any:
            return served  # what /metrics labels are checked against

        def screen(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as running:
        Broken.policy = running.server.engine.policy  # type: ignore[attr-defined]
        running.server.gatekeeper.engine = Broken()  # type: ignore[assignment]
        async with running.unix_session(GPU) as session:
            response = await session.get(f"{SLICES}?{PINNED}")
            await response.read()
    assert response.status == 500
    (event,) = sink.events
    assert event["responseStatus"]["code"] == 500
    assert event["responseStatus"]["message"] == "internal error: RuntimeError"
    assert apiserver.journal == []


SECRETS = "/api/v1/namespaces/default/secrets"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# Recorded client-go bytes: a ResourceSlice in protobuf (recording 207), an object in CBOR (226).
PROTOBUF_BODY = b"k8s\x00\n\x1e\n\x12resource.k8s.io/v1\x12\x08Resource"
CBOR_BODY = b"\xd9\xd9\xf7\xa2dkindfSecret"


@pytest.mark.parametrize(
    ("media_type", "body"),
    [(PROTOBUF, PROTOBUF_BODY), ("application/cbor", CBOR_BODY), ("application/yaml", b"a: b")],
    ids=["protobuf", "cbor", "yaml"],
)
async def test_a_kind_the_policy_does_not_allow_is_refused_as_such_whatever_the_body(
    gatekeeper: Running, apiserver: APIServer, media_type: str, body: bytes
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        refused = await session.post(SECRETS, data=body, headers={"Content-Type": media_type})
        status = await refused.json()
        assert refused.status == 403, status
        assert status["message"] == (
            'secrets is forbidden: User "gpu.example.com" cannot create resource "secrets" in '
            'API group "" in the namespace "default": the gatekeeper policy does not allow this '
            "resource"
        )
        assert apiserver.journal == []  # not even a dry run of the body
        if media_type == "application/yaml":
            # An allowed kind still gets 415 for a body the gatekeeper does not read.
            unread = await session.post(
                "/apis/resource.k8s.io/v1/resourceslices",
                data=body,
                headers={"Content-Type": media_type},
            )
            assert unread.status == 415
            assert "unknown format" in (await unread.json())["message"]
            assert apiserver.journal == []
