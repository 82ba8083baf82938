"""Response negotiation from the ``Accept`` header, as the apiserver does it for JSON.

The embedded API server speaks JSON only: a request that accepts nothing but protobuf (or
YAML, CBOR) gets 406 (a deliberate difference; client-go's default
``application/vnd.kubernetes.protobuf, application/json`` gets JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gatekeeper.apiserver._errors import APIError
from gatekeeper.apiserver._status import status_body

__all__ = [
    "JSON",
    "PARTIAL",
    "TABLE",
    "MediaRange",
    "Negotiated",
    "negotiate_discovery",
    "negotiate_object",
    "not_acceptable",
    "parse_accept",
]

JSON: Final = "json"
TABLE: Final = "table"
PARTIAL: Final = "partial"

_META_VERSIONS = ("v1", "v1beta1")


@dataclass(frozen=True, slots=True)
class MediaRange:
    """One entry of an ``Accept`` header."""

    type: str
    subtype: str
    params: dict[str, str] = field(default_factory=dict)
    q: float = 1.0

    @property
    def accepts_json(self) -> bool:
        """``application/json``, ``application/*`` or ``*/*``."""
        return (self.type, self.subtype) in (
            ("application", "json"),
            ("application", "*"),
            ("*", "*"),
        )


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What to render: plain JSON, a ``Table`` or ``PartialObjectMetadata``, at a meta version."""

    mode: str
    meta_version: str = "v1"


def parse_accept(header: str) -> list[MediaRange]:
    """Media ranges in preference order (by ``q``, then as written)."""
    ranges: list[MediaRange] = []
    for part in header.split(","):
        pieces = [p.strip() for p in part.split(";")]
        if not pieces[0]:
            continue
        kind, _, sub = pieces[0].lower().partition("/")
        params: dict[str, str] = {}
        for piece in pieces[1:]:
            name, _, value = piece.partition("=")
            params[name.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 1.0
        ranges.append(MediaRange(kind, sub or "*", params, q))
    return sorted(ranges, key=lambda r: -r.q)


def not_acceptable() -> APIError:
    """406 as the apiserver words it (listing only what this server can produce)."""
    return APIError(
        status_body(406, "only the following media types are accepted: application/json")
    )


def negotiate_object(header: str, *, collection: bool) -> Negotiated:
    """Choose JSON, ``as=Table`` or ``as=PartialObjectMetadata[List]``; 406 if none fits."""
    if not header.strip():
        return Negotiated(JSON)
    partial_kind = "PartialObjectMetadataList" if collection else "PartialObjectMetadata"
    for media in parse_accept(header):
        if not media.accepts_json:
            continue
        as_kind = media.params.get("as")
        if as_kind is None:
            return Negotiated(JSON)
        group, version = media.params.get("g"), media.params.get("v")
        if group != "meta.k8s.io" or version not in _META_VERSIONS:
            continue
        if as_kind == "Table":
            return Negotiated(TABLE, version)
        if as_kind == partial_kind:
            return Negotiated(PARTIAL, version)
    raise not_acceptable()


def negotiate_discovery(header: str) -> str | None:
    """``"v2"``/``"v2beta1"`` for aggregated discovery, None for the legacy documents."""
    for media in parse_accept(header):
        if not media.accepts_json:
            continue
        params = media.params
        if (
            params.get("as") == "APIGroupDiscoveryList"
            and params.get("g") == "apidiscovery.k8s.io"
            and params.get("v") in ("v2", "v2beta1")
        ):
            return params["v"]
        if "as" not in params:
            return None
    if header.strip():
        raise not_acceptable()
    return None
