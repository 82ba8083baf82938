"""`serve` configuration: every setting in one frozen value, every flag and file checked.

:func:`build_serve_config` turns the command line into a :class:`ServeConfig` or raises
:class:`~gatekeeper.errors.ConfigError` (exit 2, one line) before anything listens; the server
is then built from the config alone (:class:`gatekeeper.server.server.GatekeeperServer`).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.audit import AuditLevel
from gatekeeper.codec.selectors import check_label
from gatekeeper.errors import ConfigError
from gatekeeper.limits import DEFAULT_LIMITS, Limits, fit_to_descriptors
from gatekeeper.listen.listeners import resolve_group
from gatekeeper.listen.servingcert import CertRequest
from gatekeeper.listen.tls import ServerTLS, TLSFiles
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.names import is_dns_subdomain, is_driver_name, is_signer_name
from gatekeeper.policy import Policy
from gatekeeper.policy.model import ANY_DRIVER
from gatekeeper.policyfile import load_policy
from gatekeeper.server.flags import FlagValues, Value, limits_from, read_flags
from gatekeeper.upstream.kubeconfig import (
    TokenSource,
    UpstreamConfig,
    build_ssl_context,
    resolve_upstream,
)

__all__ = [
    "AuditSettings",
    "ServeConfig",
    "build_serve_config",
    "check_socket_dir",
    "load_serve_policy",
    "parse_node_labels",
    "server_ssl_context",
    "token_ssl_context",
]

_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """``--audit-log`` (a file, ``-`` for stdout, None for none), level and rotation."""

    path: str | None = None
    level: AuditLevel = AuditLevel.METADATA
    max_size_mb: int = 0
    max_backups: int = 0


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """A complete, checked configuration for ``dra-gatekeeper serve``.

    Constructing it loads the upstream credentials (``tokens``, ``upstream_ssl``): a token
    file or CA that cannot be read is a ConfigError here, not at the first request.
    """

    node_name: str
    policy: Policy
    upstream: UpstreamConfig
    node_labels: Mapping[str, str] = field(default_factory=dict)
    policy_path: str | None = None
    """The policy file, watched for changes; None for the packaged default."""
    extra_drivers: frozenset[str] = frozenset()
    """``--driver`` flags: added to the policy's drivers, also after a reload."""
    socket_dir: Path | None = None
    listen: tuple[str, int] | None = None
    listen_tls: ServerTLS | None = None
    listen_flag: str = "--listen"
    """How the user named ``listen``, for messages (``demo`` takes it as ``--port``)."""
    listen_token: tuple[str, int] | None = None
    """The token listener: drivers identified by their service-account token (TokenReview)."""
    token_tls: ServerTLS | None = None
    """The token listener's serving files; None when its certificate is requested instead."""
    token_cert: CertRequest | None = None
    """The token listener's certificate requested of a signer (``--token-cert-signer``)."""
    token_audiences: tuple[str, ...] = ()
    """Audiences the TokenReview asks for; none: the apiserver's own (in-cluster tokens')."""
    token_cache_ttl: float = 2.0
    """Seconds a positive TokenReview is reused at most, counted from when it was asked (never
    past the token's exp): how much longer than the apiserver the gatekeeper may accept a token
    (docs/security.md, "How long a token works")."""
    health_listen: tuple[str, int] | None = None
    audit: AuditSettings = AuditSettings()
    shutdown_grace: float = 30.0
    """Seconds in-flight requests get to finish after SIGTERM."""
    reload_interval: float = 2.0
    """Seconds between checks of the policy, token and TLS files for changes."""
    readiness_cache: float = 3.0
    """Seconds ``/readyz`` reuses the upstream's last answer."""
    cert_expiry_warning: float = 30 * _DAY
    """Warn (log and metric) when a certificate expires within this many seconds."""
    socket_group: int | None = None
    """``--socket-group``: the gid owning driver sockets and directories."""
    limits: Limits = DEFAULT_LIMITS
    """Per-driver budgets, connection caps and timeouts (docs/operating.md, "Limits")."""
    tokens: TokenSource = field(init=False)
    upstream_ssl: ssl.SSLContext | None = field(init=False)

    def __post_init__(self) -> None:
        if self.socket_dir is None and self.listen is None and self.listen_token is None:
            raise ConfigError(_NO_LISTENER)
        if self.listen is not None and self.listen_tls is None:
            raise ConfigError(
                "--listen needs --tls-cert-file, --tls-key-file and --client-ca-file (mTLS only)"
            )
        if self.listen_token is not None and self.token_tls is None and self.token_cert is None:
            raise ConfigError(_TOKEN_TLS)
        object.__setattr__(self, "tokens", TokenSource(self.upstream))
        object.__setattr__(self, "upstream_ssl", build_ssl_context(self.upstream))

    @property
    def listener_kinds(self) -> frozenset[ListenerKind]:
        """The kinds of listener configured (each has caps of its own)."""
        return _listener_kinds(
            socket_dir=self.socket_dir,
            listen=self.listen,
            listen_token=self.listen_token,
            health_listen=self.health_listen,
        )


def _listener_kinds(**listeners: object) -> frozenset[ListenerKind]:
    flags = {
        "socket_dir": ListenerKind.UNIX,
        "listen": ListenerKind.MTLS,
        "listen_token": ListenerKind.TOKEN,
        "health_listen": ListenerKind.HEALTH,
    }
    return frozenset(kind for name, kind in flags.items() if listeners.get(name) is not None)


_TOKEN_TLS = (
    "--listen-token needs its serving certificate: --token-cert-signer NAME with "
    "--token-cert-address HOST (requested of a signer), or --tls-cert-file and --tls-key-file"
)
_NO_LISTENER = (
    "at least one listener is required: --socket-dir DIR, --listen HOST:PORT (mTLS) or "
    "--listen-token HOST:PORT (service-account tokens)"
)


def build_serve_config(
    flags: Mapping[str, Value], *, environ: Mapping[str, str] = os.environ
) -> ServeConfig:
    """Check everything ``serve`` was given: ``flags`` by their keys (``node_name``; the
    others take their defaults), each value by its flag's own check
    (:data:`~gatekeeper.server.flags.SERVE_FLAGS`), then what they mean together, the files they
    name and the policy. ConfigError (exit 2) on the first problem."""
    values = read_flags(flags)
    drivers = values.items("driver")
    node = _check_node_and_drivers(
        values.text("node_name") or environ.get("NODE_NAME", ""), drivers
    )
    extra = frozenset(drivers)
    policy = load_serve_policy(values.text("policy"), extra)
    _check_listeners(values, policy)
    audit = _audit_settings(values)
    labels = parse_node_labels(values.items("node_label"))
    resolved = resolve_upstream(
        kubeconfig=values.text("kubeconfig"), upstream=values.text("upstream"), environ=environ
    )
    listeners = _listener_settings(values)
    return ServeConfig(
        node_name=node,
        node_labels=labels,
        policy=policy,
        policy_path=values.text("policy"),
        extra_drivers=extra,
        upstream=resolved,
        **listeners,
        token_audiences=tuple(values.items("token_audience")),
        token_cache_ttl=values.number("token_cache_ttl"),
        audit=audit,
        shutdown_grace=values.number("shutdown_grace_period"),
        cert_expiry_warning=values.number("cert_expiry_warning") * _DAY,
        socket_group=resolve_group(values.text("socket_group")),
        limits=fit_to_descriptors(limits_from(values), _listener_kinds(**listeners)),
    )


def _listener_settings(values: FlagValues) -> dict[str, Any]:
    """The listeners' fields of :class:`ServeConfig`, each checked (its files read) in turn."""
    socket_dir, listen, listen_token = (
        values.text("socket_dir"),
        values.address("listen"),
        values.address("listen_token"),
    )
    cert, key = values.text("tls_cert_file"), values.text("tls_key_file")
    client_ca = values.text("client_ca_file")
    token_cert = _token_cert(values)
    if token_cert is not None and listen is None and (cert or key):
        raise ConfigError(
            "--tls-cert-file/--tls-key-file are for --listen (mTLS): the token listener's "
            "certificate is requested (--token-cert-signer)"
        )
    token_files = listen_token is not None and token_cert is None
    return {
        "socket_dir": check_socket_dir(socket_dir) if socket_dir is not None else None,
        "listen": listen,
        "listen_tls": (server_ssl_context(cert, key, client_ca) if listen is not None else None),
        "listen_token": listen_token,
        "token_tls": token_ssl_context(cert, key) if token_files else None,
        "token_cert": token_cert if listen_token is not None else None,
        "health_listen": values.address("health_listen"),
    }


def _token_cert(values: FlagValues) -> CertRequest | None:
    """``--token-cert-signer`` and its addresses, checked; None without the flag."""
    signer, addresses = values.text("token_cert_signer"), values.items("token_cert_address")
    if signer is None:
        if addresses:
            raise ConfigError("--token-cert-address needs --token-cert-signer NAME")
        return None
    if values.address("listen_token") is None:
        raise ConfigError("--token-cert-signer is the token listener's: it needs --listen-token")
    if not is_signer_name(signer):
        raise ConfigError(
            f"--token-cert-signer {signer!r} is not a signer name (DOMAIN/PATH, e.g. "
            "dra-gatekeeper.io/token-listener)"
        )
    if not addresses:
        raise ConfigError(
            "--token-cert-signer needs --token-cert-address HOST: the addresses drivers dial "
            "(the node's status.hostIP, 127.0.0.1)"
        )
    for address in addresses:
        if not _is_address(address):
            raise ConfigError(f"--token-cert-address {address!r} is not an IP address or DNS name")
    return CertRequest(signer, tuple(dict.fromkeys(addresses)), values.number("token_cert_wait"))


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return is_dns_subdomain(value.lower())
    return True


def _check_node_and_drivers(node: str, drivers: Sequence[str]) -> str:
    if not node:
        raise ConfigError("--node-name (or env NODE_NAME) is required")
    if not is_dns_subdomain(node):
        raise ConfigError(f"--node-name {node!r} is not a valid node name (DNS subdomain)")
    for name in drivers:
        if name != ANY_DRIVER and not is_driver_name(name):
            raise ConfigError(f"--driver {name!r} is not a DNS subdomain driver name")
    return node


def _check_listeners(values: FlagValues, policy: Policy) -> None:
    socket_dir, listen_token = values.text("socket_dir"), values.address("listen_token")
    if socket_dir is None and values.address("listen") is None and listen_token is None:
        raise ConfigError(_NO_LISTENER)
    if socket_dir is not None and ANY_DRIVER in policy.drivers:
        raise ConfigError('--socket-dir needs named drivers; "*" only works with --listen (mTLS)')
    if listen_token is not None and not policy.service_accounts:
        raise ConfigError(
            f"--listen-token: {policy.source} maps no service account to a driver: list them "
            "under serviceAccounts: (driver: [namespace/name, ...])"
        )


def _audit_settings(values: FlagValues) -> AuditSettings:
    path, level = values.text("audit_log"), values.text("audit_level")
    if level is None:
        level = AuditLevel.METADATA.value
    elif path is None:
        # Refused, not ignored: an operator who set a level expects an audit log.
        raise ConfigError(
            f"--audit-level {level} needs --audit-log FILE (or - for stdout): without it "
            "nothing is audited"
        )
    try:
        audit_level = AuditLevel(level)
    except ValueError:
        raise ConfigError(
            f"--audit-level {level!r} must be one of Metadata, Request, RequestResponse"
        ) from None
    audit = AuditSettings(
        path, audit_level, values.count("audit_log_maxsize"), values.count("audit_log_maxbackup")
    )
    _check_audit(audit)
    return audit


def load_serve_policy(
    path: str | None, extra_drivers: frozenset[str], *, files_read: list[str] | None = None
) -> Policy:
    """The policy file plus ``--driver`` names; ConfigError if it allows no driver.
    ``files_read`` collects the policy files tried (see :func:`load_policy`)."""
    policy = load_policy(path, files_read=files_read).with_drivers(extra_drivers)
    if not policy.drivers:
        raise ConfigError(
            f"{policy.source}: no drivers are allowed on this node: list them under `drivers:` "
            "or pass --driver NAME"
        )
    return policy


def _check_audit(audit: AuditSettings) -> None:
    if audit.path in (None, "-"):
        return
    directory = os.path.dirname(os.path.abspath(str(audit.path)))
    if not os.path.isdir(directory):
        raise ConfigError(f"--audit-log {audit.path}: directory {directory} does not exist")
    if os.path.isdir(str(audit.path)):
        raise ConfigError(f"--audit-log {audit.path}: is a directory")


def check_socket_dir(value: str) -> Path:
    """``--socket-dir``: a directory the gatekeeper can create sockets in (created if absent)."""
    path = Path(value)
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--socket-dir {value}: not a directory") from None
    except OSError as exc:
        raise ConfigError(f"--socket-dir {value}: cannot create: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise ConfigError(f"--socket-dir {value}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--socket-dir {value}: not writable")
    return path


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


def token_ssl_context(cert_file: str | None, key_file: str | None) -> ServerTLS:
    """The token listener's context: TLS with the serving pair, no client certificate."""
    if not (cert_file and key_file):
        raise ConfigError(_TOKEN_TLS)
    return ServerTLS.load(TLSFiles(cert_file, key_file))


def server_ssl_context(
    cert_file: str | None, key_file: str | None, client_ca_file: str | None
) -> ServerTLS:
    """The mTLS listener's context: a verified client certificate is required (DESIGN §4.2)."""
    if not (cert_file and key_file and client_ca_file):
        raise ConfigError(
            "--listen needs --tls-cert-file, --tls-key-file and --client-ca-file (mTLS only)"
        )
    return ServerTLS.load(TLSFiles(cert_file, key_file, client_ca_file))
