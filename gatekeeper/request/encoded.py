"""Request bodies the gatekeeper does not decode itself: protobuf (client-go's default for
built-in kinds) and CBOR.

Such a body is carried as an :class:`EncodedBody`: its exact bytes and what the wire format
says without any API type (the protobuf envelope's apiVersion, kind, name and
resourceVersion). The apiserver decodes it in a dry run, the engine decides on that JSON
answer, and the same bytes are forwarded, pinned to the checked resourceVersion (DESIGN §4.4).
DeleteOptions, one fixed meta/v1 message, is read here and goes on as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gatekeeper.codec.kubeproto import (
    PROTOBUF,
    Envelope,
    ProtobufError,
    ProtobufProblem,
    delete_options,
    read_envelope,
)
from gatekeeper.errors import Refusal
from gatekeeper.rule import Rule

__all__ = [
    "CBOR",
    "ENCODED_MEDIA_TYPES",
    "PROTOBUF",
    "EncodedBody",
    "encoding_name",
    "read_encoded",
]

CBOR = "application/cbor"
ENCODED_MEDIA_TYPES = frozenset({PROTOBUF, CBOR})
_NAMES = {PROTOBUF: "protobuf", CBOR: "cbor"}
_DELETE_VERBS = frozenset({"delete", "deletecollection"})


def encoding_name(media_type: str) -> str:
    """The policy's name (``encodings``) of a request body's media type."""
    return _NAMES.get(media_type, "json")


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A create or update body decoded by the apiserver, not by the gatekeeper."""

    raw: bytes = field(repr=False)
    """The driver's bytes, forwarded as they are (with the resourceVersion pin)."""
    media_type: str
    envelope: Envelope | None = None
    """What the protobuf wire format says; None for CBOR, or for bytes that are no readable
    protobuf object (then only the apiserver's own error is passed on)."""
    unreadable: str = ""
    """Why the envelope could not be read (empty when it was, or for CBOR)."""

    @property
    def resource_version(self) -> str:
        return self.envelope.resource_version if self.envelope is not None else ""

    @property
    def name(self) -> str:
        return self.envelope.name if self.envelope is not None else ""


def read_encoded(raw: bytes, media_type: str, verb: str) -> EncodedBody | dict[str, object]:
    """A protobuf or CBOR body of ``verb``: an :class:`EncodedBody` for create and update, the
    JSON DeleteOptions of a protobuf delete; a 415 or 400 :class:`Refusal` otherwise (400 also
    for a protobuf body the apiserver could read differently from the gatekeeper)."""
    if verb in _DELETE_VERBS and media_type == PROTOBUF:
        try:
            return delete_options(raw)
        except ProtobufError as exc:
            raise Refusal(400, f"protobuf DeleteOptions body: {exc}", rule=Rule.BAD_BODY) from None
    if verb == "create" or (verb == "update" and media_type == PROTOBUF):
        if media_type == CBOR:
            return EncodedBody(raw, media_type)
        try:
            return EncodedBody(raw, media_type, read_envelope(raw))
        except ProtobufError as exc:
            if exc.problem is ProtobufProblem.AMBIGUOUS:
                # SECURITY: DESIGN §4.4 — the apiserver could read a value here that the
                # gatekeeper does not (an aliased ObjectMeta unpins the update): nothing of it
                # goes upstream, not even the dry run.
                raise Refusal(400, f"protobuf request body: {exc}", rule=Rule.BAD_BODY) from None
            # Bytes the apiserver refuses too: its dry run's own error is what the driver gets.
            return EncodedBody(raw, media_type, unreadable=str(exc))
    # SECURITY: DESIGN §4.4 — a CBOR update or delete body would have to be read or pinned
    # without a CBOR codec; client-go falls back to JSON for good after a 415 to CBOR.
    raise Refusal(
        415,
        f'content type "{media_type}" is not accepted for {verb}',
        f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json{', ' + PROTOBUF if verb != 'patch' else ''} (a {_NAMES[media_type]} "
        f"body is accepted for {'create and update' if media_type == PROTOBUF else 'create'} "
        "only)",
    )
