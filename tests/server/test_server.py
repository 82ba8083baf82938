"""The server: every socket bound before anything listens (exit 2, one line, nothing listening),
what it logs at start, and its listeners' life."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper import __version__
from gatekeeper.apiserver import APIServer
from gatekeeper.cli.main import build_parser
from gatekeeper.errors import ConfigError
from gatekeeper.policy import Policy
from gatekeeper.server.server import GatekeeperServer, socket_path
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE_TOKEN,
    PKI,
    SERVE,
    free_port,
    run_process,
    running_gatekeeper,
    serve_config,
    token_kubeconfig,
)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def refuses_tcp(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def refuses_unix(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return True
    return False


def unwritable_dir(tmp_path: Path) -> str:
    if os.geteuid() == 0:
        return "/sys"  # root writes anywhere but sysfs, where no socket can be created
    path = tmp_path / "ro"
    path.mkdir(mode=0o500)
    return str(path)


def _serve_args(tmp_path: Path, pki: PKI, sockets: str, listen: int, health: int) -> list[str]:
    return [
        *("--node-name", "node-a", "--driver", GPU, "--driver", NIC),
        *("--kubeconfig", token_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")),
        *("--socket-dir", sockets, "--listen", f"127.0.0.1:{listen}"),
        *("--tls-cert-file", pki.path("server.crt"), "--tls-key-file", pki.path("server.key")),
        *("--client-ca-file", pki.path("ca.crt"), "--health-listen", f"127.0.0.1:{health}"),
    ]


@pytest.mark.parametrize(
    "case",
    [
        "socket-dir-is-a-file",
        "socket-dir-unwritable",
        "listen-in-use",
        "health-listen-in-use",
        "tls-cert-missing",
        "client-ca-not-pem",
        "audit-dir-missing",
        "token-file-missing",
    ],
)
async def test_startup_failure_exits_2_with_one_line_and_nothing_listening(
    tmp_path: Path, pki: PKI, busy_port: int, case: str
) -> None:
    sockets, listen, health = str(tmp_path / "sockets"), free_port(), free_port()
    extra: list[str] = []
    expected = ""
    if case == "socket-dir-is-a-file":
        sockets = str(tmp_path / "file")
        Path(sockets).write_text("")
        expected = f"--socket-dir {sockets}: not a directory"
    elif case == "socket-dir-unwritable":
        sockets = unwritable_dir(tmp_path)
        expected = f"--socket-dir {sockets}: cannot create"
    elif case == "listen-in-use":
        listen = busy_port
        expected = f"--listen 127.0.0.1:{busy_port}: cannot listen: Address already in use"
    elif case == "health-listen-in-use":
        health = busy_port
        expected = f"--health-listen 127.0.0.1:{busy_port}: cannot listen: Address already in use"
    elif case == "tls-cert-missing":
        extra = ["--tls-cert-file", str(tmp_path / "missing.crt")]
        expected = f"--tls-cert-file {tmp_path / 'missing.crt'}"
    elif case == "client-ca-not-pem":
        (tmp_path / "ca.pem").write_text("not a certificate\n")
        extra = ["--client-ca-file", str(tmp_path / "ca.pem")]
        expected = f"--client-ca-file {tmp_path / 'ca.pem'}: cannot load"
    elif case == "audit-dir-missing":
        extra = ["--audit-log", str(tmp_path / "nowhere" / "audit.log")]
        expected = f"--audit-log {tmp_path / 'nowhere' / 'audit.log'}: directory"
    elif case == "token-file-missing":
        config = tmp_path / "kc-token"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
            f"users: [{{name: u, user: {{tokenFile: {tmp_path / 'token'}}}}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        extra = ["--kubeconfig", str(config)]
        expected = f"tokenFile: {tmp_path / 'token'}: cannot read"
    args = [*_serve_args(tmp_path, pki, sockets, listen, health), *extra]
    code, err = await run_process(*SERVE, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("dra-gatekeeper: ") and expected in err, err
    assert "Traceback" not in err
    for port in {listen, health} - {busy_port}:
        assert refuses_tcp(port)
    if Path(sockets).is_dir():
        for driver in (GPU, NIC):
            assert refuses_unix(socket_path(Path(sockets), driver))
            assert not socket_path(Path(sockets), driver).exists()


async def test_start_binds_everything_before_listening(
    apiserver: APIServer, policy: Policy, pki: PKI, tmp_path: Path, busy_port: int
) -> None:
    listen = free_port()
    config = serve_config(
        apiserver,
        policy,
        pki,
        tmp_path,
        listen=("127.0.0.1", listen),
        health_listen=("127.0.0.1", busy_port),
    )
    server = GatekeeperServer(config)
    with pytest.raises(ConfigError, match=f"--health-listen 127.0.0.1:{busy_port}"):
        await server.start()
    await server.stop()
    assert refuses_tcp(listen)
    assert refuses_unix(socket_path(tmp_path, GPU))
    assert not socket_path(tmp_path, GPU).exists()
    # The ports are free again: a second server on the same ports starts.
    config = serve_config(apiserver, policy, pki, tmp_path, listen=("127.0.0.1", listen))
    server = GatekeeperServer(config)
    await server.start()
    try:
        assert server.tls_port == listen and not refuses_tcp(listen)
        assert not refuses_unix(socket_path(tmp_path, GPU))
    finally:
        await server.stop()


async def test_start_logs_version_node_drivers_listeners_and_kinds(
    apiserver: APIServer, policy: Policy, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gatekeeper.server")
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0)
    ) as running:
        text = "\n".join(record.getMessage() for record in caplog.records)
        health = running.server.health_port
    assert f"version={__version__} node=node-a drivers={GPU},{NIC}" in text
    assert "kinds=devicepools.devmgmtproto.k8s.io,nodes,resourceclaims.resource.k8s.io," in text
    assert f"listening driver={GPU} socket={running.socket_path(GPU)}" in text
    assert f"listening driver={NIC} socket={running.socket_path(NIC)}" in text
    assert f"listening mtls=127.0.0.1:{running.server.tls_port}" in text
    assert f"listening health=127.0.0.1:{health}" in text


async def test_stop_removes_the_sockets(apiserver: APIServer, policy: Policy, pki: PKI) -> None:
    async with running_gatekeeper(apiserver, policy, pki) as running:
        path = running.socket_path(GPU)
        assert oct(path.stat().st_mode & 0o777) == "0o660"
    assert not path.exists()


def test_serve_help_documents_every_flag() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    undocumented = [a.option_strings for a in serve._actions if not a.help]
    assert undocumented == []
    assert "``" not in parser.format_help() and "``" not in serve.format_help()


async def test_upstream_token_is_not_in_the_start_log(
    apiserver: APIServer, policy: Policy, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_gatekeeper(apiserver, policy, pki):
        await asyncio.sleep(0)
    assert NODE_TOKEN not in caplog.text
