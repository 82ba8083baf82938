"""Patch previews against the embedded API server over real HTTP: what a patch would store,
asked with ``dryRun=All`` and the pinned patch, never stored; a refusal comes back as given."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.policy import Engine, Policy
from gatekeeper.policy.patching import STRATEGIC_MERGE
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.policy.stored import Stored, predict
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN, SLICES, seed
from gatekeeper.types import Identity
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.previews import run_preview
from gatekeeper.upstream.session import UpstreamSession


@pytest.fixture
async def upstream(apiserver: APIServer) -> AsyncIterator[UpstreamSession]:
    session = UpstreamSession(UpstreamConfig(server=apiserver.url, token=NODE_TOKEN))
    await session.start()
    yield session
    await session.close()


def planned_preview(policy: Policy, patch: dict[str, Any], current: dict[str, Any]) -> Preview:
    info = parse_request("PATCH", f"{SLICES}/node-a-gpu-0")
    plan = Engine(policy, NODE).plan(Identity(GPU, "unix"), info, STRATEGIC_MERGE)
    assert isinstance(plan, Plan)
    predicted = predict(plan, patch, current)
    assert isinstance(predicted, Stored) and predicted.preview is not None
    return predicted.preview


async def test_the_preview_is_the_result_and_changes_nothing(
    apiserver: APIServer, upstream: UpstreamSession, policy: Policy
) -> None:
    stored = seed(apiserver)
    preview = planned_preview(policy, {"metadata": {"labels": {"a": "b"}}}, stored)
    answered = await run_preview(upstream, preview)
    assert (answered.code, answered.rejected) == (200, False)
    assert answered.result is not None and answered.result["metadata"]["labels"] == {"a": "b"}
    assert answered.body is preview.body  # the pinned patch is not rebuilt
    (sent,) = apiserver.journal
    assert (sent.method, sent.path, sent.query_string) == (
        "PATCH",
        f"{SLICES}/node-a-gpu-0",
        "dryRun=All",
    )
    assert sent.headers["Content-Type"] == STRATEGIC_MERGE
    assert sent.headers["Authorization"] == f"Bearer {NODE_TOKEN}"
    assert (
        "labels"
        not in apiserver.get("resource.k8s.io", "resourceslices", "node-a-gpu-0")["metadata"]
    )


async def test_a_stale_preview_is_the_apiservers_conflict(
    apiserver: APIServer, upstream: UpstreamSession, policy: Policy
) -> None:
    stored = seed(apiserver)
    stale = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "999"}}
    answered = await run_preview(upstream, planned_preview(policy, {"spec": {}}, stale))
    assert answered.rejected and answered.code == 409
    assert answered.result is not None
    assert (answered.result["kind"], answered.result["reason"]) == ("Status", "Conflict")
