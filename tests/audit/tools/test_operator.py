"""The audit tools as an operator meets them: no ``--policy`` (the packaged default, as
``serve``), drivers from ``--driver-user`` and from the gatekeeper's own log, requests refused for
what the log does not record skipped, and an exit code when nothing could be checked."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.testing.harness import GPU, NODE, Audited
from tests.audit.logs import SA_GPU, apiserver_event, record_run, write_apiserver_log
from tests.paths import REPO

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_audit_command(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def changed_ids(out: str) -> list[str]:
    return [line.rsplit("auditID=", 1)[1] for line in out.splitlines() if " -> " in line]


def test_a_kube_apiserver_log_with_a_mapped_service_account_and_no_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_apiserver_log(tmp_path / "kube-audit.log")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    code, out, _ = run(capsys, "check", "--driver-user", f"{SA_GPU}={GPU}", str(log))
    assert code == 1, out
    # Exactly the GPU driver's requests the gatekeeper would refuse: the list without a field
    # selector and the slice for another node. Not its allowed ones (the driver is allowed on
    # the node because --driver-user names it).
    bad = [
        e["auditID"]
        for e in events
        if e["stage"] == "ResponseComplete"
        and ((e["requestURI"] == SLICES and e["verb"] == "list") or "node-b" in json.dumps(e))
    ]
    assert len(bad) == 2
    assert changed_ids(out) == bad
    assert all(line.startswith("ALLOW -> FORBID") for line in out.splitlines() if "->" in line)
    assert "not allowed on node" not in out
    assert "6 requests re-decided" in out
    assert "2 newly refused, 0 newly allowed" in out
    assert "2 skipped: user not mapped to a driver" in out  # the NIC driver and the node


async def test_the_gatekeepers_own_log_rechecked_with_its_own_policy_changes_nothing(
    audited: Audited, apiserver: APIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async with audited.unix_session(GPU) as gpu:
        for header in ("Impersonate-User", "Impersonate-Group", "X-Remote-User"):
            refused = await gpu.get("/version", headers={header: "system:admin"})
            assert refused.status == 403
    async with audited.tls_session("evil.example.com") as evil:
        assert (await evil.get("/version")).status == 403  # not a driver of this node
    log = await record_run(audited, apiserver)
    # The policy it ran with: the packaged default plus serve --driver gpu/nic, which the
    # recheck learns from the log itself.
    code, out, _ = run(capsys, "check", str(log))
    assert code == 0, out
    assert changed_ids(out) == []
    assert "0 changed" in out
    assert "3 skipped: refused for a request header" in out
    assert "1 skipped: refused before, allowed now only if the object is the caller's" in out


def test_newly_allowed_names_its_reason_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.log"
    event = apiserver_event("get", "/apis/resource.k8s.io/v1", SA_GPU, code=403)
    log.write_text(json.dumps(event) + "\n")
    code, out, _ = run(capsys, "check", "--driver-user", f"{SA_GPU}={GPU}", str(log))
    assert code == 0
    (line,) = [line for line in out.splitlines() if "->" in line]
    assert line.startswith("FORBID -> ALLOW")
    assert "(allowed: discovery and version paths are open to drivers)" in line
    assert repeated_words(line) == []


def test_an_impersonating_request_in_a_kube_apiserver_log_would_be_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    event = apiserver_event("get", "/apis/resource.k8s.io/v1", SA_GPU, node=NODE)
    event["impersonatedUser"] = {"username": "system:admin", "groups": ["system:masters"]}
    log = tmp_path / "kube-audit.log"
    log.write_text(json.dumps(event) + "\n")
    code, out, _ = run(capsys, "check", "--driver-user", f"{SA_GPU}={GPU}", str(log))
    assert code == 1
    assert "ALLOW -> FORBID" in out and "header Impersonate-User is not allowed" in out


def test_an_empty_or_unmapped_log_exits_3_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_apiserver_log(tmp_path / "kube-audit.log")
    code, out, err = run(capsys, "check", str(log))  # no --driver-user: no driver known
    assert code == 3
    assert "0 requests re-decided" in out and "skipped: user not mapped" in out
    assert err.count("\n") == 1 and "--allow-empty" in err
    code, _, _ = run(capsys, "check", "--allow-empty", str(log))
    assert code == 0
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert run(capsys, "check", str(empty))[0] == 3


def repeated_words(text: str) -> list[str]:
    """Lines where a word (not a count) follows itself, like "allowed: allowed: discovery"."""
    out = []
    for line in text.splitlines():
        words = [word.strip('()[]:,."') for word in line.split()]
        if any(a == b and a and not a.isdigit() for a, b in itertools.pairwise(words)):
            out.append(line)
    return out


async def test_summarize_and_check_never_repeat_a_word(
    audited: Audited, apiserver: APIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await record_run(audited, apiserver)
    code, table, _ = run(capsys, "summarize", str(log))
    assert code == 0 and repeated_words(table) == []
    loose = tmp_path / "loose.yaml"  # no pool rule: the refused create becomes allowed
    loose.write_text(
        (REPO / "gatekeeper" / "policies" / "default.yaml")
        .read_text()
        .replace("        pool: spec.pool.name\n", "")
        .replace("apiserverImmutable: [driver, node, pool]", "apiserverImmutable: [driver, node]")
    )
    code, out, err = run(capsys, "check", "--policy", str(loose), str(log))
    assert code == 0, err
    assert "FORBID -> ALLOW" in out and "(allowed: " in out
    assert repeated_words(out) == []
