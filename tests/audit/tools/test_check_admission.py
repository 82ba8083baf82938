"""``audit check`` shows both layers: per write the gatekeeper allows, whether the policy's
exported admission policy would refuse it, judged on the objects the gatekeeper's own log holds
(the stored object after the write, and the one before it), "not known" where the log lacks them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.audit.tools.admission import NO_AFTER, AdmissionVerdict
from gatekeeper.audit.tools.check import check_records, format_report
from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.audit.tools.reader import iter_records
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NIC, Audited, seed, slice_body
from tests.paths import REPO

DEFAULT = str(REPO / "gatekeeper" / "policies" / "default.yaml")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MINE = f"{SLICES}/node-a-gpu-0"
WRITTEN = "the object must name one of the node's drivers, this node, and a pool prefixed by"


@pytest.fixture
def audit_level() -> AuditLevel:
    """The stored objects in the log: the gatekeeper's RequestResponse level."""
    return AuditLevel.REQUEST_RESPONSE


async def _traffic(audited: Audited, apiserver: APIServer) -> Path:
    """GPU's own slice created, patched and deleted; its patch of NIC's slice refused."""
    seed(apiserver, name="node-a-nic", driver=NIC)
    async with audited.unix_session(GPU) as gpu:
        assert (await gpu.post(SLICES, json=slice_body(name="node-a-gpu-0"))).status == 201
        patch = json.dumps({"metadata": {"labels": {"a": "b"}}})
        headers = {"Content-Type": "application/merge-patch+json"}
        assert (await gpu.patch(MINE, data=patch, headers=headers)).status == 200
        other = f"{SLICES}/node-a-nic"
        assert (await gpu.patch(other, data=patch, headers=headers)).status == 403
        assert (await gpu.delete(MINE)).status == 200
    await audited.stop()
    return audited.log_path


def _check(log: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = run_audit_command(["check", "--policy", DEFAULT, "--driver", NIC, *args, str(log)])
    return code, capsys.readouterr().out


async def test_each_allowed_write_is_judged_by_the_admission_policy_too(
    audited: Audited, apiserver: APIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await _traffic(audited, apiserver)
    code, out = _check(log, "--admission", "all", capsys=capsys)
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("ADMISSION ALLOWS")]
    assert [line.split()[4] for line in lines] == ["create", "patch", "delete"], out
    assert "3 writes allowed now judged: 3 allowed, 0 refused, 0 not known" in out, out
    # The default: only what the admission policy refuses has a line of its own.
    code, out = _check(log, capsys=capsys)
    assert code == 0 and "ADMISSION" not in out, out


def _stored_elsewhere(line: str) -> str:
    """The create's event with the stored object on node-b (as a mutating webhook placed after
    the gatekeeper's decision would store it)."""
    event: dict[str, Any] = json.loads(line)
    if event["verb"] == "create" and event.get("responseObject"):
        event["responseObject"]["spec"]["nodeName"] = "node-b"
    return json.dumps(event)


async def test_a_write_the_admission_policy_refuses_is_a_line_and_fails_the_check(
    audited: Audited, apiserver: APIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = await _traffic(audited, apiserver)
    changed = tmp_path / "changed.log"
    changed.write_text("".join(_stored_elsewhere(x) + "\n" for x in log.read_text().splitlines()))
    code, out = _check(changed, capsys=capsys)
    assert code == 1, out
    (line,) = [x for x in out.splitlines() if x.startswith("ADMISSION REFUSES")]
    assert f"create {SLICES}" in line and WRITTEN in line and "auditID=" in line, out
    assert "1 refused" in out, out


@pytest.mark.parametrize("audit_level", [AuditLevel.METADATA])
async def test_without_objects_in_the_log_the_verdict_is_not_known(
    audited: Audited, apiserver: APIServer, audit_level: AuditLevel
) -> None:
    log = await _traffic(audited, apiserver)
    policy = load_policy(DEFAULT).with_drivers(frozenset({GPU, NIC}))
    report = check_records(iter_records([str(log)], {}), policy)
    text = format_report(report)
    assert report.admission[AdmissionVerdict.REFUSES] == 0, text
    assert report.admission[AdmissionVerdict.ALLOWS] == 0, text
    assert report.admission[AdmissionVerdict.NOT_KNOWN] >= 2, text
    assert report.admission_unknown[NO_AFTER] >= 2, text
    assert f"admission not known: {NO_AFTER}" in text


async def test_a_policy_that_cannot_be_exported_says_so(
    audited: Audited, apiserver: APIServer, tmp_path: Path
) -> None:
    log = await _traffic(audited, apiserver)
    text = Path(DEFAULT).read_text().replace("drivers: []", 'drivers: ["*"]')
    assert 'drivers: ["*"]' in text
    any_driver = tmp_path / "any.yaml"
    any_driver.write_text(text)
    report = check_records(iter_records([str(log)], {}), load_policy(str(any_driver)))
    assert report.admission[AdmissionVerdict.NOT_KNOWN] == 3, format_report(report)
    (why,) = report.admission_unknown
    assert why.startswith("the policy cannot be exported: ") and '"*"' in why


async def test_a_collection_delete_is_judged_object_by_object(
    audited: Audited, apiserver: APIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async with audited.unix_session(GPU) as gpu:
        for name in ("node-a-gpu-0", "node-a-gpu-1"):
            assert (await gpu.post(SLICES, json=slice_body(name=name))).status == 201
        selector = f"fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3Dnode-a"
        assert (await gpu.delete(f"{SLICES}?{selector}")).status == 200
    await audited.stop()
    code, out = _check(audited.log_path, "--admission", "all", capsys=capsys)
    assert code == 0, out
    (line,) = [x for x in out.splitlines() if " deletecollection " in x]
    assert line.startswith("ADMISSION ALLOWS"), out
    # The deleted objects, as the stored one of another node: refused for that one.
    events = [json.loads(x) for x in audited.log_path.read_text().splitlines()]
    (event,) = [e for e in events if e["verb"] == "deletecollection"]
    event["responseObject"]["items"][1]["spec"]["nodeName"] = "node-b"
    audited.log_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, out = _check(audited.log_path, capsys=capsys)
    assert code == 1, out
    (line,) = [x for x in out.splitlines() if x.startswith("ADMISSION REFUSES")]
    assert " deletecollection " in line and "belongs to another node or driver" in line, out
