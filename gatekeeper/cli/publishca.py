"""``dra-gatekeeper publish-ca``: keep the gatekeeper's CA bundle in a ConfigMap of every
namespace whose ServiceAccount the policy maps to a driver
(docs/operating.md#getting-the-ca-to-drivers).

A command of its own, run once per cluster (a one-replica Deployment, or ``--once`` as a Job),
rather than a ``serve`` flag: one writer instead of one per node, and ConfigMap write rights
kept off the per-node gatekeepers' credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gatekeeper.errors import ConfigError
from gatekeeper.server.capublisher import PublishConfig, Publisher
from gatekeeper.upstream.kubeconfig import resolve_upstream
from gatekeeper.usage import UsageParser

__all__ = ["run_publish_ca_command"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DESCRIPTION = (
    "Keep ConfigMap NAME (key ca.crt: every CA certificate of --ca-dir/*.crt) current in each "
    "namespace of a ServiceAccount the policy maps to a driver; re-read when the policy or a CA "
    "file changes, and put back every --resync-period seconds."
)


class _Parser(UsageParser):
    command = "dra-gatekeeper publish-ca"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dra-gatekeeper publish-ca", description=_DESCRIPTION)
    parser.add_argument("--ca-dir", required=True, metavar="DIR", help="the CA certificates")
    parser.add_argument("--policy", metavar="FILE", help="default: the packaged default policy")
    parser.add_argument("--configmap", default="dra-gatekeeper-ca", metavar="NAME")
    parser.add_argument("--kubeconfig", metavar="FILE", help="or env KUBECONFIG; else in-cluster")
    parser.add_argument("--resync-period", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--bind-role",
        metavar="CLUSTERROLE",
        help="also keep a RoleBinding of this ClusterRole (the policy's DriverNamespace rights, "
        "`policy rbac` names it) to --bind-service-account in each of those namespaces",
    )
    parser.add_argument(
        "--bind-service-account",
        metavar="NAMESPACE/NAME",
        help="the gatekeepers' ServiceAccount the RoleBindings name (with --bind-role)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="reconcile once; exit 0 if every ConfigMap is current, else 1",
    )
    return parser


def _config(ns: argparse.Namespace) -> PublishConfig:
    if not _NAME.fullmatch(ns.configmap):
        raise ConfigError(f"--configmap {ns.configmap!r} is not a valid ConfigMap name")
    if not 1 <= ns.resync_period <= 86400:
        raise ConfigError("--resync-period must be between 1 and 86400 seconds")
    ca_dir = Path(ns.ca_dir)
    if not ca_dir.is_dir():
        raise ConfigError(f"--ca-dir {ca_dir}: not a directory")
    subject: tuple[str, str] = ("", "")
    if ns.bind_role is not None:
        if not _NAME.fullmatch(ns.bind_role.replace(":", ".")):
            raise ConfigError(f"--bind-role {ns.bind_role!r} is not a valid ClusterRole name")
        namespace, _, account = (ns.bind_service_account or "").partition("/")
        if not namespace or not account or "/" in account:
            raise ConfigError("--bind-role needs --bind-service-account NAMESPACE/NAME")
        subject = (namespace, account)
    elif ns.bind_service_account is not None:
        raise ConfigError("--bind-service-account needs --bind-role CLUSTERROLE")
    upstream = resolve_upstream(kubeconfig=ns.kubeconfig, upstream=None, environ=os.environ)
    return PublishConfig(
        upstream=upstream,
        policy=ns.policy,
        ca_dir=ca_dir,
        configmap=ns.configmap,
        resync_seconds=ns.resync_period,
        bind_role=ns.bind_role,
        bind_subject=subject,
    )


def run_publish_ca_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper publish-ca ARGS``: 2 with one line on a bad flag or file (before
    anything is written); with ``--once`` 0 or 1, else 0 on SIGTERM/SIGINT."""
    ns = _parser().parse_args(list(args))
    try:
        publisher = Publisher(_config(ns))
    except ConfigError as exc:
        print(f"dra-gatekeeper publish-ca: {exc}", file=sys.stderr)
        return 2
    if ns.once:
        return 0 if asyncio.run(publisher.once()) else 1
    asyncio.run(_until_signal(publisher))
    return 0


async def _until_signal(publisher: Publisher) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await publisher.run(stopping)
