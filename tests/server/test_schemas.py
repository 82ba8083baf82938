"""``serve`` checks its policy's CEL against the apiserver's published schemas when it loads it:
the OpenAPI v3 document of each group and version whose kinds' CEL reads the objects, read
through the upstream session; a field the schema does not have is a warning, logged, never a
refusal, and a document that cannot be read leaves its kinds unchecked.

The documents of ``tests/policy/openapi/`` are a real kube-apiserver 1.36's (``/openapi/v3``,
cut to the schemas one kind reaches, descriptions removed)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest
from aiohttp import web

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy.celschema import field_warnings, schema_targets
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.server.server import GatekeeperServer
from gatekeeper.testing.harness import NODE_TOKEN, PKI, running_gatekeeper, serve_config
from gatekeeper.upstream.kubeconfig import UpstreamConfig

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "tests" / "policy" / "openapi"
GAUDI = REPO / "policies" / "intel-gaudi.yaml"
TYPO = (
    GAUDI.read_text()
    .replace("variables.selector.?driver.orValue('')", "variables.selector.?drivr.orValue('')")
    .replace("object.spec.taint.effect in", "object.spec.taint.efect in")
)


def documents() -> dict[tuple[str, str], object]:
    return {
        (
            "resource.k8s.io",
            name.removeprefix("resource.k8s.io-").removesuffix(".json"),
        ): json.loads((OPENAPI / name).read_text())
        for name in ("resource.k8s.io-v1.json", "resource.k8s.io-v1beta2.json")
    }


def test_a_field_the_schema_does_not_have_is_named() -> None:
    policy = parse_policy(TYPO, "gaudi.yaml", directory=str(GAUDI.parent))
    assert field_warnings(policy, documents()) == [
        "gaudi.yaml: kinds[0].versions[0].scope: devicetaintrules.resource.k8s.io v1beta2: "
        "object.spec.deviceSelector.drivr is not a field of DeviceTaintRule in the apiserver's "
        "schema (resource.k8s.io/v1beta2)",
        "gaudi.yaml: kinds[0].versions[0].validations[1].expression: devicetaintrules."
        "resource.k8s.io v1beta2: object.spec.taint.efect is not a field of DeviceTaintRule in "
        "the apiserver's schema (resource.k8s.io/v1beta2)",
    ]
    # v1alpha3 has no document here: it is not checked.
    assert ("resource.k8s.io", "v1alpha3") in schema_targets(policy)


@pytest.mark.parametrize(
    "path", sorted(p for p in (REPO / "policies").glob("*.yaml") if not p.stem.endswith("_test"))
)
def test_the_shipped_policies_read_only_fields_the_apiserver_has(path: Path) -> None:
    assert field_warnings(load_policy(str(path)), documents()) == []


def _replaying_upstream(missing: bool) -> web.Application:
    """The OpenAPI documents a real kube-apiserver answered, served over HTTP as it served
    them (one group version missing, when ``missing``)."""
    app = web.Application()
    docs = {f"/openapi/v3/apis/{g}/{v}": doc for (g, v), doc in documents().items()}
    if missing:
        docs.pop("/openapi/v3/apis/resource.k8s.io/v1beta2")

    async def answer(request: web.Request) -> web.Response:
        if request.path in docs:
            return web.json_response(docs[request.path])
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    app.router.add_get("/{tail:.*}", answer)
    return app


@pytest.mark.parametrize("missing", [False, True], ids=["documents", "a-document-missing"])
async def test_serve_warns_when_it_loads_the_policy(
    pki: PKI, caplog: pytest.LogCaptureFixture, missing: bool
) -> None:
    runner = web.AppRunner(_replaying_upstream(missing))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    policy = parse_policy(TYPO, "gaudi.yaml", directory=str(GAUDI.parent))
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    config = serve_config(
        apiserver,
        policy,
        pki,
        Path(tempfile.mkdtemp(prefix="gk-sock-")),
        upstream=UpstreamConfig(server=f"http://127.0.0.1:{port}", token=NODE_TOKEN),
    )
    server = GatekeeperServer(config)
    caplog.set_level(logging.WARNING, logger="gatekeeper.schemas")
    await server.start()
    try:
        warnings = await server.fields_checked()
    finally:
        await server.stop()
        await runner.cleanup()
    logged = [r.getMessage() for r in caplog.records if r.name == "gatekeeper.schemas"]
    if missing:
        assert warnings == []
        assert any("schema not read, CEL fields not checked" in line for line in logged)
        assert any(
            "path=/openapi/v3/apis/resource.k8s.io/v1beta2 status=404" in line for line in logged
        )
    else:
        assert [w.split(": ")[-1] for w in warnings] == [
            "object.spec.deviceSelector.drivr is not a field of DeviceTaintRule in the "
            "apiserver's schema (resource.k8s.io/v1beta2)",
            "object.spec.taint.efect is not a field of DeviceTaintRule in the apiserver's "
            "schema (resource.k8s.io/v1beta2)",
        ]
        assert (
            sum("CEL reads a field the apiserver's schema does not have" in m for m in logged) == 2
        )


async def test_the_embedded_api_servers_documents_accept_any_field(pki: PKI) -> None:
    """Read through the upstream session from the embedded API server (whose schemas accept
    any field): the check runs, and finds nothing to say."""
    policy = load_policy(str(GAUDI))
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await apiserver.start()
    try:
        async with running_gatekeeper(apiserver, policy, pki) as running:
            assert await running.server.fields_checked() == []
    finally:
        await apiserver.close()
