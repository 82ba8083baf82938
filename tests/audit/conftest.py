"""A running gatekeeper that writes a real audit log, and helpers to read it back."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.audit import AuditLevel
from gatekeeper.config import AuditSettings
from gatekeeper.policy import Policy
from gatekeeper.server import GatekeeperServer
from gatekeeper.testing import APIServer
from tests.conftest import PKI, Running, serve_config


@dataclass
class Audited(Running):
    """A gatekeeper with its audit log; ``stop()`` flushes it, ``events()`` reads it."""

    log_path: Path = Path()
    stopped: bool = False

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.server.stop()

    async def events(self) -> list[dict[str, Any]]:
        await self.stop()
        with open(self.log_path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]


@pytest.fixture
def audit_level() -> AuditLevel:
    return AuditLevel.REQUEST


@pytest.fixture
async def audited(
    apiserver: APIServer, policy: Policy, pki: PKI, audit_level: AuditLevel, tmp_path: Path
) -> AsyncIterator[Audited]:
    socket_dir = Path(tempfile.mkdtemp(prefix="gk-sock-"))
    log_path = tmp_path / "audit.log"
    config = serve_config(
        apiserver,
        policy,
        pki,
        socket_dir,
        audit=AuditSettings(path=str(log_path), level=audit_level),
    )
    server = GatekeeperServer(config)
    await server.start()
    running = Audited(server, socket_dir, pki, log_path=log_path)
    yield running
    await running.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)
