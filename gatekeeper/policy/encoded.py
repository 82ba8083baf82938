"""Create and update bodies the apiserver decodes (protobuf, CBOR), purely (DESIGN §4.4).

The plan asks for a dry run of the driver's exact bytes (``dryRun=All``, answered in JSON),
pinned to the fetched resourceVersion for an update and without the apiserver-maintained
generation and managedFields; the decision is the one a JSON body equal to that answer would
get; the same bytes are what is forwarded. No API type is involved: both edits are wire-format
edits of meta/v1 ObjectMeta (:mod:`gatekeeper.codec.kubeproto`).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.codec.kubeproto import (
    ProtobufError,
    with_resource_version,
    without_maintained_fields,
)
from gatekeeper.policy.decision import Decision, answered, deny, forbid, rejected_preview
from gatekeeper.policy.integrity import stale_conflict, stored_resource_version
from gatekeeper.policy.model import Field, KindSpec
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.request.encoded import CBOR, PROTOBUF, EncodedBody, encoding_name
from gatekeeper.rule import Rule
from gatekeeper.types import KubeObject

__all__ = [
    "DECODED_BY_UPSTREAM",
    "encoded_decision",
    "encoded_json",
    "encoded_preview",
    "unaccepted_encoding",
]

DECODED_BY_UPSTREAM = "the apiserver decoded the request body in a dry run"
"""Audit annotation value: the request object recorded is the apiserver's decoding."""

_JSON = "application/json"
_NAME_PATH = ("metadata", "name")


def unaccepted_encoding(kind: KindSpec, media_type: str) -> Decision | None:
    """415 when the policy does not list the body's encoding for ``kind``: checked before
    anything goes upstream (a custom resource endpoint cannot read protobuf at all)."""
    encoding = encoding_name(media_type)
    if encoding in kind.encodings:
        return None
    accepted = ", ".join(sorted(kind.encodings))
    return deny(
        415,
        f"{encoding} request bodies are not accepted for {kind.qualified} (policy encodings: "
        f"{accepted})",
        "the body of the request was in an unknown format - accepted media types include: "
        f"application/json ({kind.qualified} accepts {accepted} request bodies through the "
        "gatekeeper)",
    )


def encoded_preview(plan: Plan, body: EncodedBody, current: KubeObject | None) -> Preview | None:
    """The dry run that decodes ``body``: a create as it is; an update only of a stored object
    the caller may touch, pinned to its resourceVersion (a body asking for another version is
    refused as stale without asking)."""
    if _envelope_mismatch(plan, body):
        return None
    try:
        raw = _without_maintained(body)
    except ProtobufError:
        return None
    if plan.info.verb == "create" or plan.unread:
        # An unread update carries its own resourceVersion: the dry run is conditional on it.
        return Preview(plan.info, raw, body.media_type)
    if current is None or not plan.owns(current):
        return None
    stored = stored_resource_version(current)
    if body.envelope is not None:
        if body.resource_version not in ("", stored):
            return None
        if body.media_type == PROTOBUF and not body.resource_version:
            # SECURITY: DESIGN §4.4 — a protobuf update without resourceVersion is unconditional
            # (recording 210): pinned, a change after the check fails with 409.
            try:
                raw = with_resource_version(raw, stored)
            except ProtobufError:
                return None
    return Preview(plan.info, raw, body.media_type)


def encoded_json(
    plan: Plan, body: EncodedBody, current: KubeObject | None, proposed: Preview | None
) -> Decision | KubeObject | None:
    """What the engine decides on for ``body``: the apiserver's decoding of it (its dry run's
    answer, with the resourceVersion the driver sent); None when the stored object decides
    alone (an update of an object that is absent or not the caller's: nothing was asked); or the
    refusal the encoded body gets on its own."""
    info, kind = plan.info, plan.kind
    if mismatch := _envelope_mismatch(plan, body):
        return deny(400, mismatch, rule=Rule.BAD_BODY)
    if info.verb == "update" and not plan.unread:
        if current is None or not plan.owns(current):
            return None
        stored = stored_resource_version(current)
        if conflict := stale_conflict(info, kind, body.resource_version, stored):
            return conflict
    if proposed is None or proposed.result is None:
        why = f"the {encoding_name(body.media_type)} request body could not be decoded"
        return deny(400, why, rule=Rule.BAD_BODY)
    if proposed.rejected:
        # Bad bytes (400), an invalid object (422), a conflict (409): the apiserver's own answer.
        return answered(rejected_preview(info.verb), proposed.code, proposed.result)
    if body.unreadable:
        return deny(
            400,
            f"the gatekeeper cannot read the protobuf envelope ({body.unreadable}), although the "
            "apiserver decoded it",
            rule=Rule.BAD_BODY,
        )
    decoded = _as_sent(proposed.result, body)
    if (problem := _generated_pool(plan, decoded)) is not None:
        return forbid(plan.driver, info, problem, rule=Rule.POOL_PREFIX)
    if (problem := _brought_managed_fields(body, decoded)) is not None:
        return forbid(plan.driver, info, problem, rule=Rule.FORBIDDEN_FIELD)
    return decoded


def encoded_decision(
    plan: Plan,
    body: EncodedBody,
    decoded: KubeObject,
    decision: Decision,
    proposed: Preview | None,
) -> Decision:
    """The engine's ``decision`` on ``decoded`` with the driver's (pinned) bytes as what is
    forwarded; refused when deciding changed the object (``fill``), which bytes cannot carry."""
    if not decision.forwards:
        return decision
    assert proposed is not None
    if _without_version(decision.body) != _without_version(decoded):
        return forbid(
            plan.driver,
            plan.info,
            f"the object must name its driver, node and pool itself: fields are filled only in "
            f"JSON bodies, not in {encoding_name(body.media_type)}",
            rule=Rule.NOT_OWNER,
        )
    return replace(decision, body=proposed.body, media_type=body.media_type)


def _without_maintained(body: EncodedBody) -> bytes:
    """The bytes to preview and forward: a protobuf object without the generation and
    managedFields a driver could set in it (DESIGN §4.4: they change only by the apiserver's own
    bookkeeping; an honest client re-sends the stored ones, which the apiserver then keeps)."""
    if body.media_type != PROTOBUF or body.envelope is None:
        return body.raw
    return without_maintained_fields(body.raw)


def _brought_managed_fields(body: EncodedBody, decoded: KubeObject) -> str | None:
    """A CBOR create (bytes the gatekeeper has no codec to edit) whose dry run shows more
    managedFields entries than the apiserver makes for a create: one, the writer's."""
    entries = get_field(decoded, ("metadata", "managedFields"))
    if body.media_type != CBOR or not isinstance(entries, list) or len(entries) <= 1:
        return None
    return (
        "metadata.managedFields is maintained by the apiserver (it changes only as the "
        f"apiserver's own record of a permitted write): the CBOR body brings entries of its own "
        f"({len(entries)} in its dry run, where a create makes one, the writer's)"
    )


def _envelope_mismatch(plan: Plan, body: EncodedBody) -> str | None:
    """As for a JSON body (DESIGN §4.4): the envelope's apiVersion and kind are the URL's."""
    envelope = body.envelope
    if envelope is None:
        return None
    kind, version = plan.kind, plan.info.api_version
    expected = f"{kind.group}/{version}" if kind.group else version
    if (envelope.api_version, envelope.kind) == (expected, kind.kind):
        return None
    return (
        f'protobuf envelope apiVersion/kind "{envelope.api_version}"/"{envelope.kind}" does not '
        f'match the URL ("{expected}"/"{kind.kind}")'
    )


def _as_sent(result: KubeObject, body: EncodedBody) -> KubeObject:
    """The decoded object with the resourceVersion the driver sent (the dry run ran pinned)."""
    decoded = copy.deepcopy(result)
    meta = decoded.setdefault("metadata", {})
    if body.resource_version:
        meta["resourceVersion"] = body.resource_version
    else:
        meta.pop("resourceVersion", None)
    return decoded


def _without_version(obj: Any) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def _generated_pool(plan: Plan, decoded: KubeObject) -> str | None:
    """A kind whose pool is the object's name cannot be checked on a dry run's generated name:
    the real create generates another."""
    if plan.info.verb != "create" or plan.version.paths.get(Field.POOL) != _NAME_PATH:
        return None
    meta = decoded.get("metadata")
    if isinstance(meta, dict) and meta.get("generateName"):
        return "metadata.generateName cannot be checked as the pool name before the create"
    return None
