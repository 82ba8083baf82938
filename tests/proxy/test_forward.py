"""How a forwarded answer is framed: the driver gets the upstream's body byte for byte, with its
Content-Length when the upstream sent one and nothing changed the body (no chunked framing, no
separate last chunk), chunked otherwise; an answer the gatekeeper rebuilt never carries the
upstream's length."""

from __future__ import annotations

import asyncio
import json

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN, PKI, running_gatekeeper

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PINNED = {"fieldSelector": f"spec.nodeName={NODE},spec.driver={GPU}"}
LIST = json.dumps(
    {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "items": [], "x": "y" * 900}
).encode()
FORBIDDEN = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "resourceclaims is forbidden: a long upstream message " + "z" * 500,
        "reason": "Forbidden",
        "code": 403,
    }
).encode()


def _answer(status: str, body: bytes, *, chunked: bool) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    if not chunked:
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    half = len(body) // 2
    chunks = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (body[:half], body[half:]))
    return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_passed_answer_keeps_the_upstreams_framing(
    policy: Policy, pki: PKI, chunked: bool
) -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await reader.readline()
            if not line:
                break
            while (await reader.readline()).strip():
                pass
            if b"/resourceclaims" in line:
                writer.write(_answer("403 Forbidden", FORBIDDEN, chunked=chunked))
            else:
                writer.write(_answer("200 OK", LIST, chunked=chunked))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    apiserver.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with running_gatekeeper(apiserver, policy, pki) as gk, gk.unix_session(GPU) as gpu:
            async with gpu.get(SLICES, params=PINNED) as passed:
                assert passed.status == 200
                assert await passed.read() == LIST
                if chunked:
                    assert passed.headers["Transfer-Encoding"] == "chunked"
                    assert "Content-Length" not in passed.headers
                else:
                    assert passed.headers["Content-Length"] == str(len(LIST))
                    assert "Transfer-Encoding" not in passed.headers
            # A read filtered object by object: its error is rebuilt from the Status, shorter
            # than the upstream's, and framed for what is sent.
            async with gpu.get(CLAIMS) as rebuilt:
                body = await rebuilt.read()
                assert rebuilt.status == 403
                assert json.loads(body)["reason"] == "Forbidden"
                assert body != FORBIDDEN
                length = rebuilt.headers.get("Content-Length")
                assert length is None or int(length) == len(body)
    finally:
        server.close()
        await server.wait_closed()
