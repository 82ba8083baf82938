"""Loading the upstream configuration: kubeconfig, in-cluster, and which of them applies."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.errors import ConfigError
from gatekeeper.upstream.kubeconfig._config import (
    UpstreamConfig,
    check_readable,
    check_server,
    check_token,
)

__all__ = ["IN_CLUSTER_ROOT", "load_in_cluster", "load_kubeconfig", "resolve_upstream"]

IN_CLUSTER_ROOT = "/var/run/secrets/kubernetes.io/serviceaccount"
# User settings we cannot honour. Ignoring them would silently change who we act as, so refuse.
_UNSUPPORTED_USER_KEYS = {
    "exec": "exec credential plugins are not supported; use token, tokenFile or a client cert",
    "auth-provider": "auth-provider plugins are not supported; use token, tokenFile or a cert",
    "username": "basic auth is not supported",
    "password": "basic auth is not supported",
    "as": "impersonation is not supported",
    "as-uid": "impersonation is not supported",
    "as-groups": "impersonation is not supported",
    "as-user-extra": "impersonation is not supported",
}


def resolve_upstream(
    *, kubeconfig: str | None, upstream: str | None, environ: Mapping[str, str]
) -> UpstreamConfig:
    """The upstream for ``serve``: ``--kubeconfig``, else ``$KUBECONFIG``, else in-cluster.

    Of a ``$KUBECONFIG`` list only the first path is read (no merging); ``upstream``
    (``--upstream``) replaces the server.
    """
    if kubeconfig:
        return load_kubeconfig(kubeconfig, server_override=upstream)
    env_paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if env_paths:
        return load_kubeconfig(env_paths[0], server_override=upstream)
    return load_in_cluster(environ=environ, server_override=upstream)


def load_in_cluster(
    *,
    environ: Mapping[str, str] | None = None,
    root: str = IN_CLUSTER_ROOT,
    server_override: str | None = None,
) -> UpstreamConfig:
    """The pod's service account: ``$KUBERNETES_SERVICE_HOST:PORT``, ``root``/token and ca.crt."""
    env = os.environ if environ is None else environ
    if server_override is not None:
        server = check_server(server_override, "--upstream")
    else:
        server = _in_cluster_server(env)
    token_file = os.path.join(root, "token")
    ca_file = os.path.join(root, "ca.crt")
    check_readable(token_file, f"in-cluster config: service account token {token_file}")
    use_ca = server.startswith("https://")
    if use_ca:
        check_readable(ca_file, f"in-cluster config: service account CA {ca_file}")
    return UpstreamConfig(server=server, token_file=token_file, ca_file=ca_file if use_ca else None)


def _in_cluster_server(env: Mapping[str, str]) -> str:
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
            "(not in a pod? pass --kubeconfig)"
        )
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"in-cluster config: KUBERNETES_SERVICE_PORT {port!r} is not a port")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return check_server(f"https://{host}:{port}", "in-cluster config: KUBERNETES_SERVICE_HOST")


def load_kubeconfig(
    path: str, *, context: str | None = None, server_override: str | None = None
) -> UpstreamConfig:
    """Load ``context`` (default: current-context) from the kubeconfig at ``path``.

    Relative file paths are relative to the kubeconfig's directory, as in client-go.
    Every problem is a one-line ConfigError naming the file and the key.
    """
    doc = _read_yaml(path)
    where = _Where(path)
    ctx_name = context or _opt_str(doc, "current-context", where)
    if not ctx_name:
        raise where.error("current-context", "not set and no context given")
    ctx = _named(doc, "contexts", "context", ctx_name, where)
    ctx_key = f"contexts[name={ctx_name}].context"
    cluster_name = _opt_str(ctx, "cluster", where.at(ctx_key))
    if not cluster_name:
        raise where.error(f"{ctx_key}.cluster", "not set")
    cluster = _named(doc, "clusters", "cluster", cluster_name, where)
    cluster_where = where.at(f"clusters[name={cluster_name}].cluster")
    cluster_fields = _cluster_fields(cluster, server_override, cluster_where)
    user_name = _opt_str(ctx, "user", where.at(ctx_key))
    user_fields: dict[str, Any] = {}
    if user_name:
        user = _named(doc, "users", "user", user_name, where)
        user_fields = _user_fields(user, where.at(f"users[name={user_name}].user"))
    return UpstreamConfig(**cluster_fields, **user_fields)


class _Where:
    """The file and key path for error messages."""

    def __init__(self, path: str, key: str = "") -> None:
        self.path = path
        self.key = key
        self.base = os.path.dirname(os.path.abspath(path))

    def at(self, key: str) -> _Where:
        return _Where(self.path, key)

    def error(self, key: str, problem: str) -> ConfigError:
        full = f"{self.key}.{key}" if self.key else key
        return ConfigError(f"kubeconfig {self.path}: {full}: {problem}")

    def resolve(self, file: str) -> str:
        return file if os.path.isabs(file) else os.path.join(self.base, file)


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        raise ConfigError(f"kubeconfig {path}: cannot read: {reason}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        marked = exc if isinstance(exc, yaml.MarkedYAMLError) else None
        mark = marked.problem_mark if marked is not None else None
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = (marked.problem if marked is not None else None) or "syntax error"
        raise ConfigError(f"kubeconfig {path}: not valid YAML{at}: {problem}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (expected a YAML mapping)")
    return doc


def _named(
    doc: Mapping[str, Any], list_key: str, item_key: str, name: str, where: _Where
) -> dict[str, Any]:
    entries = doc.get(list_key) or []
    if not isinstance(entries, list):
        raise where.error(list_key, "must be a list")
    matches = [e for e in entries if isinstance(e, dict) and e.get("name") == name]
    if not matches:
        raise where.error(list_key, f"{item_key} {name!r} not found")
    if len(matches) > 1:
        # Ambiguous: tools disagree on which entry wins, so we pick none.
        raise where.error(list_key, f"{item_key} {name!r} defined more than once")
    body = matches[0].get(item_key)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise where.error(f"{list_key}[name={name}].{item_key}", "must be a mapping")
    return body


def _cluster_fields(
    cluster: Mapping[str, Any], override: str | None, where: _Where
) -> dict[str, Any]:
    if override is not None:
        server = check_server(override, "--upstream")
    else:
        raw = _opt_str(cluster, "server", where)
        if not raw:
            raise where.error("server", "not set")
        server = check_server(raw, f"kubeconfig {where.path}: {where.key}.server")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise where.error("insecure-skip-tls-verify", "must be true or false")
    ca_file = _opt_file(cluster, "certificate-authority", where)
    ca_data = _opt_b64(cluster, "certificate-authority-data", where)
    if ca_file and ca_data:
        raise where.error("certificate-authority", "both it and certificate-authority-data set")
    if insecure and (ca_file or ca_data):
        # client-go refuses this too: a CA with verification off is a contradiction.
        raise where.error(
            "insecure-skip-tls-verify", "cannot be combined with a certificate-authority"
        )
    return {
        "server": server,
        "ca_file": ca_file,
        "ca_data": ca_data,
        "insecure_skip_tls_verify": insecure,
        "tls_server_name": _opt_str(cluster, "tls-server-name", where),
    }


def _user_fields(user: Mapping[str, Any], where: _Where) -> dict[str, Any]:
    for key, why in _UNSUPPORTED_USER_KEYS.items():
        if user.get(key):
            raise where.error(key, why)
    token = _opt_str(user, "token", where)
    if token is not None:
        check_token(token, lambda problem: where.error("token", problem))
    fields_ = {
        "token": token,
        "token_file": _opt_file(user, "tokenFile", where),
        "client_cert_file": _opt_file(user, "client-certificate", where),
        "client_key_file": _opt_file(user, "client-key", where),
        "client_cert_data": _opt_b64(user, "client-certificate-data", where),
        "client_key_data": _opt_b64(user, "client-key-data", where),
    }
    for kind, key in (("cert", "client-certificate"), ("key", "client-key")):
        if fields_[f"client_{kind}_file"] and fields_[f"client_{kind}_data"]:
            raise where.error(key, f"both it and {key}-data set")
    has_cert = bool(fields_["client_cert_file"] or fields_["client_cert_data"])
    has_key = bool(fields_["client_key_file"] or fields_["client_key_data"])
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise where.error(missing, "missing (a client certificate needs both cert and key)")
    return fields_


def _opt_str(mapping: Mapping[str, Any], key: str, where: _Where) -> str | None:
    value = mapping.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise where.error(key, "must be a string")
    return value


def _opt_file(mapping: Mapping[str, Any], key: str, where: _Where) -> str | None:
    value = _opt_str(mapping, key, where)
    if value is None:
        return None
    resolved = where.resolve(value)
    try:
        check_readable(resolved, resolved)
    except ConfigError as exc:
        raise where.error(key, str(exc)) from None
    return resolved


def _opt_b64(mapping: Mapping[str, Any], key: str, where: _Where) -> bytes | None:
    value = _opt_str(mapping, key, where)
    if value is None:
        return None
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise where.error(key, "not valid base64") from None
