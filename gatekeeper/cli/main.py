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
from gatekeeper.limits import add_limit_arguments, limits_from_flags
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
        "what a policy needs: its RBAC ClusterRole",
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
_Group = argparse._ArgumentGroup


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    _add_source_arguments(serve.add_argument_group("this node, its policy and upstream"))
    _add_tls_arguments(serve.add_argument_group("listeners (at least one is required)"))
    add_limit_arguments(serve.add_argument_group("limits (README, Limits)"))
    _add_output_arguments(serve.add_argument_group("audit, health and lifecycle"))


def _add_source_arguments(serve: _Group) -> None:
    """This node, its drivers and policy, the upstream's credentials, the driver sockets."""
    add = serve.add_argument
    add("--node-name", metavar="NAME", help="this node's name; required (default: env NODE_NAME)")
    add(
        "--policy",
        metavar="FILE",
        help="policy file, reloaded when it or a file it includes changes (default: the "
        "packaged policy, packaged:default)",
    )
    add(
        "--driver",
        action="append",
        default=[],
        metavar="NAME",
        help="allow this driver too (repeatable; default: the policy's drivers only)",
    )
    add(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig with the node's credentials (default: env KUBECONFIG, else the "
        "in-cluster service account)",
    )
    add(
        "--node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of this node, for claims allocated by label (repeatable; default: "
        "kubernetes.io/hostname=<node name>)",
    )
    add(
        "--upstream",
        metavar="URL",
        help="the API server URL (default: the kubeconfig's server)",
    )


def _add_tls_arguments(serve: _Group) -> None:
    """The listeners: service-account tokens, driver sockets, and mTLS, with their files."""
    _add_token_arguments(serve)
    add = serve.add_argument
    add(
        "--socket-dir",
        metavar="DIR",
        help="listen on DIR/<driver>/api.sock for each driver (default: no socket listener)",
    )
    add(
        "--socket-group",
        metavar="GROUP",
        help="group (name or gid) owning the driver sockets (0660) and directories (0750), "
        "so a non-root driver in that group can connect (default: the process's group)",
    )
    add(
        "--listen",
        metavar="HOST:PORT",
        help="the mTLS listener, driver = client certificate CN (default: none)",
    )
    add(
        "--tls-cert-file",
        metavar="FILE",
        help="the TLS listeners' serving certificate (PEM), reloaded; required with --listen "
        "and --listen-token",
    )
    add(
        "--tls-key-file",
        metavar="FILE",
        help="the serving certificate's private key (PEM), reloaded; required with --listen "
        "and --listen-token",
    )
    add(
        "--client-ca-file",
        metavar="FILE",
        help="CA that signs driver client certificates (PEM), reloaded; required with --listen",
    )


def _add_token_arguments(serve: _Group) -> None:
    """The token listener: drivers identified by their service-account tokens."""
    add = serve.add_argument
    add(
        "--listen-token",
        metavar="HOST:PORT",
        help="the token listener (TLS): driver = the service account of its bearer token, by "
        "TokenReview, mapped under serviceAccounts in the policy (default: none)",
    )
    add(
        "--token-audience",
        action="append",
        default=[],
        metavar="AUDIENCE",
        help="review tokens for this audience (repeatable; default: the apiserver's own, "
        "which in-cluster tokens carry)",
    )
    add(
        "--token-cache-ttl",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="reuse a positive TokenReview this long at most (counted from when it was asked), "
        "never past the token's expiry: the most a token works after the apiserver stopped "
        "accepting it (default: 2; at most 10)",
    )


def _add_output_arguments(serve: _Group) -> None:
    """Audit log, health listener, shutdown and certificate-expiry warnings."""
    add = serve.add_argument
    add(
        "--audit-log",
        metavar="FILE",
        help="audit log file, or - for stdout (default: none, nothing is audited)",
    )
    add(
        "--audit-level",
        metavar="LEVEL",
        help="Metadata, Request or RequestResponse; needs --audit-log (default Metadata)",
    )
    add(
        "--audit-log-maxsize",
        type=int,
        default=0,
        metavar="MB",
        help="rotate the audit log at this many MB (default 0: never)",
    )
    add(
        "--audit-log-maxbackup",
        type=int,
        default=0,
        metavar="N",
        help="rotated logs to keep (default 0: all)",
    )
    add(
        "--health-listen",
        metavar="HOST:PORT",
        help="serve /healthz, /readyz and /metrics here (default: none)",
    )
    add(
        "--shutdown-grace-period",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, time in-flight requests get to finish (default 30)",
    )
    add(
        "--cert-expiry-warning",
        type=float,
        default=30.0,
        metavar="DAYS",
        help="warn when the serving certificate or client CA expires within this (default 30)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (``serve`` with its flags; other subcommands parse their own)."""
    parser = _Parser(prog="dra-gatekeeper", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dra-gatekeeper {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    _add_serve_arguments(
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
        return _runner(args[0])(args[1:])
    namespace = build_parser().parse_args(args)
    try:
        return _serve(namespace)
    except ConfigError as exc:
        print(f"dra-gatekeeper: {exc}", file=sys.stderr)
        return 2


def _serve(ns: argparse.Namespace) -> int:
    from gatekeeper.server.config import build_serve_config
    from gatekeeper.server.server import GatekeeperServer, run_until_signal

    config = build_serve_config(
        node_name=ns.node_name,
        policy_path=ns.policy,
        drivers=ns.driver,
        node_labels=ns.node_label,
        kubeconfig=ns.kubeconfig,
        upstream=ns.upstream,
        socket_dir=ns.socket_dir,
        listen=ns.listen,
        tls_cert_file=ns.tls_cert_file,
        tls_key_file=ns.tls_key_file,
        client_ca_file=ns.client_ca_file,
        listen_token=ns.listen_token,
        token_audiences=ns.token_audience,
        token_cache_ttl=ns.token_cache_ttl,
        audit_log=ns.audit_log,
        audit_level=ns.audit_level,
        audit_max_size_mb=ns.audit_log_maxsize,
        audit_max_backups=ns.audit_log_maxbackup,
        health_listen=ns.health_listen,
        shutdown_grace=ns.shutdown_grace_period,
        cert_expiry_warning_days=ns.cert_expiry_warning,
        socket_group=ns.socket_group,
        limits=limits_from_flags(ns),
        environ=os.environ,
    )
    server = GatekeeperServer(config)
    run(run_until_signal(server.start, server.stop, server.reloader.reload))
    return 0
