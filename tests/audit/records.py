"""Records of finished requests, written out field by field for the offline tools' tests."""

from __future__ import annotations

from typing import Any

from gatekeeper.audit.tools.reader import Record
from gatekeeper.testing.harness import GPU, NODE

__all__ = ["record"]


def record(
    verb: str,
    uri: str,
    *,
    code: int = 200,
    decision: str = "allow",
    driver: str | None = GPU,
    request_object: Any = None,
    response_object: Any = None,
    content_type: str = "",
) -> Record:
    """One request as the gatekeeper's log records it."""
    return Record(
        audit_id=f"id-{verb}-{code}",
        source="gatekeeper",
        username=driver or "system:anonymous",
        driver=driver,
        node=NODE,
        transport="unix",
        verb=verb,
        request_uri=uri,
        object_ref={},
        code=code,
        decision=decision,
        reason="",
        received="2026-12-03T07:00:00.000000Z",
        completed="2026-12-03T07:00:00.000100Z",
        level="RequestResponse",
        content_type=content_type,
        request_object=request_object,
        response_object=response_object,
    )
