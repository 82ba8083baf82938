"""The embedded API server's TokenRequest and TokenReview, against the answers of a real 1.36
apiserver (recordings 231-255): over real HTTP, through the server's own endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import ISSUER, TOKEN_KINDS, APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from tests.recorded import recording

TOKEN = "admin-token"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SA_TOKEN = "/api/v1/namespaces/gpu-system/serviceaccounts/gpu-driver/token"


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    api = APIServer((*served_kinds(load_policy(None)), *TOKEN_KINDS), token=TOKEN)
    await api.start()
    api.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    api.add(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "gpu-driver", "namespace": "gpu-system"},
        }
    )
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-driver-node-a", "namespace": "gpu-system"},
            "spec": {"nodeName": "node-a", "serviceAccountName": "gpu-driver"},
        }
    )
    yield api
    await api.close()


async def post(api: APIServer, path: str, body: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(api.url + path, json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


def pod_ref(api: APIServer) -> dict[str, Any]:
    pod = api.get("", "pods", "gpu-driver-node-a", "gpu-system")
    assert pod is not None
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "gpu-driver-node-a",
        "uid": pod["metadata"]["uid"],
    }


async def bound_token(api: APIServer) -> str:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": pod_ref(api)},
    }
    code, answer = await post(api, SA_TOKEN, body)
    assert code == 201, answer
    return str(answer["status"]["token"])


async def review(api: APIServer, token: str, audiences: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = audiences
    code, answer = await post(
        api,
        REVIEWS,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
    )
    assert code == 201, answer
    assert answer["spec"] == spec
    return dict(answer["status"])


async def test_token_request_is_shaped_as_the_apiservers(server: APIServer) -> None:
    recorded = recording(231)["response_body"]
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": pod_ref(server)},
    }
    code, answer = await post(server, SA_TOKEN, body)
    assert code == recording(231)["status"] == 201
    assert answer["kind"] == recorded["kind"] and answer["spec"]["audiences"] == [ISSUER]
    assert set(answer["status"]) == set(recorded["status"])
    assert answer["metadata"]["name"] == "gpu-driver"


async def test_a_bound_token_reviews_with_the_node_extras(server: APIServer) -> None:
    status = await review(server, await bound_token(server))
    recorded = recording(241)["response_body"]["status"]
    assert status["authenticated"] is True
    assert status["user"]["username"] == recorded["user"]["username"]
    assert status["user"]["groups"] == recorded["user"]["groups"]
    assert set(status["user"]["extra"]) == set(recorded["user"]["extra"])
    assert status["user"]["extra"]["authentication.kubernetes.io/node-name"] == ["node-a"]
    assert status["audiences"] == recorded["audiences"]


@pytest.mark.parametrize("number", [242, 244, 247, 255])
async def test_rejected_tokens_say_why_as_the_apiserver_does(
    server: APIServer, number: int
) -> None:
    recorded = recording(number)
    expected = recorded["response_body"]["status"]
    audiences = recorded["request_body"]["spec"].get("audiences")
    if number == 244:
        token = "garbage.not-a.jwt"
    elif number == 247:
        token = server.tokens.mint("gpu-system", "gpu-driver", pod="gpu-driver-node-a", seconds=-60)
    else:
        token = await bound_token(server)
    if number == 255:
        server.store.delete(("", "pods"), ("gpu-system", "gpu-driver-node-a"))
    assert await review(server, token, audiences) == expected


async def test_unbound_and_legacy_tokens_carry_no_node(server: APIServer) -> None:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    }
    code, answer = await post(server, SA_TOKEN, body)
    assert code == 201
    unbound = await review(server, answer["status"]["token"])
    assert set(unbound["user"]["extra"]) == set(
        recording(246)["response_body"]["status"]["user"]["extra"]
    )
    legacy = await review(server, server.tokens.mint_legacy("gpu-system", "gpu-driver"))
    assert "extra" not in legacy["user"] and legacy["authenticated"] is True


async def test_token_requests_the_apiserver_refuses(server: APIServer) -> None:
    short = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 599},
    }
    code, answer = await post(server, SA_TOKEN, short)
    assert code == 422 and "may not specify a duration less than 10 minutes" in answer["message"]
    stale = {**pod_ref(server), "uid": "not-the-pod"}
    code, answer = await post(
        server,
        SA_TOKEN,
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"boundObjectRef": stale},
        },
    )
    assert code == 409 and "does not match the UID in record" in answer["message"]
    code, answer = await post(
        server, "/api/v1/namespaces/gpu-system/serviceaccounts/nobody/token", {"spec": {}}
    )
    assert code == 404
