"""Test run output in the ecosystem's conventions: text lines, JSON, GitHub annotations, JUnit XML.

Text: one ``PASS``/``FAIL`` line per case (a failure followed by its differences), then
``N passed, M failed`` alone on the last line. JSON is one document on stdout and nothing else.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from gatekeeper.policytest._model import MalformedTest
from gatekeeper.policytest._runner import CaseResult, RunResult

__all__ = [
    "case_line",
    "diff_lines",
    "github_annotation",
    "github_malformed",
    "run_json",
    "summary_line",
    "write_junit",
    "write_junit_error",
]


def _location(result: CaseResult) -> str:
    return f"{result.file.path}:{result.case.line}"


def case_line(result: CaseResult) -> str:
    """``PASS  file:line  name``, or ``FAIL …`` followed by an indented diff."""
    head = f"{'PASS' if result.passed else 'FAIL'}  {_location(result)}  {result.case.name}"
    if result.passed:
        return head
    return "\n".join([head, *(f"      {line}" for line in diff_lines(result))])


def diff_lines(result: CaseResult) -> list[str]:
    """The differences as ``- expected`` / ``+ actual`` pairs, then what the driver got."""
    width = max(len(m.key) for m in result.mismatches)
    lines: list[str] = []
    for mismatch in result.mismatches:
        lines.append(f"- {mismatch.key.ljust(width)}  {mismatch.expected}")
        lines.append(f"+ {mismatch.key.ljust(width)}  {mismatch.actual}")
    outcome = result.outcome
    if not outcome.error:
        lines.append(
            f"  got: {outcome.code} {outcome.decision or 'no decision'}"
            + (f", reason {json.dumps(outcome.reason)}" if outcome.reason else "")
        )
        if outcome.message and outcome.message != outcome.reason:
            lines.append(f"  message: {json.dumps(outcome.message)}")
        if outcome.forwarded is not None:
            shown = json.dumps(outcome.forwarded.as_dict(), sort_keys=True)
            lines.append(f"  forwarded: {shown}")
        else:
            lines.append("  forwarded: nothing")
    return lines


def summary_line(run: RunResult) -> str:
    return f"{run.passed} passed, {run.failed} failed"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(result: CaseResult) -> str:
    """A GitHub Actions ``::error`` command pointing at the case's line in its file."""
    title = _escape_property(f"policy test failed: {result.case.name}")
    body = _escape_data("\n".join(diff_lines(result)))
    return f"::error file={result.file.path},line={result.case.line},title={title}::{body}"


def github_malformed(error: MalformedTest) -> str:
    line = f",line={error.line}" if error.line else ""
    title = _escape_property("malformed policy test")
    return f"::error file={error.path}{line},title={title}::{_escape_data(str(error))}"


def _case_json(result: CaseResult) -> dict[str, Any]:
    expect = result.case.expect
    expected: dict[str, Any] = {"allowed": expect.allowed}
    if expect.code is not None:
        expected["code"] = expect.code
    if expect.reason is not None:
        expected["reason"] = expect.reason.pattern
    if expect.message is not None:
        expected["message"] = expect.message.pattern
    outcome = result.outcome
    return {
        "file": result.file.path,
        "line": result.case.line,
        "name": result.case.name,
        "driver": result.case.driver,
        "passed": result.passed,
        "expected": expected,
        "actual": {
            "code": outcome.code,
            "decision": outcome.decision,
            "reason": outcome.reason,
            "message": outcome.message,
            "forwarded": None if outcome.forwarded is None else outcome.forwarded.as_dict(),
            "error": outcome.error,
        },
        "differences": [
            {"key": m.key, "expected": m.expected, "actual": m.actual} for m in result.mismatches
        ],
        "seconds": round(outcome.seconds, 6),
    }


def run_json(run: RunResult) -> dict[str, Any]:
    """The ``--output json`` document."""
    return {
        "passed": run.passed,
        "failed": run.failed,
        "seconds": round(run.seconds, 3),
        "cases": [_case_json(result) for result in run.results],
    }


def write_junit(run: RunResult, path: str) -> None:
    """JUnit XML: one ``testsuite`` per test file, one ``testcase`` per case."""
    root = ET.Element("testsuites", name="dra-gatekeeper test")
    _counts(root, run.results, run.seconds)
    by_file: dict[str, list[CaseResult]] = {}
    for result in run.results:
        by_file.setdefault(result.file.path, []).append(result)
    for file_path, results in by_file.items():
        suite = ET.SubElement(root, "testsuite", name=file_path)
        _counts(suite, results, sum(r.outcome.seconds for r in results))
        for result in results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=file_path,
                name=result.case.name,
                file=file_path,
                line=str(result.case.line),
                time=f"{result.outcome.seconds:.6f}",
            )
            if not result.passed:
                failure = ET.SubElement(
                    case,
                    "failure",
                    message="; ".join(
                        f"{m.key}: expected {m.expected}, got {m.actual}" for m in result.mismatches
                    ),
                    type="PolicyTestFailure",
                )
                failure.text = "\n".join(diff_lines(result))
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_junit_error(error: MalformedTest, path: str) -> None:
    """JUnit XML for a run stopped by a malformed file: one test case in error, at its line."""
    root = ET.Element("testsuites", name="dra-gatekeeper test", tests="1", failures="0")
    root.set("errors", "1")
    suite = ET.SubElement(root, "testsuite", name=error.path, tests="1", failures="0", errors="1")
    case = ET.SubElement(
        suite,
        "testcase",
        classname=error.path,
        name=error.case or "(test file)",
        file=error.path,
        line=str(error.line),
    )
    ET.SubElement(case, "error", message=str(error), type="MalformedTest")
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _counts(element: ET.Element, results: Iterable[CaseResult], seconds: float) -> None:
    results = list(results)
    element.set("tests", str(len(results)))
    element.set("failures", str(sum(not r.passed for r in results)))
    element.set("errors", "0")
    element.set("skipped", "0")
    element.set("time", f"{seconds:.6f}")
