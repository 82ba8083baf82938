"""docs/operating.md#troubleshooting says what a driver sees; this checks it sees exactly that.

Every row of the table is either reproduced here, as a policy test case run through
``dra-gatekeeper test`` (the real pipeline, the embedded API server: the Status a driver gets),
or names the test that asserts its message where a policy test cannot reach it (a TLS
handshake, an expired token, the upstream down). A row added without one, a case for a row
that is gone, or a message reworded on either side fails here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operating.md"

SLICE = "/apis/resource.k8s.io/v1/resourceslices"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
_ALLOCATION = {
    "devices": {
        "results": [{"request": "r", "driver": "gpu.example.com", "pool": "node-a", "device": "d"}]
    },
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]
    },
}
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "mine", "namespace": "default"},
    "spec": {"devices": {"requests": []}},
    "status": {"allocation": _ALLOCATION},
}
OTHERS_CLAIM = {**CLAIM, "metadata": {"name": "theirs", "namespace": "default"}, "status": {}}


def _slice(name: str = "node-a-gpu", **spec: Any) -> dict[str, Any]:
    body = {
        "driver": "gpu.example.com",
        "nodeName": "node-a",
        "pool": {"name": "node-a", **_COUNTS},
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"devices": [], **body},
    }


POLICY = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
serviceAccounts: {gpu.example.com: [gpu-system/gpu-driver]}
kinds:
  - {group: coordination.k8s.io, resource: leases, kind: Lease, scope: Namespaced,
     rule: DriverNamespace, verbs: [get], versions: [{names: [v1]}]}
  - {group: example.com, resource: widgets, kind: Widget, scope: Namespaced,
     rule: DriverCredentials, verbs: [get], versions: [{names: [v1]}]}
overrides:
  - group: ""
    resource: nodes
    verbs: [get, patch]
    versions: [{names: [v1], mayChange: [{path: metadata.labels, keys: ["gpu.example.com/*"]}]}]
  - group: resource.k8s.io
    resource: resourceslices
    verbs: [get, list, watch, create, update, patch, delete]   # CEL: no deletecollection
    validations:
      - name: max-devices
        expression: "!has(object.spec.devices) || size(object.spec.devices) <= 1"
        message: at most one device per slice
"""
"""The packaged default, with a kind of each rule a row needs and a CEL validation."""


def _request(method: str, path: str, **more: Any) -> dict[str, Any]:
    return {"method": method, "path": path, **more}


@dataclass(frozen=True)
class Case:
    """A policy test case reproducing one message of a row."""

    request: dict[str, Any]
    existing: tuple[dict[str, Any], ...] = ()
    token: dict[str, str] | None = None


@dataclass(frozen=True)
class Elsewhere:
    """A row no policy test can reach: the test that asserts its message."""

    test: str
    why: str


_DEEP = "[" * 101 + "]" * 101
_COUNTS = {"generation": 1, "resourceSliceCount": 1}
_JSON = {"Content-Type": "application/json"}
_APPLY = {"Content-Type": "application/apply-patch+yaml"}
ROWS: dict[str, list[Case] | Elsewhere] = {
    "TLS error on connect": Elsewhere(
        "tests/server/test_health.py", "refused at the handshake: there is no HTTP answer"
    ),
    "401 `Unauthorized: …`": Elsewhere(
        "tests/listen/identity/test_peers.py", "a socket whose driver the policy no longer lists"
    ),
    "400 `continue is not accepted for resourceclaims…`": [
        Case(_request("GET", CLAIMS, query={"continue": "x"}))
    ],
    "429 `sends request bodies faster than the … KiB a second`": Elsewhere(
        "tests/proxy/test_budgets.py", "needs a driver's bodies past its byte budget"
    ),
    "429 `waited … behind its own 4 filtered lists or watch primes`": Elsewhere(
        "tests/proxy/test_budgets.py", "needs lists held open concurrently"
    ),
    "401 `Unauthorized: … service account token has expired`": Elsewhere(
        "tests/listen/identity/test_peers.py", "the apiserver's own TokenReview reasons"
    ),
    "403 `service account ns/name is not listed under serviceAccounts`": [
        Case(_request("GET", SLICE + "/node-a-gpu"), token={"serviceAccount": "ns/name"})
    ],
    '403 `the token is bound to a pod on node "b", not this node "a"`': [
        Case(
            _request("GET", SLICE + "/node-a-gpu"),
            token={"serviceAccount": "gpu-system/gpu-driver", "pod": "p", "node": "node-b"},
        )
    ],
    "403 `the token names no node`": [
        Case(
            _request("GET", SLICE + "/node-a-gpu"),
            token={"serviceAccount": "gpu-system/gpu-driver"},
        )
    ],
    "exit 2 `--token-cert-signer: CertificateSigningRequest … was denied by signer": Elsewhere(
        "tests/realcluster/test_signer.py", "the real signer's reasons, answering a real request"
    ),
    "exit 2 `--token-cert-signer: no answer to CertificateSigningRequest": Elsewhere(
        "tests/listen/test_servingcert.py", "serve waiting for a signer that does not answer"
    ),
    "503 `cannot review the driver's token`": Elsewhere(
        "tests/listen/test_token_listener.py", "the TokenReview itself must fail"
    ),
    '403 `driver "x" is not allowed on node`': Elsewhere(
        "tests/policy/test_engine.py", "a certificate naming no driver of the policy"
    ),
    '403 `spec.driver "a" does not match the calling driver "b"`': [
        Case(_request("POST", SLICE, body=_slice(driver="nic.example.com")))
    ],
    '403 `spec.nodeName "n2" does not match this node`': [
        Case(_request("POST", SLICE, body=_slice(nodeName="node-b")))
    ],
    '403 `spec.pool.name "p" is not prefixed by node name`': [
        Case(_request("POST", SLICE, body=_slice(pool={"name": "p", **_COUNTS})))
    ],
    "403 `deletecollection requires fieldSelector metadata.name=<pool>`": [
        Case(
            _request(
                "DELETE",
                POOLS,
                query={"fieldSelector": "spec.driver=gpu.example.com,spec.nodeName=node-a"},
            )
        )
    ],
    "400 `request body is nested more than 100 levels deep`": [
        Case(_request("POST", SLICE, body=_DEEP, headers=_JSON)),
        Case(_request("POST", SLICE, body='{"x": 1e400}', headers=_JSON)),
        Case(_request("PATCH", SLICE + "/node-a-gpu", body="a: &x 1\nb: *x\n", headers=_APPLY)),
        Case(_request("PATCH", SLICE + "/node-a-gpu", body="a: !!binary aGk=\n", headers=_APPLY)),
    ],
    "403 `spec.nodeSelector is set`": [
        Case(_request("POST", SLICE, body=_slice(nodeSelector={"nodeSelectorTerms": []})))
    ],
    "403 `list requires fieldSelector spec.driver=…,spec.nodeName=…`": [
        Case(_request("GET", SLICE))
    ],
    "403 `the stored object's spec.driver …`": [
        Case(
            _request("DELETE", SLICE + "/node-a-nic"),
            (_slice("node-a-nic", driver="nic.example.com"),),
        )
    ],
    "403 `<kind> <version> <validation>: <its message>`": [
        Case(_request("POST", SLICE, body=_slice(devices=[{"name": "a"}, {"name": "b"}])))
    ],
    "403 `CEL cost: the CEL of this request may cost up to … over the budget": Elsewhere(
        "tests/policy/test_cel_cost.py", "needs a policy whose CEL loops over a body's list"
    ),
    "403 `a write may change only … (policy mayChange)`": [
        Case(
            _request("PATCH", "/api/v1/nodes/node-a", body={"metadata": {"labels": {"x": "y"}}}),
            ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}},),
        )
    ],
    "403 `is allowed only in the driver's own namespace`": [
        Case(_request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"))
    ],
    "403 `is forwarded under the driver's own credentials": [
        Case(_request("GET", "/apis/example.com/v1/namespaces/gpu-system/widgets/x"))
    ],
    "403 `the gatekeeper policy does not allow this resource`": [
        Case(_request("GET", "/api/v1/namespaces/default/secrets"))
    ],
    '403 `a driver may only … this node\'s own Node "node-a"`': [
        Case(_request("GET", "/api/v1/nodes/node-b"))
    ],
    "405 `the server does not allow this method on the requested resource`": [
        Case(_request("POST", SLICE + "/node-a-gpu", body=_slice()))
    ],
    "404 on a ResourceClaim that exists": [
        Case(_request("GET", CLAIMS + "/theirs"), (OTHERS_CLAIM,))
    ],
    "403 `status.… differs from the stored object": [
        Case(
            _request(
                "PATCH",
                CLAIMS + "/mine/status",
                body={"status": {"allocation": {"devices": {"results": []}}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ),
            (CLAIM,),
        )
    ],
    "403 `objects allocated to drivers are written only through the status subresource`": [
        Case(
            _request(
                "PATCH",
                CLAIMS + "/mine",
                body={"metadata": {"labels": {"a": "b"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ),
            (CLAIM,),
        )
    ],
    "403 `header Impersonate-User is not allowed`": [
        Case(_request("GET", SLICE + "/node-a-gpu", headers={"Impersonate-User": "admin"}))
    ],
    '400 `query parameter "fieldselector" is not recognized`': [
        Case(_request("GET", SLICE, query={"fieldselector": "spec.driver=gpu.example.com"}))
    ],
    "400 `path segment …`": [
        Case(_request("GET", SLICE + "/../secrets")),
        Case(_request("GET", SLICE + "/node-a%2Fgpu")),
        Case(_request("GET", "/apis//resource.k8s.io/v1/resourceslices")),
        Case(_request("GET", SLICE + "/")),
        Case(_request("GET", SLICE + ";x")),
    ],
    # An update carrying a resourceVersion is forwarded unread (the apiserver answers its 409);
    # a patch is read first, so the gatekeeper answers a stale one itself.
    "409 `the object has been modified`": [
        Case(
            _request(
                "PATCH",
                SLICE + "/node-a-gpu",
                body={"metadata": {"resourceVersion": "999"}},
                headers={"Content-Type": "application/merge-patch+json"},
            ),
            (_slice(),),
        )
    ],
    "413": [Case(_request("POST", SLICE, body="x" * (3 * 1024 * 1024 + 1), headers=_JSON))],
    "415 `accepted media types include: application/json`": [
        Case(_request("POST", SLICE, body="a: b\n", headers={"Content-Type": "application/yaml"}))
    ],
    "400 `the object provided is unrecognized`": Elsewhere(
        "tests/policy/test_encoded.py", "the apiserver decodes protobuf; the embedded one does not"
    ),
    "503 `the upstream API server is unreachable`": Elsewhere(
        "tests/proxy/test_faults.py", "the upstream must be down"
    ),
}


def rows() -> list[tuple[str, str]]:
    """The table's rows: (first cell, the whole row)."""
    text = DOC.read_text()
    table = text[text.index("## Troubleshooting\n") :].split("\n\n")[1]
    found = []
    for line in table.splitlines()[2:]:
        first = line.split(" | ")[0].removeprefix("| ")
        found.append((first, line))
    return found


def _key(first: str) -> str:
    return next((key for key in ROWS if first.startswith(key)), first)


def _fragments(first: str) -> list[str]:
    return re.findall(r"`([^`]+)`", first)


def _pattern(fragment: str) -> str:
    """The fragment as a regex: ``…`` anything; an example value (quoted, or a number) any."""
    out = []
    for part in re.split(r'(…|"[^"]*"|\b\d+\b)', fragment):
        if part == "…":
            out.append(".*")
        elif part.startswith('"') and part.endswith('"') and len(part) >= 2:
            out.append('"[^"]*"')
        elif part.isdigit():
            out.append(r"\d+")
        else:
            out.append(re.escape(part))
    return "".join(out)


def test_every_row_is_reproduced_or_names_its_test() -> None:
    keys = [_key(first) for first, _ in rows()]
    assert sorted(keys) == sorted(ROWS), "rows and ROWS differ"
    for first, row in rows():
        entry = ROWS[_key(first)]
        if isinstance(entry, Elsewhere):
            test = ROOT / entry.test
            assert test.is_file(), entry.test
            fragments = _fragments(row)
            text = test.read_text()
            assert any(re.search(_pattern(f), text, re.S) for f in fragments), (first, entry.test)


def test_the_reproduced_rows_are_what_a_driver_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    cases = []
    for first, _ in rows():
        entry = ROWS[_key(first)]
        if isinstance(entry, Elsewhere):
            continue
        code = int(first.split()[0])
        fragments = _fragments(first)
        for index, case in enumerate(entry):
            expect: dict[str, Any] = {"allowed": False, "code": code}
            if fragments:  # any of the row's messages: a row may list several
                expect["message"] = "|".join(f"(?:{_pattern(f)})" for f in fragments)
            spec: dict[str, Any] = {
                "name": f"{first} #{index}",
                "request": case.request,
                "existing": list(case.existing),
                "expect": expect,
            }
            if case.token:
                spec["token"] = case.token
            else:
                spec["driver"] = "gpu.example.com"
            cases.append(spec)
    test_file = tmp_path / "troubleshooting_test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "policy": "policy.yaml",
                "node": "node-a",
                "drivers": ["gpu.example.com"],
                "cases": cases,
            },
            sort_keys=False,
        )
    )
    code = main(["test", "--output", "json", str(test_file)])
    captured = capsys.readouterr()
    assert captured.out, captured.err
    result = json.loads(captured.out)
    failures = [case for case in _cases(result) if not case["passed"]]
    assert code == 0 and not failures, json.dumps(failures, indent=1)[:6000]


def _cases(result: Any) -> list[dict[str, Any]]:
    if isinstance(result, dict) and "cases" in result:
        return list(result["cases"])
    return [case for file in result.get("files", []) for case in file.get("cases", [])]
