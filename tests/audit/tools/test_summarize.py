"""``audit summarize`` on events of real requests: what counts as a refusal."""

from __future__ import annotations

from gatekeeper.apiserver import APIServer
from gatekeeper.audit.tools.reader import ReadStats
from gatekeeper.audit.tools.summarize import format_table, summarize
from gatekeeper.testing.harness import GPU, NIC, SLICES, Audited, seed


async def test_a_missing_object_is_not_a_refusal(audited: Audited, apiserver: APIServer) -> None:
    """The driver's own object not created yet answers 404 as the apiserver would; another
    driver's object is a refusal."""
    seed(apiserver, name="node-a-nic", driver=NIC)
    async with audited.unix_session(GPU) as session:
        assert (await session.get(f"{SLICES}/node-a-not-yet")).status == 404
        assert (await session.get(f"{SLICES}/node-a-nic")).status == 403
    summary = summarize(await audited.events(), {})
    row = summary.rows[(GPU, "get", "resourceslices.resource.k8s.io")]
    assert (row.allowed, row.refused) == (1, 1)
    assert list(row.reasons) == ['the stored object\'s spec.driver "nic.example.com" does not '
                                 'match the calling driver "gpu.example.com"']  # fmt: skip
    assert "2 requests (1 allowed, 1 refused)" in format_table(summary, ReadStats())
