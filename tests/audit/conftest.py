"""A running gatekeeper that writes a real audit log, and helpers to read it back."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gatekeeper.audit import AuditLevel, JsonLinesWriter
from gatekeeper.config import server_ssl_context
from gatekeeper.kubeconfig import UpstreamConfig
from gatekeeper.policy import Policy
from gatekeeper.server import GatekeeperServer
from gatekeeper.testing import NODE, NODE_TOKEN, PKI, APIServer, Audited
from gatekeeper.upstream import UpstreamSession


@pytest.fixture
def audit_level() -> AuditLevel:
    return AuditLevel.REQUEST


@pytest.fixture
async def audited(
    apiserver: APIServer, policy: Policy, pki: PKI, audit_level: AuditLevel, tmp_path: Path
) -> AsyncIterator[Audited]:
    socket_dir = Path(tempfile.mkdtemp(prefix="gk-sock-"))
    log_path = tmp_path / "audit.log"
    server = GatekeeperServer(
        policy=policy,
        node_name=NODE,
        upstream=UpstreamSession(UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)),
        audit=JsonLinesWriter(str(log_path)),
        audit_level=audit_level,
        socket_dir=socket_dir,
        listen=("127.0.0.1", 0),
        listen_ssl=server_ssl_context(
            pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt")
        ),
    )
    await server.start()
    running = Audited(server, socket_dir, pki, log_path=log_path)
    yield running
    await running.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)
