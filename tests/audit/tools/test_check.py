"""``audit check`` on a log without request bodies (Metadata level): patches of every type are
re-decided on metadata, as other verbs are, so ``audit generate`` then ``audit check`` on the
same log changes no decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.audit.tools.check import check_records, format_report
from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.audit.tools.reader import iter_records
from gatekeeper.policy.patching import APPLY, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NIC, Audited, seed, slice_body
from tests.paths import REPO

DEFAULT = str(REPO / "gatekeeper" / "policies" / "default.yaml")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
LABEL = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
PATCHES = [
    (JSON_PATCH, LABEL),
    (MERGE_PATCH, {"metadata": {"labels": {"c": "d"}}}),
    (STRATEGIC_MERGE, {"metadata": {"labels": {"e": "f"}}}),
]


@pytest.fixture
def audit_level() -> AuditLevel:
    return AuditLevel.METADATA


async def _patch(session: Any, target: str, media_type: str, body: Any) -> int:
    async with session.patch(
        target, data=json.dumps(body), headers={"Content-Type": media_type}
    ) as response:
        await response.read()
        return int(response.status)


async def _traffic(audited: Audited, apiserver: APIServer) -> Path:
    """Patches of every type, allowed (GPU's own slice) and refused (NIC's, a JSON patch that
    moves GPU's slice to another pool), at Metadata level: no body in the log."""
    seed(apiserver, name="node-a-nic", driver=NIC)
    async with audited.unix_session(GPU) as gpu:
        assert (await gpu.post(SLICES, json=slice_body(name="node-a-gpu-0"))).status == 201
        for media_type, body in PATCHES:
            assert await _patch(gpu, f"{SLICES}/node-a-gpu-0", media_type, body) == 200
            assert await _patch(gpu, f"{SLICES}/node-a-nic", media_type, body) == 403
        apply = {**slice_body(name="node-a-gpu-0"), "metadata": {"name": "node-a-gpu-0"}}
        applied = f"{SLICES}/node-a-gpu-0?fieldManager=gpu&force=true"
        assert await _patch(gpu, applied, APPLY, apply) == 200
        moved = [{"op": "replace", "path": "/spec/pool/name", "value": "other-gpus"}]
        assert await _patch(gpu, f"{SLICES}/node-a-gpu-0", JSON_PATCH, moved) == 403
    await audited.stop()
    return audited.log_path


async def test_a_metadata_log_of_patches_is_rechecked_without_a_change(
    audited: Audited, apiserver: APIServer
) -> None:
    log = await _traffic(audited, apiserver)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    patches = [e for e in events if e["verb"] == "patch"]
    assert len(patches) == 8 and all("requestObject" not in e for e in patches)
    policy = load_policy(DEFAULT).with_drivers(frozenset({GPU, NIC}))
    report = check_records(iter_records([str(log)], {}), policy)
    assert report.changes == [], format_report(report)
    assert report.decided["metadata"] >= 5


async def test_generate_then_check_a_metadata_log_with_json_patches_changes_nothing(
    audited: Audited, apiserver: APIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await _traffic(audited, apiserver)
    generated = tmp_path / "generated.yaml"
    assert run_audit_command(["generate", "--base", DEFAULT, "-o", str(generated), str(log)]) == 0
    capsys.readouterr()
    code = run_audit_command(["check", "--policy", str(generated), str(log)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " 0 changed: 0 newly refused, 0 newly allowed" in out, out
