"""Build an ``audit.k8s.io/v1`` Event from a Flow (DESIGN §4.7)."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gatekeeper.audit.flow import Flow
from gatekeeper.policy.encoded import DECODED_BY_UPSTREAM
from gatekeeper.policy.model import Credentials
from gatekeeper.request.encoded import EncodedBody
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import DRIVERS_GROUP, NODE_NAME_EXTRA, KubeObject

__all__ = [
    "CLIENT_AUDIT_ID_ANNOTATION",
    "CONTENT_TYPE_ANNOTATION",
    "CREDENTIALS_ANNOTATION",
    "DECISION_ANNOTATION",
    "DECODED_ANNOTATION",
    "ERROR_ANNOTATION",
    "FORWARDED_ANNOTATION",
    "NODE_NAME_EXTRA",
    "REASON_ANNOTATION",
    "RULE_ANNOTATION",
    "STAGE_COMPLETE",
    "STAGE_STARTED",
    "UPSTREAM_AUDIT_ID_ANNOTATION",
    "VALIDATION_ANNOTATION",
    "AuditLevel",
    "build_event",
    "client_audit_id",
    "logs_bodies",
]

DECISION_ANNOTATION = "authorization.k8s.io/decision"
REASON_ANNOTATION = "authorization.k8s.io/reason"
CLIENT_AUDIT_ID_ANNOTATION = "dra-gatekeeper.io/client-audit-id"
UPSTREAM_AUDIT_ID_ANNOTATION = "dra-gatekeeper.io/upstream-audit-id"
CONTENT_TYPE_ANNOTATION = "dra-gatekeeper.io/content-type"
"""The request body's media type (patch type), which ``audit check`` needs to replay a patch."""
ERROR_ANNOTATION = "dra-gatekeeper.io/error"
"""Set when the request failed before any decision (e.g. upstream unreachable while fetching)."""
FORWARDED_ANNOTATION = "dra-gatekeeper.io/forwarded"
DECODED_ANNOTATION = "dra-gatekeeper.io/decoded-by"
CREDENTIALS_ANNOTATION = "dra-gatekeeper.io/credentials"
"""``driver`` when the request was forwarded with the driver's own token (rule
DriverCredentials); absent when it carried the gatekeeper's."""
RULE_ANNOTATION = "dra-gatekeeper.io/rule"
"""The rule that refused (:class:`~gatekeeper.rule.Rule`): what metrics count by."""
VALIDATION_ANNOTATION = "dra-gatekeeper.io/validation"
"""The policy's CEL validation that refused the request (its name)."""
"""On a protobuf or CBOR body: the request object is the apiserver's decoding (a dry run)."""
"""``METHOD target`` sent upstream, when it differs from the driver's request (an apply sent as a
create, a list with injected selector terms)."""
STAGE_STARTED = "ResponseStarted"
STAGE_COMPLETE = "ResponseComplete"

_CLIENT_AUDIT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# SECURITY: DESIGN §4.7 — no tokens or certificate material in the log. As in the apiserver's
# recommended audit policy, these kinds are logged at Metadata level whatever --audit-level says.
_METADATA_ONLY = frozenset(
    {
        ("", "secrets"),
        ("", "configmaps"),
        ("authentication.k8s.io", "tokenreviews"),
        ("certificates.k8s.io", "certificatesigningrequests"),
    }
)
_SECRET_SUBRESOURCES = frozenset({"token"})


class AuditLevel(enum.Enum):
    """How much of a request is logged (the apiserver's levels, ``None`` aside)."""

    METADATA = "Metadata"
    REQUEST = "Request"
    REQUEST_RESPONSE = "RequestResponse"


def client_audit_id(headers: Mapping[str, str]) -> str:
    """The driver's ``Audit-ID`` header if it is a short plain token, else "".

    It is only a hint recorded beside our own ID: a driver could repeat or forge it, so it is
    never used as the event's ``auditID``.
    """
    value = headers.get("Audit-ID", "")
    return value if _CLIENT_AUDIT_ID.match(value) else ""


def logs_bodies(info: RequestInfo | None) -> bool:
    """Whether request/response bodies of this request may be logged at all."""
    if info is None or not info.is_resource_request:
        return False
    if (info.api_group, info.resource) in _METADATA_ONLY:
        return False
    return info.subresource not in _SECRET_SUBRESOURCES


def _timestamp(moment: datetime) -> str:
    # The apiserver's RFC 3339 with microseconds. isoformat is one C call where strftime
    # formats field by field (measured: 3.5 µs per call, two calls per event).
    return moment.isoformat(timespec="microseconds")[:26] + "Z"


def build_event(
    flow: Flow,
    level: AuditLevel,
    stage: str = STAGE_COMPLETE,
) -> dict[str, Any]:
    """One Event for ``stage``; bodies only at Request+ levels and only for resource requests."""
    info = flow.info
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": level.value,
        "auditID": flow.audit_id,
        "stage": stage,
        "requestURI": flow.raw_target,
        "verb": info.verb if info else flow.method.lower(),
        "user": _user(flow),
        "sourceIPs": list(flow.source_ips),
        "userAgent": flow.user_agent,
    }
    if info is not None and info.is_resource_request:
        event["objectRef"] = _object_ref(info)
    event["responseStatus"] = _response_status(flow, stage)
    bodies = logs_bodies(info)
    if level is not AuditLevel.METADATA and bodies and (request_object := _request_object(flow)):
        event["requestObject"] = request_object
    if (
        level is AuditLevel.REQUEST_RESPONSE
        and bodies
        and stage == STAGE_COMPLETE
        and flow.response_object is not None
    ):
        event["responseObject"] = flow.response_object
    event["requestReceivedTimestamp"] = _timestamp(flow.received)
    stage_time = flow.completed if stage == STAGE_COMPLETE else flow.response_started
    event["stageTimestamp"] = _timestamp(stage_time or flow.received)
    event["annotations"] = _annotations(flow)
    return event


def _object_ref(info: RequestInfo) -> dict[str, str]:
    pairs = (
        ("resource", info.resource),
        ("namespace", info.namespace),
        ("name", info.name),
        ("apiGroup", info.api_group),
        ("apiVersion", info.api_version),
        ("subresource", info.subresource),
    )
    return {key: value for key, value in pairs if value}


def _response_status(flow: Flow, stage: str) -> dict[str, Any]:
    code = flow.status_code if stage == STAGE_COMPLETE or flow.status_code else 200
    status: dict[str, Any] = {"metadata": {}, "code": code}
    if code >= 400:
        status["status"] = "Failure"
        if flow.status_message:
            status["message"] = flow.status_message
    return status


def _user(flow: Flow) -> dict[str, Any]:
    extra: dict[str, list[str]] = {NODE_NAME_EXTRA: [flow.node_name]}
    if flow.identity is None:
        return {
            "username": "system:anonymous",
            "groups": ["system:unauthenticated"],
            "extra": extra,
        }
    extra["dra-gatekeeper.io/transport"] = [str(flow.identity.transport)]
    # Peer facts are pid/uid/gid or the certificate's serial and expiry: never key material.
    for key, value in flow.identity.peer.items():
        extra[f"dra-gatekeeper.io/peer-{key}"] = [value]
    return {"username": flow.identity.driver, "groups": [DRIVERS_GROUP], "extra": extra}


def _decoded(flow: Flow) -> KubeObject | None:
    """The apiserver's decoding of an encoded body (its dry run's answer), if it gave one."""
    proposed = flow.proposed
    if proposed is None or proposed.rejected or not isinstance(proposed.result, dict):
        return None
    return proposed.result


def _request_object(flow: Flow) -> Any:
    """The request body as JSON: an encoded (protobuf, CBOR) body as the apiserver decoded it,
    which is what the decision was made on; absent when it was never decoded."""
    if isinstance(flow.body, EncodedBody):
        return _decoded(flow)
    return flow.body


def _annotations(flow: Flow) -> dict[str, str]:
    annotations: dict[str, str] = {}
    if flow.decision is not None:
        annotations[DECISION_ANNOTATION] = "allow" if flow.decision.allowed else "forbid"
        annotations[REASON_ANNOTATION] = flow.decision.reason
        if not flow.decision.allowed and flow.decision.rule is not None:
            annotations[RULE_ANNOTATION] = flow.decision.rule.value
        if flow.decision.validation:
            annotations[VALIDATION_ANNOTATION] = flow.decision.validation
        if flow.decision.credentials is Credentials.DRIVER:
            annotations[CREDENTIALS_ANNOTATION] = Credentials.DRIVER.value
    elif flow.status_code >= 500:
        annotations[ERROR_ANNOTATION] = flow.status_message or "failed before a decision"
    forwarded = flow.forwarded
    info = flow.info
    if forwarded is not None and (info is None or str(forwarded) != f"{info.method} {info.target}"):
        annotations[FORWARDED_ANNOTATION] = str(forwarded)
    if flow.upstream_audit_id:
        annotations[UPSTREAM_AUDIT_ID_ANNOTATION] = flow.upstream_audit_id
    if flow.client_audit_id:
        annotations[CLIENT_AUDIT_ID_ANNOTATION] = flow.client_audit_id
    if flow.info is not None and flow.info.verb == "patch" and flow.body is not None:
        annotations[CONTENT_TYPE_ANNOTATION] = flow.media_type
    if isinstance(flow.body, EncodedBody):
        annotations[CONTENT_TYPE_ANNOTATION] = flow.media_type
        if _decoded(flow) is not None:
            annotations[DECODED_ANNOTATION] = DECODED_BY_UPSTREAM
    annotations.update(flow.annotations)
    return annotations
