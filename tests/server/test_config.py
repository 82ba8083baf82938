"""ServeConfig: one value holding every setting, checked when built (ConfigError, exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gatekeeper.audit import AuditLevel
from gatekeeper.errors import ConfigError
from gatekeeper.listen.tls import ServerTLS
from gatekeeper.policyfile import load_policy
from gatekeeper.server.config import (
    AuditSettings,
    ServeConfig,
    build_serve_config,
    check_socket_dir,
)
from gatekeeper.server.flags import parse_host_port
from gatekeeper.testing.harness import GPU, PKI
from gatekeeper.upstream.kubeconfig import UpstreamConfig


def _flags(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    kubeconfig = tmp_path / "kc-static"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    flags: dict[str, Any] = {
        "node_name": "node-a",
        "driver": [GPU],
        "kubeconfig": str(kubeconfig),
        "socket_dir": str(tmp_path / "sockets"),
    }
    flags.update(overrides)
    return flags


def test_build_serve_config_holds_every_setting(tmp_path: Path, pki: PKI) -> None:
    token = tmp_path / "token"
    token.write_text("node-token\n")
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        f"users: [{{name: u, user: {{tokenFile: {token}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    config = build_serve_config(
        _flags(
            tmp_path,
            kubeconfig=str(kubeconfig),
            listen="127.0.0.1:0",
            tls_cert_file=pki.path("server.crt"),
            tls_key_file=pki.path("server.key"),
            client_ca_file=pki.path("ca.crt"),
            health_listen="[::1]:8081",
            audit_log=str(tmp_path / "audit.log"),
            audit_level="Request",
            audit_log_maxsize=5,
            audit_log_maxbackup=3,
            shutdown_grace_period=7.5,
            cert_expiry_warning=2,
            node_label=["zone=a"],
        ),
        environ={},
    )
    assert config.node_name == "node-a" and config.node_labels == {"zone": "a"}
    assert config.policy.drivers == {GPU} and config.extra_drivers == {GPU}
    assert config.policy_path is None
    assert config.socket_dir == tmp_path / "sockets" and config.socket_dir.is_dir()
    assert config.listen == ("127.0.0.1", 0) and isinstance(config.listen_tls, ServerTLS)
    assert config.health_listen == ("::1", 8081)
    assert config.audit == AuditSettings(str(tmp_path / "audit.log"), AuditLevel.REQUEST, 5, 3)
    assert config.shutdown_grace == 7.5 and config.cert_expiry_warning == 2 * 86400
    # The upstream credentials are loaded with the config, not at the first request.
    assert config.tokens.token() == "node-token" and config.upstream_ssl is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"socket_dir": None}, "at least one listener is required"),
        ({"listen": "127.0.0.1:1"}, "--listen needs --tls-cert-file"),
        ({"audit_log_maxsize": -1}, "--audit-log-maxsize must not be negative"),
        ({"audit_log_maxbackup": -1}, "--audit-log-maxbackup must not be negative"),
        ({"shutdown_grace_period": -1.0}, "--shutdown-grace-period must not be negative"),
        ({"token_cache_ttl": 11.0}, "--token-cache-ttl must be between 0 and 10 seconds"),
        ({"max_connections": 0}, "limit connections_total must be positive, not 0"),
        ({"health_listen": "8081"}, "--health-listen '8081' must be HOST:PORT"),
        ({"driver": ["Not A Driver"]}, "--driver 'Not A Driver' is not a DNS subdomain"),
        ({"driver": []}, "no drivers are allowed on this node"),
    ],
)
def test_bad_settings_are_config_errors(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build_serve_config(_flags(tmp_path, **overrides), environ={})


def test_serve_config_checks_listeners_and_credentials_itself(tmp_path: Path) -> None:
    policy = load_policy(None).with_drivers(frozenset({GPU}))
    upstream = UpstreamConfig(server="http://127.0.0.1:1", token="t")
    with pytest.raises(ConfigError, match="at least one listener"):
        ServeConfig(node_name="n", policy=policy, upstream=upstream)
    with pytest.raises(ConfigError, match="--listen needs"):
        ServeConfig(node_name="n", policy=policy, upstream=upstream, listen=("127.0.0.1", 0))
    missing = UpstreamConfig(server="http://127.0.0.1:1", token_file=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="cannot read"):
        ServeConfig(node_name="n", policy=policy, upstream=missing, socket_dir=tmp_path)


def test_socket_dir_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("")
    with pytest.raises(ConfigError, match=f"--socket-dir {file}: not a directory"):
        check_socket_dir(str(file))
    with pytest.raises(ConfigError, match=r"(?i)not a directory"):
        check_socket_dir(str(file / "below"))
    assert check_socket_dir(str(tmp_path / "new" / "dir")).is_dir()


def test_parse_host_port() -> None:
    assert parse_host_port("[::1]:80", "--x") == ("::1", 80)
    with pytest.raises(ConfigError, match="--x ':80' must be HOST:PORT"):
        parse_host_port(":80", "--x")
