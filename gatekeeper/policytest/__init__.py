"""``dra-gatekeeper test``: policy test files run through the real gatekeeper (DESIGN §4.8)."""

from gatekeeper.policytest._cli import run_test, run_test_command
from gatekeeper.policytest._compare import Mismatch, compare
from gatekeeper.policytest._harness import Forwarded, Harness, Outcome
from gatekeeper.policytest._model import (
    TEST_FILE_SUFFIX,
    Expectation,
    ForwardedSpec,
    MalformedTest,
    RequestSpec,
    TestCase,
    TestFile,
    discover,
    load_test_file,
)
from gatekeeper.policytest._runner import CaseResult, RunResult, load_files, run_files

__all__ = [
    "TEST_FILE_SUFFIX",
    "CaseResult",
    "Expectation",
    "Forwarded",
    "ForwardedSpec",
    "Harness",
    "MalformedTest",
    "Mismatch",
    "Outcome",
    "RequestSpec",
    "RunResult",
    "TestCase",
    "TestFile",
    "compare",
    "discover",
    "load_files",
    "load_test_file",
    "run_files",
    "run_test",
    "run_test_command",
]
