"""The ``dra-gatekeeper`` command line: serve, demo, certs, audit."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from gatekeeper.audit import JsonLinesWriter, NullSink
from gatekeeper.errors import ConfigError
from gatekeeper.policytest import add_test_parser
from gatekeeper.server import GatekeeperServer
from gatekeeper.upstream import Upstream

__all__ = ["main", "run_until_signal"]

log = logging.getLogger("gatekeeper")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"dra-gatekeeper: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dra-gatekeeper", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser("serve", help="run the gatekeeper on this node")
    serve.add_argument("--node-name", help="this node's name (default: env NODE_NAME)")
    serve.add_argument("--policy", help="policy file (default: the packaged default policy)")
    serve.add_argument(
        "--driver", action="append", default=[], help="allow this driver (repeatable)"
    )
    serve.add_argument(
        "--kubeconfig", help="kubeconfig with the node's credentials (or env KUBECONFIG)"
    )
    serve.add_argument(
        "--node-label",
        action="append",
        default=[],
        help="KEY=VALUE: a label of this node, for claims allocated by label (repeatable)",
    )
    serve.add_argument("--upstream", help="override the API server URL from the kubeconfig")
    serve.add_argument("--socket-dir", help="listen on DIR/<driver>/api.sock for each driver")
    serve.add_argument("--listen", help="HOST:PORT for the mTLS listener (driver = client cert CN)")
    serve.add_argument("--tls-cert-file")
    serve.add_argument("--tls-key-file")
    serve.add_argument("--client-ca-file")
    serve.add_argument("--audit-log", help="audit log file, or - for stdout")
    serve.add_argument(
        "--audit-level",
        default="Metadata",
        help="Metadata, Request or RequestResponse (default Metadata)",
    )
    serve.add_argument(
        "--audit-log-maxsize",
        type=int,
        default=0,
        help="rotate the audit log at this many MB (default 0: never)",
    )
    serve.add_argument(
        "--audit-log-maxbackup",
        type=int,
        default=0,
        help="rotated audit logs to keep (default 0: all)",
    )
    serve.add_argument("--health-listen", help="HOST:PORT for /healthz and /readyz")
    commands.add_parser("demo", help="embedded API server + gatekeeper, ready to try")
    add_test_parser(commands)
    for name, text in (
        ("certs", "create a CA and issue driver/server certificates"),
        ("audit", "summarize, check or generate a policy from audit logs"),
    ):
        commands.add_parser(name, help=text, add_help=False).add_argument(
            "args", nargs=argparse.REMAINDER
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["certs"]:
        from gatekeeper.certs import run_certs_command

        return run_certs_command(args[1:])
    if args[:1] == ["audit"]:
        from gatekeeper.audit.cli import run_audit_command

        return run_audit_command(args[1:])
    namespace = _parser().parse_args(args)
    try:
        if namespace.command == "serve":
            return _serve(namespace)
        if namespace.command == "test":
            return int(namespace.run(namespace))
        from gatekeeper.demo import run_demo

        return run_demo()
    except ConfigError as exc:
        print(f"dra-gatekeeper: {exc}", file=sys.stderr)
        return 2


def _serve(ns: argparse.Namespace) -> int:
    from gatekeeper.config import build_serve_config

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
        audit_log=ns.audit_log,
        audit_level=ns.audit_level,
        health_listen=ns.health_listen,
        environ=os.environ,
    )
    try:
        audit = (
            JsonLinesWriter(
                config.audit_log,
                max_size_mb=ns.audit_log_maxsize,
                max_backups=ns.audit_log_maxbackup,
            )
            if config.audit_log
            else NullSink()
        )
    except OSError as exc:
        raise ConfigError(f"--audit-log {config.audit_log}: {exc.strerror}") from exc
    server = GatekeeperServer(
        policy=config.policy,
        node_name=config.node_name,
        node_labels=config.node_labels,
        upstream=Upstream(config.upstream),
        audit=audit,
        audit_level=config.audit_level,
        socket_dir=config.socket_dir,
        listen=config.listen,
        listen_ssl=config.listen_ssl,
        health_listen=config.health_listen,
    )
    log.info(
        "starting node=%s drivers=%s upstream=%s",
        config.node_name,
        ",".join(sorted(config.policy.drivers)),
        config.upstream.server,
    )
    asyncio.run(run_until_signal(server.start, server.stop))
    return 0


async def run_until_signal(start, stop) -> None:  # type: ignore[no-untyped-def]
    """Run ``start()``, wait for SIGINT/SIGTERM, then ``stop()`` (always)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await start()
        await stopping.wait()
    finally:
        await stop()
        log.info("stopped")
