"""The ``serve`` flags, once: each one's name, value, default, help, the check of its value and
the words of the docs' flag table. The parser (:func:`add_serve_flags`), the checked values
(:func:`read_flags`, read by :func:`~gatekeeper.server.config.build_serve_config`), the limits
(:func:`limits_from`) and the docs' table (:func:`flag_table`) all come from :data:`SERVE_FLAGS`.

``python -m gatekeeper.server.flags FILE...`` writes the table between the
``<!-- serve-flags:begin -->`` and ``<!-- serve-flags:end -->`` lines of each file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from gatekeeper.errors import ConfigError
from gatekeeper.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "MAX_TOKEN_CACHE",
    "SERVE_FLAGS",
    "TABLE_BEGIN",
    "TABLE_END",
    "Check",
    "Flag",
    "FlagValues",
    "Group",
    "Value",
    "add_serve_flags",
    "flag_table",
    "limits_from",
    "parse_host_port",
    "read_flags",
    "write_flag_tables",
]

TABLE_BEGIN = "<!-- serve-flags:begin (python -m gatekeeper.server.flags writes it) -->"
TABLE_END = "<!-- serve-flags:end -->"

Value = str | int | float | list[str] | tuple[str, int] | None
Check = Callable[["Flag", Value], Value]
"""Checks one flag's value: the value to use (converted), or ConfigError naming the flag."""


class Group(Enum):
    """The sections of ``serve --help``, in order."""

    SOURCE = "this node, its policy and upstream"
    LISTENERS = "listeners (at least one is required)"
    LIMITS = "limits (docs/operating.md#limits)"
    OUTPUT = "audit, health and lifecycle"


@dataclass(frozen=True, slots=True)
class Flag:
    """One ``serve`` flag."""

    name: str
    """``--node-name``: also the value's key (``node_name``), as argparse's dest."""
    metavar: str
    help: str
    """``serve --help``'s words (a limit's gets its default appended)."""
    group: Group
    kind: type[str] | type[int] | type[float] = str
    default: Value = None
    repeatable: bool = False
    check: Check | None = None
    limit: str | None = None
    """The :class:`~gatekeeper.limits.Limits` field it sets (default: the field's default)."""
    doc: str = ""
    """The docs table's words, where they say more than ``help``."""

    @property
    def key(self) -> str:
        return self.name[2:].replace("-", "_")


def parse_host_port(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); ConfigError naming ``flag``."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {value!r} must be HOST:PORT (e.g. 127.0.0.1:8443)")
    return host, int(port)


def _host_port(flag: Flag, value: Value) -> Value:
    return None if value is None else parse_host_port(str(value), flag.name)


def _positive(flag: Flag, value: Value) -> Value:
    if isinstance(value, int | float) and value <= 0:
        raise ConfigError(f"{flag.name} must be positive")
    return value


def _not_negative(flag: Flag, value: Value) -> Value:
    if isinstance(value, int | float) and value < 0:
        raise ConfigError(f"{flag.name} must not be negative")
    return value


MAX_TOKEN_CACHE = 10.0
"""The apiserver's own token cache keeps a deleted pod's token working about 10 s: the
gatekeeper never more than doubles that (docs/security.md)."""


def _token_cache_ttl(flag: Flag, value: Value) -> Value:
    if not isinstance(value, int | float) or not 0 <= value <= MAX_TOKEN_CACHE:
        raise ConfigError(
            f"{flag.name} must be between 0 and {MAX_TOKEN_CACHE:g} seconds (a deleted "
            "pod's token must stop working soon)"
        )
    return value


_LIMIT_DEFAULTS: dict[str, int | float] = asdict(DEFAULT_LIMITS)


def _limit(flag: str, field: str, what: str, doc: str = "") -> Flag:
    """A limit's flag: its default, type and metavar are the Limits field's."""
    default = _LIMIT_DEFAULTS[field]
    return Flag(
        flag,
        "SECONDS" if what.startswith("seconds") else "N",
        f"{what} (default {default:g})",
        Group.LIMITS,
        kind=type(default),
        default=default,
        limit=field,
        doc=doc or what,
    )


_SOURCE = (
    Flag("--node-name", "NAME", "this node's name; required (default: env NODE_NAME)",
         Group.SOURCE, doc="this node (or env `NODE_NAME`); required"),
    Flag("--policy", "FILE", "policy file, reloaded when it or a file it includes changes "
         "(default: the packaged policy, packaged:default)", Group.SOURCE,
         doc="the policy (default: the packaged default, `packaged:default`, which is "
         "`gatekeeper/policies/default.yaml`); reloaded when it or a file it includes "
         "changes, and on SIGHUP"),
    Flag("--driver", "NAME", "allow this driver too (repeatable; default: the policy's "
         "drivers only)", Group.SOURCE, default=[], repeatable=True,
         doc="a driver allowed on this node (repeatable; added to the policy's `drivers`, "
         "also after a reload)"),
    Flag("--kubeconfig", "FILE", "kubeconfig with the node's credentials (default: env "
         "KUBECONFIG, else the in-cluster service account)", Group.SOURCE),
    Flag("--node-label", "KEY=VALUE", "a label of this node, for claims allocated by label "
         "(repeatable; default: kubernetes.io/hostname=<node name>)", Group.SOURCE,
         default=[], repeatable=True),
    Flag("--upstream", "URL", "the API server URL (default: the kubeconfig's server)",
         Group.SOURCE),
)  # fmt: skip

_LISTENERS = (
    Flag("--listen-token", "HOST:PORT", "the token listener (TLS): driver = the service "
         "account of its bearer token, by TokenReview, mapped under serviceAccounts in the "
         "policy (default: none)", Group.LISTENERS, check=_host_port,
         doc="token listener (TLS, no client certificate; its certificate requested with "
         "`--token-cert-signer`, or `--tls-cert-file` and `--tls-key-file`): the driver is the "
         "service account of its bearer token, found by "
         "a TokenReview and mapped under `serviceAccounts` in the policy; the policy must map "
         "one (else exit 2)"),
    Flag("--token-audience", "AUDIENCE", "review tokens for this audience (repeatable; "
         "default: the apiserver's own, which in-cluster tokens carry)", Group.LISTENERS,
         default=[], repeatable=True),
    Flag("--token-cache-ttl", "SECONDS", "reuse a positive TokenReview this long at most "
         "(counted from when it was asked), never past the token's expiry: the most a token "
         "works after the apiserver stopped accepting it (default: 2; at most 10)",
         Group.LISTENERS, kind=float, default=2.0, check=_token_cache_ttl,
         doc="reuse a driver's TokenReview at most this long after it was asked, never past "
         "the token's `exp`: the most a token works after the apiserver stopped accepting it "
         "(at most 10; [security.md](security.md#how-long-a-token-works))"),
    Flag("--socket-dir", "DIR", "listen on DIR/<driver>/api.sock for each driver (default: "
         "no socket listener)", Group.LISTENERS,
         doc="listen on `DIR/<driver>/api.sock` for each driver (mode 0660); one gatekeeper "
         "per directory (a second one exits 2)"),
    Flag("--socket-group", "GROUP", "group (name or gid) owning the driver sockets (0660) "
         "and directories (0750), so a non-root driver in that group can connect (default: "
         "the process's group)", Group.LISTENERS),
    Flag("--listen", "HOST:PORT", "the mTLS listener, driver = client certificate CN "
         "(default: none)", Group.LISTENERS, check=_host_port,
         doc="mTLS listener (with `--tls-cert-file`, `--tls-key-file` and "
         "`--client-ca-file`); the driver is the client certificate's CN"),
    Flag("--tls-cert-file", "FILE", "the TLS listeners' serving certificate (PEM), reloaded; "
         "required with --listen, and with --listen-token unless --token-cert-signer",
         Group.LISTENERS),
    Flag("--tls-key-file", "FILE", "the serving certificate's private key (PEM), reloaded; "
         "required with --tls-cert-file", Group.LISTENERS),
    Flag("--token-cert-signer", "NAME", "request the token listener's serving certificate "
         "from the CSR API with this signerName (its key is made in memory, never written; "
         "renewed before expiry) instead of --tls-cert-file (default: none)", Group.LISTENERS,
         doc="the token listener's serving certificate comes from a CertificateSigningRequest "
         "(certificates.k8s.io/v1) of this `signerName`, for the `--token-cert-address` "
         "addresses: its key is made in memory and never written, it is renewed at 60-75 % of "
         "its life without a restart ([Serving certificates](#serving-certificates))"),
    Flag("--token-cert-address", "HOST", "an IP address or DNS name the requested certificate "
         "is for (repeatable; required with --token-cert-signer)", Group.LISTENERS, default=[],
         repeatable=True,
         doc="an address drivers dial (an IP or DNS name; repeatable): the signer signs only "
         "the node's own `status.addresses`, `127.0.0.1` and `::1`"),
    Flag("--token-cert-wait", "SECONDS", "how long to wait for the signer: at start (then "
         "exit 2) and per renewal attempt (default: 180)", Group.LISTENERS, kind=float,
         default=180.0, check=_positive),
    Flag("--client-ca-file", "FILE", "CA that signs driver client certificates (PEM), "
         "reloaded; required with --listen", Group.LISTENERS),
)  # fmt: skip

_LIMITS = (
    _limit("--max-requests-per-driver", "inflight_per_driver",
           "requests of one driver served at once"),
    _limit("--max-watches-per-driver", "watches_per_driver", "open watches of one driver"),
    _limit("--max-filtered-reads-per-driver", "filtered_reads_per_driver",
           "filtered lists and watch primes of one driver read at once"),
    _limit("--max-connections-per-driver", "connections_per_driver",
           "connections of one driver"),
    _limit("--max-connections", "connections_total",
           "connections of all drivers, per listener kind"),
    _limit("--max-unauthenticated-connections", "connections_unauthenticated",
           "connections that are no driver's yet (TLS handshakes), per listener kind"),
    _limit("--max-health-connections", "health_connections",
           "connections to the health listener"),
    _limit("--header-timeout", "header_timeout", "seconds to receive a request's headers",
           doc="seconds to receive a request's headers, from its first byte (and a TLS "
           "handshake, from the connection)"),
    _limit("--body-timeout", "body_timeout", "seconds to receive a request body (then 408)"),
    _limit("--max-body-kib-per-driver", "body_kib_per_driver",
           "request-body KiB per second of one driver, after a burst (then they wait; 429)",
           doc="request-body KiB per second of one driver, after a burst of 8 seconds' worth "
           "(at least 3 MiB); a body past it waits its turn up to --upstream-wait, then 429"),
    _limit("--keepalive-timeout", "keepalive_timeout", "seconds an idle connection stays open"),
    _limit("--upstream-wait", "upstream_wait",
           "seconds to wait for an upstream connection (then 503)"),
    _limit("--upstream-connections", "upstream_requests", "upstream connections for requests"),
    _limit("--upstream-watch-connections", "upstream_watches",
           "upstream connections for watches"),
    _limit("--upstream-review-connections", "upstream_reviews",
           "upstream connections for TokenReviews (the token listener)"),
    _limit("--upstream-connect-timeout", "upstream_connect_timeout",
           "seconds to connect upstream"),
    _limit("--upstream-timeout", "upstream_timeout", "seconds an upstream answer may stall (504)"),
    _limit("--max-token-reviews", "token_reviews", "TokenReviews per second for callers no "
           "driver's token vouched for yet, whole process"),
    _limit("--max-token-reviews-per-source", "token_reviews_per_source", "TokenReviews per "
           "second for such callers from one source address (IPv6: one /64)"),
    _limit("--max-token-reviews-per-connection", "token_reviews_per_connection",
           "TokenReviews per second on one token listener connection"),
    _limit("--max-token-refusals-per-connection", "token_refusals_per_connection",
           "answers per second to refused requests on one token listener connection (then "
           "held)"),
    _limit("--max-token-reviews-per-driver", "token_reviews_per_driver", "TokenReviews per "
           "second kept for each driver's own tokens, connections and addresses"),
)  # fmt: skip

_OUTPUT = (
    Flag("--audit-log", "FILE", "audit log file, or - for stdout (default: none, nothing is "
         "audited)", Group.OUTPUT,
         doc="one `audit.k8s.io/v1` event per request, to FILE or `-` (stdout)"),
    Flag("--audit-level", "LEVEL", "Metadata, Request or RequestResponse; needs --audit-log "
         "(default Metadata)", Group.OUTPUT,
         doc="`Metadata` (the default), `Request` or `RequestResponse`; without `--audit-log` "
         "it is refused (exit 2): it would audit nothing"),
    Flag("--audit-log-maxsize", "MB", "rotate the audit log at this many MB (default 0: "
         "never)", Group.OUTPUT, kind=int, default=0, check=_not_negative),
    Flag("--audit-log-maxbackup", "N", "rotated logs to keep (default 0: all)", Group.OUTPUT,
         kind=int, default=0, check=_not_negative),
    Flag("--health-listen", "HOST:PORT", "serve /healthz, /readyz and /metrics here "
         "(default: none)", Group.OUTPUT, check=_host_port),
    Flag("--shutdown-grace-period", "SECONDS", "on SIGTERM, time in-flight requests get to "
         "finish (default 30)", Group.OUTPUT, kind=float, default=30.0, check=_not_negative),
    Flag("--cert-expiry-warning", "DAYS", "warn when the serving certificate or client CA "
         "expires within this (default 30)", Group.OUTPUT, kind=float, default=30.0),
)  # fmt: skip

SERVE_FLAGS: tuple[Flag, ...] = _SOURCE + _LISTENERS + _LIMITS + _OUTPUT
"""Every ``serve`` flag, in ``--help``'s order."""

_BY_KEY = {flag.key: flag for flag in SERVE_FLAGS}


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Every ``serve`` flag, in its group."""
    for group in Group:
        section = parser.add_argument_group(group.value)
        for flag in SERVE_FLAGS:
            if flag.group is not group:
                continue
            if flag.repeatable:
                section.add_argument(
                    flag.name, action="append", default=[], metavar=flag.metavar, help=flag.help
                )
            elif flag.kind is not str or flag.default is not None:
                section.add_argument(
                    flag.name,
                    type=flag.kind,
                    default=flag.default,
                    metavar=flag.metavar,
                    help=flag.help,
                )
            else:
                section.add_argument(flag.name, metavar=flag.metavar, help=flag.help)


class FlagValues:
    """The ``serve`` flags' values, checked (:func:`read_flags`), read by kind."""

    def __init__(self, values: Mapping[str, Value]) -> None:
        self._values = values

    def _get(self, key: str) -> Value:
        return self._values[_BY_KEY[key].key]

    def text(self, key: str) -> str | None:
        value = self._get(key)
        assert value is None or isinstance(value, str), key
        return value

    def number(self, key: str) -> float:
        value = self._get(key)
        assert isinstance(value, int | float), key
        return value

    def count(self, key: str) -> int:
        value = self._get(key)
        assert isinstance(value, int), key
        return value

    def items(self, key: str) -> list[str]:
        value = self._get(key)
        assert isinstance(value, list), key
        return value

    def address(self, key: str) -> tuple[str, int] | None:
        value = self._get(key)
        assert value is None or isinstance(value, tuple), key
        return value


def read_flags(given: Mapping[str, Value]) -> FlagValues:
    """``given`` (flag keys, as argparse's dests: ``node_name``) over the defaults, each value
    checked by its flag; ConfigError naming the first flag at fault. An unknown key is a bug
    of the caller: ValueError."""
    if unknown := sorted(set(given) - set(_BY_KEY)):
        raise ValueError(f"not serve flags: {', '.join(unknown)}")
    values: dict[str, Value] = {}
    for flag in SERVE_FLAGS:
        value = given.get(flag.key, _copy(flag.default))
        values[flag.key] = flag.check(flag, value) if flag.check is not None else value
    return FlagValues(values)


def _copy(value: Value) -> Value:
    return list(value) if isinstance(value, list) else value


def limits_from(values: FlagValues) -> Limits:
    """The Limits the flags ask for (checked: every bound positive; not yet fitted to the
    descriptors)."""
    # Each value has its field's type: the flag's kind is the field default's.
    chosen: dict[str, Any] = {
        flag.limit: values.number(flag.key) for flag in SERVE_FLAGS if flag.limit
    }
    return replace(DEFAULT_LIMITS, **chosen).check()


def flag_table() -> str:
    """The docs' table of ``serve`` flags (Markdown), one row per flag, grouped as ``--help``."""
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for group in Group:
        for flag in (flag for flag in SERVE_FLAGS if flag.group is group):
            name = f"`{flag.name} {flag.metavar}`".replace("|", "\\|")
            meaning = (flag.doc or flag.help).replace("|", "\\|")
            lines.append(f"| {name} | {_default(flag)} | {meaning} |")
    return "\n".join(lines) + "\n"


def _default(flag: Flag) -> str:
    if flag.repeatable or flag.default is None:
        return ""
    if isinstance(flag.default, float):
        return f"{flag.default:g}"
    return str(flag.default)


def write_flag_tables(paths: Iterable[Path]) -> list[Path]:
    """Write :func:`flag_table` between the markers of each file; the files that changed."""
    changed = []
    for path in paths:
        text = path.read_text()
        before, begin, rest = text.partition(TABLE_BEGIN + "\n")
        _, end, after = rest.partition(TABLE_END)
        if not begin or not end:
            raise ValueError(f"{path}: no {TABLE_BEGIN} ... {TABLE_END} block")
        updated = before + begin + flag_table() + end + after
        if updated != text:
            path.write_text(updated)
            changed.append(path)
    return changed


def _main(args: Sequence[str]) -> int:
    for path in write_flag_tables(Path(arg) for arg in args):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
