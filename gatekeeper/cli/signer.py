"""``dra-gatekeeper signer``: sign each gatekeeper's token listener certificate for its own
node's addresses only, holding the CA key no worker node holds (docs/operating.md#the-signer).

One replica for the cluster, off the worker nodes (a Deployment on the control plane by
default). Its CA is made at its first start into a Secret only it reads; its certificates are
published in a ConfigMap beside it, which ``publish-ca`` hands to the drivers' namespaces.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.names import is_dns_label, is_dns_subdomain, is_signer_name
from gatekeeper.signer import Signer, SignerConfig, SignerRules
from gatekeeper.upstream.kubeconfig import TokenSource, resolve_upstream
from gatekeeper.upstream.session import UpstreamSession
from gatekeeper.usage import UsageParser

__all__ = ["DEFAULT_SIGNER", "run_signer_command"]

DEFAULT_SIGNER = "dra-gatekeeper.io/token-listener"
_PROG = "dra-gatekeeper signer"
_DESCRIPTION = (
    "Approve and sign the CertificateSigningRequests of --signer-name made by the gatekeeper's "
    "ServiceAccount with a token bound to a pod on node N, for node N's own addresses only; "
    "deny every other one, saying why. The CA key lives in --ca-secret, read through the API."
)


class _Parser(UsageParser):
    command = _PROG


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_PROG, description=_DESCRIPTION)
    parser.add_argument(
        "--signer-name",
        default=DEFAULT_SIGNER,
        metavar="NAME",
        help=f"the signerName answered (default {DEFAULT_SIGNER})",
    )
    parser.add_argument(
        "--gatekeeper-service-account",
        required=True,
        metavar="NAMESPACE/NAME",
        help="the gatekeepers' ServiceAccount: the one requester signed for",
    )
    parser.add_argument(
        "--namespace",
        metavar="NAMESPACE",
        help="where --ca-secret and --ca-configmap are (default: env POD_NAMESPACE)",
    )
    parser.add_argument(
        "--ca-secret",
        default="dra-gatekeeper-signer-ca",
        metavar="NAME",
        help="the Secret holding the CA (made at the first start)",
    )
    parser.add_argument(
        "--ca-configmap",
        default="dra-gatekeeper-ca-certificates",
        metavar="NAME",
        help="the ConfigMap its certificates are published in",
    )
    parser.add_argument(
        "--certificate-lifetime",
        type=int,
        default=7 * 86400,
        metavar="SECONDS",
        help="validity of a signed certificate at most (default 604800, 7 days)",
    )
    parser.add_argument(
        "--ca-lifetime-days",
        type=int,
        default=3650,
        metavar="DAYS",
        help="validity of a CA made at the first start (default 3650)",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="or env KUBECONFIG; else in-cluster")
    parser.add_argument(
        "--resync-period",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="re-read the CA Secret this often (a rotation; default 60)",
    )
    parser.add_argument(
        "--approve-only",
        action="store_true",
        help="approve or deny by the same rules, sign nothing, hold no CA: another signer of "
        "--signer-name signs (cert-manager)",
    )
    return parser


def _config(ns: argparse.Namespace) -> SignerConfig:
    if not is_signer_name(ns.signer_name):
        raise ConfigError(
            f"--signer-name {ns.signer_name!r} is not a signer name (DOMAIN/PATH, not "
            "kubernetes.io's)"
        )
    namespace, _, account = ns.gatekeeper_service_account.partition("/")
    if not is_dns_label(namespace) or not is_dns_subdomain(account):
        raise ConfigError(
            f"--gatekeeper-service-account {ns.gatekeeper_service_account!r} is not NAMESPACE/NAME"
        )
    own = ns.namespace or os.environ.get("POD_NAMESPACE", "")
    if not is_dns_label(own):
        raise ConfigError("--namespace NAMESPACE (or env POD_NAMESPACE) is required")
    for flag, name in (("--ca-secret", ns.ca_secret), ("--ca-configmap", ns.ca_configmap)):
        if not is_dns_subdomain(name):
            raise ConfigError(f"{flag} {name!r} is not a valid name")
    if ns.certificate_lifetime < 60:
        raise ConfigError("--certificate-lifetime must be at least 60 seconds")
    if ns.ca_lifetime_days < 1:
        raise ConfigError("--ca-lifetime-days must be at least 1")
    if not 1 <= ns.resync_period <= 86400:
        raise ConfigError("--resync-period must be between 1 and 86400 seconds")
    rules = SignerRules(
        ns.signer_name, f"system:serviceaccount:{namespace}:{account}", ns.certificate_lifetime
    )
    return SignerConfig(
        rules,
        own,
        ns.ca_secret,
        ns.ca_configmap,
        ns.ca_lifetime_days,
        ns.resync_period,
        approve_only=ns.approve_only,
    )


def run_signer_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper signer ARGS`` until SIGTERM/SIGINT (0); 2 with one line on a bad
    flag, a kubeconfig it cannot use, or a CA Secret it cannot hold a CA in."""
    ns = _parser().parse_args(list(args))
    try:
        config = _config(ns)
        upstream_config = resolve_upstream(
            kubeconfig=ns.kubeconfig, upstream=None, environ=os.environ
        )
        tokens = TokenSource(upstream_config)
    except ConfigError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(config, UpstreamSession(upstream_config, tokens=tokens), tokens))
    except ConfigError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    except UpstreamError as exc:
        print(f"{_PROG}: {exc.message}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: SignerConfig, upstream: UpstreamSession, tokens: TokenSource) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await upstream.start()
    try:
        signer = Signer(config, upstream, tokens)
        await signer.start()
        await signer.run(stopping)
    finally:
        await upstream.close()
