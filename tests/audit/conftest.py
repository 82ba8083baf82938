"""A running gatekeeper that writes a real audit log (read back with ``Audited.events()``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.policy import Policy
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import PKI, Audited, running_gatekeeper


@pytest.fixture
def audit_level() -> AuditLevel:
    return AuditLevel.REQUEST


@pytest.fixture
def limits() -> Limits:
    return DEFAULT_LIMITS


@pytest.fixture
async def audited(
    apiserver: APIServer,
    policy: Policy,
    pki: PKI,
    audit_level: AuditLevel,
    limits: Limits,
    tmp_path: Path,
) -> AsyncIterator[Audited]:
    log_path = tmp_path / "audit.log"
    settings = AuditSettings(path=str(log_path), level=audit_level)
    async with running_gatekeeper(apiserver, policy, pki, audit=settings, limits=limits) as running:
        audited = Audited(running.server, running.socket_dir, running.pki, log_path=log_path)
        yield audited
        await audited.stop()
