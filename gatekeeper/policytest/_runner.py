"""Run policy test files: a gatekeeper and an embedded API server per file, a reset store
per case."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gatekeeper.policytest._compare import Mismatch, compare
from gatekeeper.policytest._harness import Harness, Outcome
from gatekeeper.policytest._model import TestCase, TestFile, load_test_file

__all__ = ["CaseResult", "RunResult", "load_files", "run_files"]


@dataclass(frozen=True, slots=True)
class CaseResult:
    file: TestFile
    case: TestCase
    outcome: Outcome
    mismatches: tuple[Mismatch, ...]

    @property
    def passed(self) -> bool:
        return not self.mismatches


@dataclass(slots=True)
class RunResult:
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed


def load_files(paths: Sequence[str]) -> list[TestFile]:
    """Load every file first, so a malformed one stops the run before anything runs."""
    return [load_test_file(path) for path in paths]


def run_files(
    files: Sequence[TestFile],
    select: re.Pattern[str] | None = None,
    on_result: Callable[[CaseResult], None] = lambda _: None,
) -> RunResult:
    """Run the cases of ``files`` (those whose name ``select`` searches, if given), in order.

    ``on_result`` is called as each case finishes. MalformedTest if an ``existing`` object
    cannot be stored.
    """
    quiet = logging.getLogger("gatekeeper")
    level = quiet.level
    # The gatekeeper logs upstream trouble as warnings; in a test run that is an outcome.
    quiet.setLevel(logging.ERROR)
    try:
        return asyncio.run(_run(files, select, on_result))
    finally:
        quiet.setLevel(level)


async def _run(
    files: Sequence[TestFile],
    select: re.Pattern[str] | None,
    on_result: Callable[[CaseResult], None],
) -> RunResult:
    run = RunResult()
    started = time.perf_counter()
    for test_file in files:
        cases = [c for c in test_file.cases if select is None or select.search(c.name)]
        if not cases:
            continue
        async with Harness(test_file) as harness:
            for case in cases:
                outcome = await harness.run(case)
                result = CaseResult(test_file, case, outcome, tuple(compare(case.expect, outcome)))
                run.results.append(result)
                on_result(result)
    run.seconds = time.perf_counter() - started
    return run
