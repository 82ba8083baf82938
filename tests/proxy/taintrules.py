"""A gatekeeper in front of the embedded API server, under the patch corpus's policy
(tests/corpus/patches/policy.yaml: DeviceTaintRules scoped to the caller by CEL), holding one
DeviceTaintRule of another driver (``theirs``) and one of the GPU driver (``mine``): the stack of
the proxy tests of CEL scopes and of what a write stores."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN, PKI, Running, running_gatekeeper

__all__ = ["RULES", "send", "taint_rule", "taint_rule_stack"]

POLICY = Path(__file__).parents[1] / "corpus" / "patches" / "policy.yaml"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


def taint_rule(name: str, pool: str, driver: str = GPU) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool},
            "taint": {"key": "gpu.example.com/unhealthy", "effect": "NoSchedule"},
        },
    }


@asynccontextmanager
async def taint_rule_stack(pki: PKI) -> AsyncIterator[tuple[APIServer, Running]]:
    policy = load_policy(str(POLICY))
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await apiserver.start()
    try:
        apiserver.add(taint_rule("theirs", "node-b/gpus", driver="nic.example.com"))
        apiserver.add(taint_rule("mine", f"{NODE}/gpus"))
        async with running_gatekeeper(apiserver, policy, pki) as gatekeeper:
            yield apiserver, gatekeeper
    finally:
        await apiserver.close()


async def send(running: Running, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> tuple[int, dict[str, Any]]:  # fmt: skip
    """The GPU driver's request on its Unix socket: the status and the JSON answer."""
    connector = aiohttp.UnixConnector(path=str(running.socket_path(GPU)))
    async with aiohttp.ClientSession("http://localhost", connector=connector) as session:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        async with session.request(method, path, data=data, headers=headers) as answer:
            return answer.status, await answer.json()
