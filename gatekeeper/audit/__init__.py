"""Audit: the audit.k8s.io/v1 event per request, its writer, and the offline log tools."""

from gatekeeper.audit.event import (
    NODE_NAME_EXTRA,
    STAGE_COMPLETE,
    STAGE_STARTED,
    AuditLevel,
    build_event,
    client_audit_id,
    logs_bodies,
)
from gatekeeper.audit.writer import AuditSink, JsonLinesWriter, NullSink, WriterStats

__all__ = [
    "NODE_NAME_EXTRA",
    "STAGE_COMPLETE",
    "STAGE_STARTED",
    "AuditLevel",
    "AuditSink",
    "JsonLinesWriter",
    "NullSink",
    "WriterStats",
    "build_event",
    "client_audit_id",
    "logs_bodies",
]
