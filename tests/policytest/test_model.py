"""Policy test files checked by their schema (policytest.schema.json) and then by what a schema
cannot say: every refusal names the file, the line, the case and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.policytest import MalformedTest, load_test_file

HEAD = "policy: packaged:default\nnode: node-a\ndrivers: [gpu.example.com]\ncases:\n"
CASE = """\
  - name: reads discovery
    driver: gpu.example.com
    request: {method: GET, path: /api}
    expect: {allowed: true, code: 200}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "x_test.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_file_loads(tmp_path: Path) -> None:
    loaded = load_test_file(write(tmp_path, HEAD + CASE))
    (case,) = loaded.cases
    assert (case.name, case.line, case.driver, case.request.target) == (
        "reads discovery",
        5,
        "gpu.example.com",
        "/api",
    )
    assert loaded.policy.drivers >= {"gpu.example.com"}


# (id, text, line, what the message says after "<file>:<line>: ")
REFUSED = [
    (
        "unknown-top-key",
        HEAD.replace("node: node-a\n", "node: node-a\nnodes: [b]\n") + CASE,
        3,
        "nodes: unknown key (allowed: cases, drivers, node, nodeLabels, policy, keys matching ^x-)",
    ),
    ("no-cases", HEAD.replace("cases:\n", ""), 1, "cases: is required"),
    (
        "bad-node",
        HEAD.replace("node-a", "Node_A") + CASE,
        2,
        "node: 'Node_A' is not a node name (a DNS subdomain)",
    ),
    (
        "bad-driver",
        HEAD.replace("[gpu.example.com]", "[gpu.example.com, GPU]") + CASE,
        3,
        "drivers[1]: 'GPU' is not a driver name (a DNS subdomain of at most 63 characters)",
    ),
    (
        "no-driver-nor-token",
        HEAD + CASE.replace("    driver: gpu.example.com\n", ""),
        5,
        'case "reads discovery" driver: is required (or a token: {serviceAccount: …})',
    ),
    (
        "token-node-without-pod",
        HEAD
        + CASE.replace(
            "    driver: gpu.example.com\n",
            "    token: {serviceAccount: gpu/plugin, node: node-b}\n",
        ),
        6,
        'case "reads discovery" token.node: is the node of token.pod: name the pod',
    ),
    (
        "token-account-not-namespaced",
        HEAD
        + CASE.replace("    driver: gpu.example.com\n", "    token: {serviceAccount: plugin}\n"),
        6,
        "case \"reads discovery\" token.serviceAccount: 'plugin' is not namespace/name",
    ),
    (
        "existing-without-a-name",
        HEAD
        + CASE
        + "    existing:\n      - {apiVersion: v1, kind: Pod, metadata: {name: a}}\n"
        + "      - {apiVersion: v1, kind: Pod, metadata: {namespace: b}}\n",
        11,
        'case "reads discovery" existing[1].metadata.name: is required',
    ),
    (
        "a-case-without-a-name",
        HEAD + CASE.replace("  - name: reads discovery\n    driver", "  - driver"),
        5,
        "cases[0].name: is required",
    ),
    (
        "header-value-a-mapping",
        HEAD + CASE.replace("path: /api}", "path: /api, headers: {X-A: {b: c}}}"),
        7,
        'case "reads discovery" request.headers.X-A: must be a string or a number or an '
        "integer or true or false",
    ),
    (
        "forwarded-unknown-key",
        HEAD + CASE.replace("code: 200}", "code: 200, forwarded: {verb: GET}}"),
        8,
        'case "reads discovery" expect.forwarded.verb: unknown key (allowed: body, headers, '
        "method, path, query)",
    ),
    (
        "two-cases-one-name",
        HEAD + CASE + CASE,
        9,
        'case "reads discovery" name: is used by another case of this file',
    ),
    (
        "token-driver-mismatch",
        HEAD
        + CASE.replace(
            "    driver: gpu.example.com\n",
            "    driver: gpu.example.com\n    token: {serviceAccount: gpu/plugin}\n",
        ),
        6,
        'case "reads discovery" driver: is "gpu.example.com", but the policy maps gpu/plugin to '
        '"no driver"',
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_malformed_file_names_its_line_case_and_key(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(MalformedTest) as raised:
        load_test_file(path)
    assert str(raised.value).startswith(f"{path}:{line}: {message}"), str(raised.value)
    assert raised.value.line == line
