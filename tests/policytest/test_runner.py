"""``dra-gatekeeper test`` itself: failures shown as diffs, malformed files located, the JUnit,
JSON and GitHub outputs, case selection, and independent cases."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gatekeeper.cli.main import main
from gatekeeper.policytest import run_test_command

REPO = Path(__file__).resolve().parents[2]

HEADER = """\
policy: policy.yaml
node: node-a
drivers: [gpu.example.com]
cases:
"""
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = "spec.nodeName=node-a,spec.driver=gpu.example.com"

PASSING = f"""\
  - name: pinned list
    driver: gpu.example.com
    request:
      method: GET
      path: {SLICES}
      query: {{fieldSelector: "{PINNED}"}}
    expect:
      allowed: true
      code: 200
      forwarded: {{method: GET, path: {SLICES}, query: {{fieldSelector: "{PINNED}"}}}}
"""
# Deliberately wrong: a secret is refused with 403, and nothing is forwarded.
WRONG = """\
  - name: secrets expected allowed
    driver: gpu.example.com
    request: {method: GET, path: /api/v1/namespaces/default/secrets}
    expect: {allowed: true, code: 200, reason: "secrets are fine"}
"""
WRONG_FORWARD = f"""\
  - name: wrong selector expected
    driver: gpu.example.com
    request: {{method: GET, path: {SLICES}, query: {{fieldSelector: "{PINNED}"}}}}
    expect:
      allowed: true
      forwarded: {{query: {{fieldSelector: "spec.nodeName=node-b"}}}}
"""


def write_suite(directory: Path, cases: str, name: str = "suite_test.yaml") -> Path:
    shutil.copy(REPO / "gatekeeper" / "policies" / "default.yaml", directory / "policy.yaml")
    path = directory / name
    path.write_text(HEADER + cases)
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = main(["test", *args])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_a_wrong_expectation_fails_with_a_readable_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = write_suite(tmp_path, PASSING + WRONG + WRONG_FORWARD)
    code, out, _ = run(capsys, str(tmp_path))
    assert code == 1
    assert out[-1] == "1 passed, 2 failed"
    assert out[0] == f"PASS  {suite}:{line_of(suite, 'pinned list')}  pinned list"
    start = out.index(
        f"FAIL  {suite}:{line_of(suite, 'secrets expected')}  secrets expected allowed"
    )
    diff = [line.strip() for line in out[start + 1 : start + 10]]
    assert diff[:6] == [
        "- allowed  true",
        "+ allowed  false (forbid)",
        "- code     200",
        "+ code     403",
        "- reason   /secrets are fine/",
        '+ reason   "the gatekeeper policy does not allow this resource"',
    ]
    assert any(line.startswith("message: ") and "is forbidden" in line for line in diff)
    forward = out.index(
        f"FAIL  {suite}:{line_of(suite, 'wrong selector')}  wrong selector expected"
    )
    assert [line.strip() for line in out[forward + 1 : forward + 3]] == [
        '- forwarded.query.fieldSelector  "spec.nodeName=node-b"',
        f'+ forwarded.query.fieldSelector  "{PINNED}"',
    ]


@pytest.mark.parametrize(
    ("cases", "marker", "expected"),
    [
        (
            PASSING.replace("      code: 200\n", "      code: 200\n      allowd: true\n"),
            "allowd",
            'case "pinned list" expect.allowd: unknown key',
        ),
        (
            WRONG.replace('"secrets are fine"', '"(unclosed"'),
            "(unclosed",
            'case "secrets expected allowed" expect.reason: not a regex',
        ),
        (
            WRONG.replace("code: 200", "code: 9000"),
            "9000",
            'case "secrets expected allowed" expect.code: 9000 is not an HTTP status code (100 to '
            "599)",
        ),
        (
            WRONG.replace("method: GET", "method: get"),
            "method: get",
            "case \"secrets expected allowed\" request.method: 'get' is not upper case (GET, "
            "POST, …)",
        ),
        (WRONG + WRONG, "- name: secrets", 'case "secrets expected allowed" name: is used by'),
        (
            PASSING.replace("    driver: gpu.example.com\n", "    driver: a\n    driver: b\n"),
            "driver: b",
            "not valid YAML: duplicate key 'driver'",
        ),
        (
            PASSING.replace("method: GET", "method: GET: x"),
            "GET: x",
            "not valid YAML: mapping values are not allowed",
        ),
        (
            WRONG.replace(
                "    expect:",
                "    existing: [{apiVersion: v1, kind: Secret, metadata: {name: s}}]\n    expect:",
            ),
            "existing:",
            "case \"secrets expected allowed\" existing: Secret 'v1' is not a served kind",
        ),
    ],
    ids=[
        "unknown-key",
        "bad-regex",
        "bad-code",
        "method",
        "duplicate-name",
        "duplicate-key",
        "yaml-syntax",
        "unknown-existing-kind",
    ],
)
def test_a_malformed_file_exits_2_naming_file_line_case_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cases: str, marker: str, expected: str
) -> None:
    suite = write_suite(tmp_path, cases)
    code, out, err = run(capsys, str(suite))
    assert code == 2
    assert not any(line.endswith("failed") for line in out)  # nothing was reported as run
    line = line_of(suite, marker)
    if marker == "- name: secrets":  # the second case of that name
        line = [i for i, t in enumerate(suite.read_text().splitlines(), 1) if marker in t][1]
    assert err.startswith(f"dra-gatekeeper test: {suite}:{line}: {expected}"), err


def test_a_policy_that_does_not_load_exits_2_at_the_policy_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = write_suite(tmp_path, PASSING)
    (tmp_path / "policy.yaml").write_text(
        "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\nkinds: []\n"
    )
    code, _, err = run(capsys, str(suite), "--output", "github")
    assert code == 2
    assert err.startswith(f"dra-gatekeeper test: {suite}:1: policy: ")
    assert f"{tmp_path / 'policy.yaml'}:3: kinds: must be a non-empty list" in err


def test_junit_xml_parses_with_the_right_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_suite(tmp_path, PASSING + WRONG, "a_test.yaml")
    write_suite(tmp_path, PASSING, "b_test.yaml")
    report = tmp_path / "report.xml"
    code, out, _ = run(capsys, str(tmp_path), "--junit-xml", str(report))
    assert code == 1 and out[-1] == "2 passed, 1 failed"
    root = ET.parse(report).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "0")
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert {Path(name).name for name in suites} == {"a_test.yaml", "b_test.yaml"}
    a = next(s for name, s in suites.items() if name.endswith("a_test.yaml"))
    assert (a.get("tests"), a.get("failures")) == ("2", "1")
    failed = [case for case in a.findall("testcase") if case.find("failure") is not None]
    assert [case.get("name") for case in failed] == ["secrets expected allowed"]
    failure = failed[0].find("failure")
    assert failure is not None and "code: expected 200, got 403" in (failure.get("message") or "")
    assert "+ code" in (failure.text or "")


def test_github_annotations_point_at_the_failing_cases_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = write_suite(tmp_path, PASSING + WRONG + WRONG_FORWARD)
    code, out, _ = run(capsys, str(suite), "--output", "github")
    assert code == 1
    annotations = [line for line in out if line.startswith("::error ")]
    assert [a.split("::")[1].split(",title=")[0] for a in annotations] == [
        f"error file={suite},line={line_of(suite, 'secrets expected')}",
        f"error file={suite},line={line_of(suite, 'wrong selector')}",
    ]
    assert "%0A+ code     403" in annotations[0]  # the diff, newlines escaped for GitHub
    assert out[-1] == "1 passed, 2 failed"


def test_json_output_is_one_document_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_suite(tmp_path, PASSING + WRONG)
    code, out, err = run(capsys, str(tmp_path), "--output", "json")
    assert code == 1
    doc = json.loads("\n".join(out))
    assert (doc["passed"], doc["failed"]) == (1, 1)
    wrong = next(case for case in doc["cases"] if not case["passed"])
    assert wrong["actual"]["code"] == 403 and wrong["actual"]["forwarded"] is None
    assert {d["key"] for d in wrong["differences"]} == {"allowed", "code", "reason"}
    passed = next(case for case in doc["cases"] if case["passed"])
    assert passed["actual"]["forwarded"]["query"] == {"fieldSelector": PINNED}
    assert "cases from 1 files" in err  # progress and timing go to stderr


def test_run_selects_cases_and_quiet_prints_only_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_suite(tmp_path, PASSING + WRONG)
    code, out, _ = run(capsys, str(tmp_path), "--run", "^pinned")
    assert code == 0 and out[-1] == "1 passed, 0 failed"
    assert not any("secrets" in line for line in out)
    code, out, _ = run(capsys, str(tmp_path), "-q")
    assert code == 1
    assert [line.split("  ")[0] for line in out if not line.startswith(" ")] == [
        "FAIL",
        "1 passed, 1 failed",
    ]
    code, _, err = run(capsys, str(tmp_path), "--run", "nothing-matches")
    assert code == 2 and "no case matches --run" in err


def test_no_test_files_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(tmp_path))
    assert code == 2 and "no *_test.yaml files" in err


def test_cases_are_independent_the_store_is_reset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create = f"""\
  - name: create
    driver: gpu.example.com
    request:
      method: POST
      path: {SLICES}
      body:
        apiVersion: resource.k8s.io/v1
        kind: ResourceSlice
        metadata: {{name: node-a-gpu}}
        spec: {{driver: gpu.example.com, nodeName: node-a, pool: {{name: node-a}}}}
    expect: {{allowed: true, code: 201}}
  - name: the created slice is gone in the next case
    driver: gpu.example.com
    request: {{method: GET, path: {SLICES}/node-a-gpu}}
    expect: {{allowed: false, code: 404}}
"""
    again = create.replace("name: create", "name: create again").replace("next case", "next")
    write_suite(tmp_path, create + again)
    code, out, _ = run(capsys, str(tmp_path))
    assert (code, out[-1]) == (0, "4 passed, 0 failed")  # the second create finds no conflict


def test_a_malformed_file_still_leaves_a_junit_report_in_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = write_suite(tmp_path, WRONG.replace("code: 200", "code: 9000"))
    report = tmp_path / "report.xml"
    code, _, _ = run(capsys, str(suite), "--junit-xml", str(report))
    assert code == 2
    root = ET.parse(report).getroot()
    assert (root.get("tests"), root.get("errors")) == ("1", "1")
    (case,) = root.iter("testcase")
    assert case.get("line") == str(line_of(suite, "9000"))
    error = case.find("error")
    assert error is not None and "expect.code" in (error.get("message") or "")


def test_the_standalone_entry_point_runs_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = write_suite(tmp_path, PASSING + WRONG)
    assert run_test_command([str(suite), "-q"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 1 failed"
    assert run_test_command(["--frobnicate"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_a_policy_given_as_a_test_file_is_named_a_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = str(Path(__file__).parents[2] / "policies" / "node-dash.yaml")
    line = Path(policy).read_text().splitlines().index("kind: Policy") + 1
    code, out, err = run(capsys, policy)
    assert code == 2 and not any(line.endswith("failed") for line in out)
    assert err.startswith(
        f"dra-gatekeeper test: {policy}:{line}: kind: this is a policy (kind: Policy), not a "
        "test file"
    ), err
    assert "unknown key" not in err
