"""`serve` configuration: every flag, file and certificate checked before anything listens."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.audit import AuditLevel
from gatekeeper.errors import ConfigError
from gatekeeper.kubeconfig import UpstreamConfig, resolve_upstream
from gatekeeper.names import is_dns_subdomain, is_driver_name
from gatekeeper.policy import Policy, load_policy
from gatekeeper.policy.model import ANY_DRIVER
from gatekeeper.selectors import check_label

__all__ = [
    "ServeConfig",
    "build_serve_config",
    "parse_host_port",
    "parse_node_labels",
    "server_ssl_context",
]


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """A complete, checked configuration for ``dra-gatekeeper serve``."""

    node_name: str
    node_labels: Mapping[str, str]
    policy: Policy
    upstream: UpstreamConfig
    socket_dir: Path | None
    listen: tuple[str, int] | None
    listen_ssl: ssl.SSLContext | None
    audit_log: str | None
    audit_level: AuditLevel
    health_listen: tuple[str, int] | None


def build_serve_config(
    *,
    node_name: str | None,
    policy_path: str | None,
    drivers: Sequence[str],
    node_labels: Sequence[str] = (),
    kubeconfig: str | None,
    upstream: str | None,
    socket_dir: str | None,
    listen: str | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    client_ca_file: str | None,
    audit_log: str | None,
    audit_level: str,
    health_listen: str | None,
    environ: Mapping[str, str] = os.environ,
) -> ServeConfig:
    """Check everything ``serve`` was given; ConfigError (exit 2) on the first problem."""
    node = node_name or environ.get("NODE_NAME", "")
    if not node:
        raise ConfigError("--node-name (or env NODE_NAME) is required")
    if not is_dns_subdomain(node):
        raise ConfigError(f"--node-name {node!r} is not a valid node name (DNS subdomain)")
    for name in drivers:
        if name != ANY_DRIVER and not is_driver_name(name):
            raise ConfigError(f"--driver {name!r} is not a DNS subdomain driver name")
    policy = load_policy(policy_path).with_drivers(frozenset(drivers))
    if not policy.drivers:
        raise ConfigError(
            f"{policy.source}: no drivers are allowed on this node: list them under `drivers:` "
            "or pass --driver NAME"
        )
    if socket_dir is None and listen is None:
        raise ConfigError(
            "at least one listener is required: --socket-dir DIR or --listen HOST:PORT"
        )
    if socket_dir is not None and ANY_DRIVER in policy.drivers:
        raise ConfigError('--socket-dir needs named drivers; "*" only works with --listen (mTLS)')
    try:
        level = AuditLevel(audit_level)
    except ValueError:
        raise ConfigError(
            f"--audit-level {audit_level!r} must be one of Metadata, Request, RequestResponse"
        ) from None
    return ServeConfig(
        node_name=node,
        node_labels=parse_node_labels(node_labels),
        policy=policy,
        upstream=resolve_upstream(kubeconfig=kubeconfig, upstream=upstream, environ=environ),
        socket_dir=Path(socket_dir) if socket_dir is not None else None,
        listen=parse_host_port(listen, "--listen") if listen is not None else None,
        listen_ssl=(
            server_ssl_context(tls_cert_file, tls_key_file, client_ca_file)
            if listen is not None
            else None
        ),
        audit_log=audit_log,
        audit_level=level,
        health_listen=(
            parse_host_port(health_listen, "--health-listen") if health_listen is not None else None
        ),
    )


def parse_node_labels(flags: Sequence[str]) -> dict[str, str]:
    """``--node-label KEY=VALUE`` flags as a mapping; ConfigError on a bad or repeated key."""
    labels: dict[str, str] = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            check_label(key, value)
        except ValueError as exc:
            raise ConfigError(
                f"--node-label {flag!r} must be KEY=VALUE with a valid label: {exc}"
            ) from None
        if key in labels:
            raise ConfigError(f"--node-label {key!r} is given twice")
        labels[key] = value
    return labels


def parse_host_port(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {value!r} must be HOST:PORT (e.g. 127.0.0.1:8443)")
    return host, int(port)


def server_ssl_context(
    cert_file: str | None, key_file: str | None, client_ca_file: str | None
) -> ssl.SSLContext:
    """The mTLS listener's context: a verified client certificate is required (DESIGN §4.2)."""
    if not (cert_file and key_file and client_ca_file):
        raise ConfigError(
            "--listen needs --tls-cert-file, --tls-key-file and --client-ca-file (mTLS only)"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A presented certificate must verify (else the handshake fails); a missing one gets a 401
    # Status from the identity step, which a driver author can read (DESIGN §4.2).
    context.verify_mode = ssl.CERT_OPTIONAL
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert-file/--tls-key-file: cannot load: {exc}") from exc
    try:
        context.load_verify_locations(cafile=client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--client-ca-file {client_ca_file}: cannot load: {exc}") from exc
    return context
