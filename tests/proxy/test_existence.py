"""What a driver can learn of objects outside its CEL scope (issue 39, item 7;
docs/security.md, "What a driver learns of names outside its scope"): every read or write of one
answers exactly as for a name that does not exist (404), except a create under that name, which
answers the apiserver's own 409 AlreadyExists, dry run or not: the name exists, nothing more."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import NODE, PKI, Running
from tests.proxy.taintrules import RULES, send, taint_rule, taint_rule_stack


@pytest.fixture
async def stack(pki: PKI) -> AsyncIterator[tuple[APIServer, Running]]:
    async with taint_rule_stack(pki) as running:
        yield running


def renamed(status: dict[str, Any], name: str) -> dict[str, Any]:
    """``status`` with the object's name replaced: what is left is what the answer tells."""
    return json.loads(json.dumps(status).replace(name, "<name>"))


@pytest.mark.parametrize(
    ("method", "body", "content_type"),
    [
        ("GET", None, ""),
        ("PUT", "rule", "application/json"),
        ("PATCH", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"),
        ("PATCH", [{"op": "add", "path": "/metadata/labels", "value": {}}],
         "application/json-patch+json"),
        ("DELETE", None, ""),
    ],
    ids=["get", "update", "merge-patch", "json-patch", "delete"],
)  # fmt: skip
async def test_an_object_out_of_scope_answers_as_an_absent_one(
    stack: tuple[APIServer, Running], method: str, body: Any, content_type: str
) -> None:
    apiserver, gatekeeper = stack
    answers = []
    for name in ("theirs", "nothing-here"):
        sent = taint_rule(name, f"{NODE}/gpus") if body == "rule" else body
        code, status = await send(gatekeeper, method, f"{RULES}/{name}", sent, content_type)
        answers.append((code, renamed(status, name)))
    assert answers[0] == answers[1]
    assert answers[0][0] == 404
    stored = {o["metadata"]["name"]: o for o in apiserver.objects("resource.k8s.io",
                                                                  "devicetaintrules")}  # fmt: skip
    theirs = stored["theirs"]
    assert theirs["spec"]["deviceSelector"]["driver"] == "nic.example.com"
    assert "labels" not in theirs["metadata"]


@pytest.mark.parametrize("dry_run", [False, True], ids=["create", "dry-run-create"])
async def test_a_create_under_a_name_out_of_scope_tells_only_that_it_exists(
    stack: tuple[APIServer, Running], dry_run: bool
) -> None:
    """The chosen answer (docs/security.md): the apiserver's 409, which names the object and
    nothing of it, as it would for the driver's own object of that name. A name cannot be
    created twice, so a create answers "exists" however it is answered; the gatekeeper never
    reads the stored object to answer a create, so no more than that reaches the driver."""
    _, gatekeeper = stack
    query = "?dryRun=All" if dry_run else ""
    answers = []
    for name in ("theirs", "mine"):
        body = taint_rule(name, f"{NODE}/gpus")
        answers.append(await send(gatekeeper, "POST", f"{RULES}{query}", body))
    (theirs_code, theirs), (mine_code, mine) = answers
    assert theirs_code == mine_code == 409
    assert renamed(theirs, "theirs") == renamed(mine, "mine")
    assert theirs["reason"] == "AlreadyExists"
    assert theirs["details"] == {"name": "theirs", "group": "resource.k8s.io",
                                 "kind": "devicetaintrules"}  # fmt: skip
    assert "nic.example.com" not in json.dumps(theirs) and "node-b" not in json.dumps(theirs)
