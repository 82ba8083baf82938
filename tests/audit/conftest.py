"""A running gatekeeper that writes a real audit log (read back with ``Audited.events()``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gatekeeper.audit import AuditLevel, JsonLinesWriter
from gatekeeper.policy import Policy
from gatekeeper.testing import PKI, APIServer, Audited, running_gatekeeper


@pytest.fixture
def audit_level() -> AuditLevel:
    return AuditLevel.REQUEST


@pytest.fixture
async def audited(
    apiserver: APIServer, policy: Policy, pki: PKI, audit_level: AuditLevel, tmp_path: Path
) -> AsyncIterator[Audited]:
    log_path = tmp_path / "audit.log"
    audit = JsonLinesWriter(str(log_path))
    async with running_gatekeeper(
        apiserver, policy, pki, audit=audit, audit_level=audit_level
    ) as running:
        audited = Audited(running.server, running.socket_dir, running.pki, log_path=log_path)
        yield audited
        await audited.stop()
