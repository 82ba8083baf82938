"""The ``dra-gatekeeper`` command line: one entry per subcommand, each in its own module."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from gatekeeper import __version__
from gatekeeper.errors import ConfigError
from gatekeeper.server.flags import add_serve_flags
from gatekeeper.server.runtime import run
from gatekeeper.usage import UsageParser

__all__ = ["COMMANDS", "build_parser", "main"]

log = logging.getLogger("gatekeeper")

_DESCRIPTION = (
    "A per-node authorization proxy between Kubernetes DRA drivers and the kube-apiserver. "
    "Run 'dra-gatekeeper COMMAND --help' for a command's flags."
)

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "gatekeeper.cli.demo:run_demo_command",
        "embedded API server + gatekeeper, ready to try",
    ),
    "certs": (
        "gatekeeper.cli.certs:run_certs_command",
        "create a CA, issue driver/server certificates, show one",
    ),
    "audit": (
        "gatekeeper.audit.tools.cli:run_audit_command",
        "summarize, check or generate a policy from audit logs",
    ),
    "policy": (
        "gatekeeper.cli.rbac:run_policy_command",
        "what a policy needs: its RBAC, admission policy, APF objects, chart values",
    ),
    "publish-ca": (
        "gatekeeper.cli.publishca:run_publish_ca_command",
        "keep the CA's ConfigMap current in the drivers' namespaces",
    ),
    "signer": (
        "gatekeeper.cli.signer:run_signer_command",
        "sign each gatekeeper's serving certificate for its own node (one per cluster)",
    ),
    "test": (
        "gatekeeper.policytest:run_test_command",
        "run policy test files (*_test.yaml) through a real gatekeeper",
    ),
}
"""Subcommands other than ``serve``: name → ("module:function(args) -> exit code", help)."""


class _Parser(UsageParser):
    command = "dra-gatekeeper"


_SERVE_DESCRIPTION = (
    "Run the gatekeeper on this node. Required: --node-name (or env NODE_NAME) and at least one "
    "listener: --listen-token HOST:PORT (drivers keep their service-account token and "
    "in-cluster config) with --tls-cert-file and --tls-key-file; --socket-dir DIR; or --listen "
    "HOST:PORT with --tls-cert-file, --tls-key-file and --client-ca-file. Every flag and file "
    "is checked before anything listens (exit 2 with one line on a problem)."
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (``serve`` with its flags; other subcommands parse their own)."""
    parser = _Parser(prog="dra-gatekeeper", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dra-gatekeeper {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    add_serve_flags(
        commands.add_parser(
            "serve", help="run the gatekeeper on this node", description=_SERVE_DESCRIPTION
        )
    )
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, help=text, add_help=False).add_argument(
            "args", nargs=argparse.REMAINDER
        )
    return parser


def _runner(name: str) -> Callable[[Sequence[str]], int]:
    target = COMMANDS[name][0]
    module, _, function = target.partition(":")
    run: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), function)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in COMMANDS:
        try:
            return _runner(args[0])(args[1:])
        except BrokenPipeError:
            return _reader_gone()
    namespace = build_parser().parse_args(args)
    try:
        return _serve(namespace)
    except ConfigError as exc:
        print(f"dra-gatekeeper: {exc}", file=sys.stderr)
        return 2


def _reader_gone() -> int:
    """Whoever read the output stopped (``… | head``): not a fault of the command, so no
    traceback; exit as a shell reports a process ended by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not raise again
    return 128 + 13


def _serve(ns: argparse.Namespace) -> int:
    from gatekeeper.server.config import build_serve_config
    from gatekeeper.server.server import GatekeeperServer, run_until_signal

    flags = {key: value for key, value in vars(ns).items() if key != "command"}
    config = build_serve_config(flags, environ=os.environ)
    server = GatekeeperServer(config)
    run(run_until_signal(server.start, server.stop, server.reloader.reload))
    return 0
