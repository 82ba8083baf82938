"""The policy's CEL checked against the apiserver's schemas when ``serve`` loads or reloads it:
the OpenAPI v3 document of each group and version whose kinds' CEL reads the objects, read
through the upstream session, and a warning logged for each field the schema does not have
(:mod:`gatekeeper.policy.celschema`). A document that cannot be read leaves its kinds unchecked,
said in the log: a warning never stops the gatekeeper."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.policy.celschema import field_warnings, schema_path, schema_targets
from gatekeeper.policy.model import Policy
from gatekeeper.upstream.session import Upstream, request

__all__ = ["SCHEMA_TIMEOUT", "check_fields"]

log = logging.getLogger("gatekeeper.schemas")

SCHEMA_TIMEOUT = 10.0
"""Seconds to read one group version's document."""


async def check_fields(upstream: Upstream, policy: Policy) -> list[str]:
    """Log (and return) a warning per field the policy's CEL reads that the apiserver's schema
    of its kind does not have."""
    documents: dict[tuple[str, str], Any] = {}
    for group, version in schema_targets(policy):
        path = schema_path(group, version)
        try:
            async with asyncio.timeout(SCHEMA_TIMEOUT):
                status, document = await request(upstream, "GET", path)
        except (UpstreamError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, UpstreamError) else "timed out"
            log.warning("schema not read, CEL fields not checked path=%s: %s", path, why)
            continue
        if status != 200:
            log.warning("schema not read, CEL fields not checked path=%s status=%d", path, status)
            continue
        documents[(group, version)] = document
    warnings = field_warnings(policy, documents)
    for warning in warnings:
        log.warning("CEL reads a field the apiserver's schema does not have: %s", warning)
    return warnings
