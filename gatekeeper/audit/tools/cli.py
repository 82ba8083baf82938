"""``dra-gatekeeper audit summarize|check|generate``: offline tools over audit logs.

Exit codes: 0 done; 1 ``check`` found a request allowed before that the policy now refuses, or a
write the policy allows that its exported admission policy would refuse;
2 bad input (flags, unreadable log or policy, an input with lines but no audit event: not an
audit log, the same for every subcommand), with one line on stderr; 3 ``check`` could
re-decide no request at all (every one skipped, or an empty log), unless ``--allow-empty``,
or ``generate`` found no traffic a policy can allow (nothing is written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Sequence

from gatekeeper.audit.tools.check import check_records, format_report
from gatekeeper.audit.tools.generate import Examples, generate_policy, generate_tests
from gatekeeper.audit.tools.reader import (
    ReadStats,
    Record,
    iter_events,
    iter_records,
    parse_driver_users,
)
from gatekeeper.audit.tools.summarize import format_table, summarize, summary_json
from gatekeeper.errors import ConfigError
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.usage import UsageParser

__all__ = ["EXIT_EMPTY", "TEST_FILE_SUFFIX", "run_audit_command"]

_PROG = "dra-gatekeeper audit"
EXIT_EMPTY = 3
"""``check`` re-decided nothing: a gate that checked nothing must not pass."""
TEST_FILE_SUFFIX = "_test.yaml"
"""How ``dra-gatekeeper test`` finds test files (``policytest.TEST_FILE_SUFFIX``, a layer above)."""


class _Parser(UsageParser):
    command = _PROG


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_PROG, description="Summarize, check and generate from audit logs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    mapping = _Parser(add_help=False)
    mapping.add_argument(
        "--driver-user",
        action="append",
        default=[],
        metavar="USER=DRIVER",
        help="kube-apiserver logs: this user is that driver (repeatable)",
    )
    summary = commands.add_parser(
        "summarize", parents=[mapping], help="counts per driver, verb and resource"
    )
    summary.add_argument("logs", nargs="+", metavar="FILE", help="log file, .gz, or - for stdin")
    summary.add_argument("--output", choices=("table", "json"), default="table")
    check = commands.add_parser(
        "check", parents=[mapping], help="re-decide recorded requests under a policy"
    )
    check.add_argument(
        "--policy", help="the policy file to test (default: the packaged default policy)"
    )
    check.add_argument(
        "--driver",
        action="append",
        default=[],
        help="also allow this driver, as serve --driver (repeatable; drivers named by "
        "--driver-user and the gatekeeper's own log are allowed too)",
    )
    check.add_argument("--node-name", help="node of requests whose user names none")
    check.add_argument(
        "--admission",
        choices=("refused", "all"),
        default="refused",
        help="lines for the writes the exported admission policy would refuse (default), or "
        "for every write it judges",
    )
    check.add_argument(
        "--allow-empty",
        action="store_true",
        help=f"exit 0 even when no request could be re-decided (default: exit {EXIT_EMPTY})",
    )
    check.add_argument(
        "logs", nargs="+", metavar="LOG", help="audit log (gatekeeper or kube-apiserver), .gz, -"
    )
    generate = commands.add_parser(
        "generate", parents=[mapping], help="least-privilege policy for the observed traffic"
    )
    generate.add_argument("--base", help="policy with the field paths of known kinds")
    generate.add_argument("--node-name", help="node of requests whose user names none")
    generate.add_argument("-o", "--output", default="-", help="write the policy here (default -)")
    generate.add_argument(
        "--tests",
        metavar="FILE",
        help="write the policy's tests here (default: beside -o FILE as <name>_test.yaml; "
        "none when the policy goes to stdout)",
    )
    generate.add_argument(
        "logs", nargs="+", metavar="LOG", help="audit log (gatekeeper or kube-apiserver), .gz, -"
    )
    return parser


def run_audit_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper audit ARGS``; returns the exit code."""
    try:
        ns = _parser().parse_args(list(args))
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    if sum(path == "-" for path in ns.logs) > 1:
        return _fail("stdin (-) can be read only once")
    try:
        users = parse_driver_users(ns.driver_user)
        if ns.command == "summarize":
            return _summarize(ns.logs, users, ns.output)
        if ns.command == "check":
            return _check(ns, users)
        return _generate(ns, users)
    except ConfigError as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        return 0


def _fail(message: str) -> int:
    print(f"{_PROG}: {message}", file=sys.stderr)
    return 2


def _summarize(logs: list[str], users: dict[str, str], output: str) -> int:
    stats = ReadStats()
    summary = summarize(iter_events(logs, stats), users)
    _audit_log_or_fail(", ".join(logs), stats)
    if output == "json":
        json.dump(summary_json(summary, stats), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(summary, stats))
    return 0


def _audit_log_or_fail(source: str, stats: ReadStats) -> None:
    """ConfigError (exit 2) for input with lines but no audit event: not an audit log. An empty
    input is a log of no requests, for each subcommand to judge."""
    if stats.events or not stats.lines:
        return
    where = f" (first at {stats.first_malformed})" if stats.first_malformed else ""
    raise ConfigError(
        f"{source}: no audit.k8s.io/v1 events in {stats.lines} lines, "
        f"{stats.malformed} not events{where}: not an audit log"
    )


def _notes(text: str) -> str:
    notes = [line for line in text.splitlines() if line.startswith("# NOT ALLOWED")]
    return "\n".join(notes) or "# (none: no driver request was allowed)"


def _records(
    logs: list[str], users: dict[str, str], node: str | None, stats: ReadStats | None = None
) -> Iterator[Record]:
    for record in iter_records(logs, users, stats):
        if not record.node and node:
            record = dataclasses.replace(record, node=node)
        yield record


def _check(ns: argparse.Namespace, users: dict[str, str]) -> int:
    # As serve --driver: the named drivers, and those --driver-user maps users to, are
    # allowed on the node in addition to the policy's list.
    policy = load_policy(ns.policy).with_drivers(frozenset(ns.driver) | frozenset(users.values()))
    stats = ReadStats()
    report = check_records(
        _records(ns.logs, users, ns.node_name, stats), policy, every=ns.admission == "all"
    )
    _audit_log_or_fail(", ".join(ns.logs), stats)
    sys.stdout.write(format_report(report))
    if report.newly_refused or report.admission_refused:
        return 1
    if not sum(report.decided.values()) and not ns.allow_empty:
        print(
            f"{_PROG} check: no request could be re-decided, so nothing was checked "
            f"(exit {EXIT_EMPTY}; --allow-empty to accept)",
            file=sys.stderr,
        )
        return EXIT_EMPTY
    return 0


def _generate(ns: argparse.Namespace, users: dict[str, str]) -> int:
    base = load_policy(ns.base)
    source = ", ".join(ns.logs)
    tests = _tests_path(ns.output, ns.tests)
    stats = ReadStats()
    examples = Examples()
    records = examples.tap(_records(ns.logs, users, ns.node_name, stats))
    text = generate_policy(records, base, source=source)
    _audit_log_or_fail(source, stats)
    try:
        policy = parse_policy(text, "the generated policy")
    except ConfigError as exc:
        # Never write a policy that does not load: serve would refuse it at start.
        print(
            f"{_PROG} generate: no policy written: {source} has no allowed request of a driver "
            f"that a policy can allow ({exc}); see the NOT ALLOWED lines:\n{_notes(text)}",
            file=sys.stderr,
        )
        return EXIT_EMPTY
    _write(ns.output, text)
    if tests is not None:
        policy_ref = os.path.relpath(ns.output, os.path.dirname(os.path.abspath(tests)) or ".")
        cases = generate_tests(examples, policy, policy_ref=policy_ref, source=source)
        if cases:
            _write(tests, cases)
        else:
            print(
                f"{_PROG} generate: no tests written to {tests}: the log holds no allowed "
                "request with what a case needs (bodies, stored objects)",
                file=sys.stderr,
            )
    return 0


def _tests_path(output: str, tests: str | None) -> str | None:
    """Where the policy's tests go: ``--tests``, else beside a policy file (``<name>_test.yaml``,
    as ``dra-gatekeeper test`` finds them); ConfigError for tests of a policy on stdout."""
    if output == "-":
        if tests is not None:
            raise ConfigError("--tests needs -o FILE: the test file names the policy file")
        return None
    if tests is not None:
        return str(tests)
    return os.path.splitext(output)[0] + TEST_FILE_SUFFIX


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror}") from exc
