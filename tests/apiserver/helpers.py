"""HTTP helpers for the embedded API server's tests: one request, decoded."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from gatekeeper.apiserver._json import deep

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = {"Content-Type": "application/merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


async def call(
    client: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """``(status, decoded body)``; bodies of any depth are decoded."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with client.request(method, path, data=data, headers=hdrs) as resp:
        text = await resp.text()
        return resp.status, deep(json.loads, text) if text else None


def claim(name: str, **spec_devices: Any) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` ResourceClaim in ``default`` asking for one device."""
    devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices | spec_devices},
    }
