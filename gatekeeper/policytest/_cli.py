"""``dra-gatekeeper test [PATH ...]``: run policy test files and report.

Exit codes: 0 every case passed; 1 a case failed; 2 a malformed test file or policy (the message
names the file, line, case and key), no test files found, or no case matched ``--run``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Sequence

from gatekeeper.policytest._model import TEST_FILE_SUFFIX, MalformedTest, discover
from gatekeeper.policytest._report import (
    case_line,
    github_annotation,
    github_malformed,
    run_json,
    summary_line,
    write_junit,
    write_junit_error,
)
from gatekeeper.policytest._runner import CaseResult, load_files, run_files
from gatekeeper.usage import UsageParser

__all__ = ["run_test", "run_test_command"]

_PROG = "dra-gatekeeper test"


_HELP = "run policy test files (*_test.yaml) through a real gatekeeper"
_DESCRIPTION = (
    f"Run every *{TEST_FILE_SUFFIX} under the given paths through the gatekeeper's real "
    "pipeline in front of the embedded API server."
)


class _Parser(UsageParser):
    command = _PROG


def run_test_command(args: Sequence[str]) -> int:
    """``dra-gatekeeper test ARGS`` with its own parser (for a command table); the exit code."""
    parser = _Parser(prog=_PROG, description=_DESCRIPTION)
    _add_arguments(parser)
    try:
        ns = parser.parse_args(list(args))
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    return run_test(ns)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        default=["."],
        metavar="PATH",
        help=f"test files, or directories searched for *{TEST_FILE_SUFFIX} (default .)",
    )
    parser.add_argument(
        "--output",
        choices=("text", "json", "github"),
        default="text",
        help="text (default); json: one document on stdout; github: text plus "
        "::error annotations at each failing case's line",
    )
    parser.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML report")
    parser.add_argument(
        "--run", dest="run_regex", metavar="REGEX", help="only the cases whose name matches"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="print only failures and the closing line"
    )


def _fail(message: str, output: str, error: MalformedTest | None = None) -> int:
    if output == "github" and error is not None:
        print(github_malformed(error), flush=True)
    print(f"{_PROG}: {message}", file=sys.stderr)
    return 2


def run_test(ns: argparse.Namespace) -> int:
    """Run the ``test`` subcommand for parsed arguments ``ns``; returns the exit code."""
    try:
        select = re.compile(ns.run_regex) if ns.run_regex else None
    except re.error as exc:
        return _fail(f"--run: not a regex: {exc}", ns.output)
    try:
        paths = discover(ns.paths)
        if not paths:
            return _fail(f"no *{TEST_FILE_SUFFIX} files under {' '.join(ns.paths)}", ns.output)
        files = load_files(paths)
        if select is not None and not any(select.search(c.name) for f in files for c in f.cases):
            return _fail(f"no case matches --run {ns.run_regex!r}", ns.output)
        run = run_files(files, select, _printer(ns.output, ns.quiet))
    except MalformedTest as exc:
        if ns.junit_xml:
            with contextlib.suppress(OSError):  # the one-line error below is what counts
                write_junit_error(exc, ns.junit_xml)
        return _fail(str(exc), ns.output, exc)
    if ns.junit_xml:
        try:
            write_junit(run, ns.junit_xml)
        except OSError as exc:
            return _fail(f"--junit-xml {ns.junit_xml}: {exc.strerror}", ns.output)
    per_case = run.seconds / len(run.results) * 1000 if run.results else 0.0
    timing = (
        f"{len(run.results)} cases from {len({r.file.path for r in run.results})} files "
        f"in {run.seconds:.2f} s ({per_case:.1f} ms per case)"
    )
    if ns.output == "json":
        json.dump(run_json(run), sys.stdout, indent=2)
        sys.stdout.write("\n")
        print(timing, file=sys.stderr)
    else:
        if not ns.quiet:
            print(timing)
        print(summary_line(run))
    return 1 if run.failed else 0


def _printer(output: str, quiet: bool) -> Callable[[CaseResult], None]:
    def show(result: CaseResult) -> None:
        if output == "json" or (quiet and result.passed):
            return
        if output == "github" and not result.passed:
            print(github_annotation(result))
        print(case_line(result), flush=True)

    return show
