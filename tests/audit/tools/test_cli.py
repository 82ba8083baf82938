"""``dra-gatekeeper audit summarize|check|generate`` on a log recorded from a real run and on a
kube-apiserver-format log."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit.tools.cli import EXIT_EMPTY, run_audit_command
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NIC, Audited
from tests.audit.logs import SA_GPU, SA_NIC, apiserver_event, record_run, write_apiserver_log
from tests.paths import REPO

DEFAULT = str(REPO / "gatekeeper" / "policies" / "default.yaml")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_audit_command(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def policy_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
async def recorded(audited: Audited, apiserver: APIServer) -> Path:
    return await record_run(audited, apiserver)


async def test_summarize_a_recorded_run(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "summarize", "--output", "json", str(recorded))
    assert code == 0
    doc = json.loads(out)
    rows = {(r["driver"], r["verb"], r["resource"]): r for r in doc["rows"]}
    slices = "resourceslices.resource.k8s.io"
    assert rows[(GPU, "create", slices)]["allowed"] == 1
    assert rows[(GPU, "create", slices)]["refused"] == 1
    assert rows[(GPU, "get", slices)] | {"reasons": {}} == {
        "driver": GPU, "verb": "get", "resource": slices, "allowed": 1, "refused": 1, "reasons": {}
    }  # fmt: skip
    assert rows[(GPU, "watch", slices)]["allowed"] == 1  # one request, though two events
    assert rows[(NIC, "get", "/apis/resource.k8s.io/v1")]["allowed"] == 1
    assert doc["requests"] == 11 and doc["events"] == 12
    assert any("not prefixed by node name" in r["reason"] for r in doc["topReasons"])
    assert doc["from"] <= doc["to"]

    code, table, _ = run(capsys, "summarize", str(recorded))
    assert code == 0
    assert table.splitlines()[0].split()[:5] == ["DRIVER", "VERB", "RESOURCE", "ALLOWED", "REFUSED"]
    assert "11 requests (8 allowed, 3 refused)" in table
    assert "Top refusal reasons:" in table


def test_summarize_gzip_stdin_and_apiserver_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = write_apiserver_log(tmp_path / "kube-audit.log")
    zipped = tmp_path / "kube-audit.log.1.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(plain.read_bytes())))
    code, out, _ = run(
        capsys, "summarize", "--output", "json", "--driver-user", f"{SA_GPU}={GPU}",
        str(zipped), "-",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["requests"] == 2 * 6  # the GPU driver's six finished requests, in both files
    assert doc["skippedUsers"] == 2 * 2  # the NIC driver and the node: not mapped
    assert {row["driver"] for row in doc["rows"]} == {GPU}


async def test_check_same_policy_changes_nothing(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "check", "--policy", DEFAULT, "--driver", GPU, "--driver", NIC, str(recorded)
    )
    assert code == 0, out
    assert "0 changed" in out
    # The refused read of another driver's slice: its stored object is not in a Request log.
    assert "10 requests re-decided (" in out
    assert "1 skipped: refused before, allowed now only if the object is the caller's" in out


SLICES_ONLY = """
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gpu.example.com, nic.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      - names: [{version}]
        driver: spec.driver
        node: spec.nodeName
{pool}
"""
POOL_LINE = "        pool: spec.pool.name"


async def test_check_finds_newly_refused_requests(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Slices only in v1beta2: every v1 slice request of the run would now be refused.
    text = SLICES_ONLY.format(version="v1beta2", pool=POOL_LINE)
    code, out, _ = run(capsys, "check", "--policy", policy_file(tmp_path, text), str(recorded))
    assert code == 1
    changed = [line for line in out.splitlines() if line.startswith("ALLOW -> FORBID")]
    assert len(changed) == 7  # list, watch, create, update, patch, get, delete of v1
    assert all("version v1 of resourceslices.resource.k8s.io is not in the policy" in line
               for line in changed)  # fmt: skip
    assert "7 newly refused" in out


async def test_check_finds_newly_allowed_requests(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without the pool rule the refused create (pool "other-gpus") would pass.
    text = SLICES_ONLY.format(version="v1", pool="")
    code, out, _ = run(capsys, "check", "--policy", policy_file(tmp_path, text), str(recorded))
    assert code == 0
    (changed,) = [line for line in out.splitlines() if "->" in line]
    assert changed.startswith("FORBID -> ALLOW") and "create /apis/resource.k8s.io" in changed


def test_check_a_kube_apiserver_log_with_driver_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_apiserver_log(tmp_path / "kube-audit.log")
    code, out, _ = run(
        capsys, "check", "--policy", DEFAULT, "--driver", GPU, "--driver", NIC,
        "--driver-user", f"{SA_GPU}={GPU}", "--driver-user", f"{SA_NIC}={NIC}", str(log),
    )  # fmt: skip
    assert code == 1
    changed = [line for line in out.splitlines() if line.startswith("ALLOW -> FORBID")]
    assert len(changed) == 3
    assert "list /apis/resource.k8s.io/v1/resourceslices  (403: list requires" in changed[0]
    assert 'spec.nodeName "node-b"' in changed[1]
    assert "nodewidgets" in changed[2] and "does not allow this resource" in changed[2]
    assert "1 skipped: user not mapped to a driver" in out


def test_check_without_node_name_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "kube-audit.log"
    lines = write_apiserver_log(tmp_path / "full.log").read_text().splitlines()
    log.write_text(lines[2].replace('"authentication.kubernetes.io/node-name"', '"x"') + "\n")
    args = ["check", "--policy", DEFAULT, "--driver", GPU, "--driver-user", f"{SA_GPU}={GPU}"]
    code, out, err = run(capsys, *args, str(log))
    # Nothing could be re-decided: a CI gate must not pass having checked nothing.
    assert code == EXIT_EMPTY == 3 and "1 skipped: no node name" in out
    assert "no request could be re-decided" in err
    code, out, _ = run(capsys, *args, "--allow-empty", str(log))
    assert code == 0 and "0 requests re-decided" in out
    code, out, _ = run(capsys, *args, "--node-name", "node-a", str(log))
    assert code == 0 and "1 requests re-decided" in out


async def test_generate_round_trips_on_a_recorded_run(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "generated.yaml"
    code, _, _ = run(capsys, "generate", "-o", str(out_path), str(recorded))
    assert code == 0
    policy = load_policy(str(out_path))
    assert policy.drivers == {GPU, NIC}
    (kind,) = policy.kinds.values()
    assert kind.resource == "resourceslices" and set(kind.versions) == {"v1"}
    assert kind.verbs == {"list", "watch", "create", "update", "patch", "get", "delete"}
    code, out, _ = run(capsys, "check", "--policy", str(out_path), str(recorded))
    assert code == 0, out
    assert "0 newly refused" in out


def test_generate_round_trips_on_a_kube_apiserver_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_apiserver_log(tmp_path / "kube-audit.log")
    users = ["--driver-user", f"{SA_GPU}={GPU}", "--driver-user", f"{SA_NIC}={NIC}"]
    code, text, _ = run(capsys, "generate", *users, str(log))
    assert code == 0
    out_path = Path(policy_file(tmp_path, text))
    policy = load_policy(str(out_path))
    widgets = policy.kind_for("example.com", "nodewidgets")
    assert widgets is not None and widgets.kind == "NodeWidget"  # inferred from the objects
    paths = {f.value: ".".join(p) for f, p in widgets.versions["v1"].paths.items()}
    assert paths == {
        "driver": "spec.owner.driverName",
        "node": "spec.node",
        "pool": "metadata.name",
    }
    slices = policy.kind_for("resource.k8s.io", "resourceslices")
    assert slices is not None and slices.list_selector.value == "Inject"  # an unpinned list
    code, out, _ = run(capsys, "check", "--policy", str(out_path), *users, str(log))
    # Only the slice for node-b stays refused: no NodeLocal policy allows another node's slice.
    assert code == 1
    (changed,) = [line for line in out.splitlines() if "->" in line]
    assert 'spec.nodeName "node-b"' in changed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["summarize", "/nonexistent.log"], "cannot read"),
        (["summarize", "--driver-user", "nobody", "x.log"], "USER=DRIVER"),
        (["check", "--policy", "/nonexistent.yaml", "x.log"], "cannot read policy"),
        (["check", "x.log"], "x.log: cannot read"),  # the packaged policy, as serve
        (["check", "--policy", "/nonexistent.yaml", "x.log"], "/nonexistent.yaml"),
        (["summarize", "-", "-"], "stdin"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_generate_on_a_file_that_is_not_an_audit_log_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "not-audit.log"
    log.write_text('hello\n{"kind": "Something"}\n')
    out_path = tmp_path / "generated.yaml"
    code, out, err = run(capsys, "generate", "-o", str(out_path), str(log))
    assert (code, out) == (2, "") and not out_path.exists()
    assert err == (
        f"dra-gatekeeper audit: {log}: no audit.k8s.io/v1 events in 2 lines, 2 not events "
        f"(first at {log}: line 1): not an audit log\n"
    )


def test_generate_without_allowed_driver_requests_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "kube-audit.log"
    log.write_text(json.dumps(apiserver_event("get", "/apis", SA_GPU)) + "\n")
    out_path = tmp_path / "generated.yaml"
    code, out, err = run(capsys, "generate", "-o", str(out_path), str(log))  # SA_GPU not mapped
    assert (code, out) == (EXIT_EMPTY, "") and not out_path.exists()
    assert "no policy written" in err and "has no allowed request of a driver" in err


def test_generate_keeps_own_node_apiserver_immutable_and_pool_separators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GET the DRA slice publisher makes (its own Node) once crashed generate (KeyError)."""
    base = str(Path(DEFAULT).parents[2] / "policies" / "node-dash.yaml")
    users = ["--driver-user", f"{SA_GPU}={GPU}"]
    slice_object = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu"},
        "spec": {"driver": GPU, "nodeName": "node-a", "pool": {"name": "node-a-gpus"}},
    }
    log = tmp_path / "kube-audit.log"
    events = [
        apiserver_event("get", "/api/v1/nodes/node-a", SA_GPU, index=1),
        apiserver_event("create", "/apis/resource.k8s.io/v1/resourceslices", SA_GPU, code=201,
                        request_object=slice_object, index=2),
    ]  # fmt: skip
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    out_path = tmp_path / "generated.yaml"
    code, _, err = run(capsys, "generate", "--base", base, *users, "-o", str(out_path), str(log))
    assert code == 0, err
    policy = load_policy(str(out_path))
    nodes = policy.kind_for("", "nodes")
    assert nodes is not None and nodes.rule.value == "OwnNode" and set(nodes.versions) == {"v1"}
    slices = policy.kind_for("resource.k8s.io", "resourceslices")
    assert slices is not None and slices.pool_separators == ("/", "-")
    immutable = slices.versions["v1"].apiserver_immutable
    assert {f.value for f in immutable} == {"driver", "node", "pool"}
    code, out, _ = run(capsys, "check", "--policy", str(out_path), *users, str(log))
    assert code == 0 and "0 changed" in out, out
