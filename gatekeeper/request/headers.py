"""Request header screening and the headers forwarded upstream (DESIGN §4.5)."""

from __future__ import annotations

from collections.abc import Mapping

from gatekeeper.errors import Refusal
from gatekeeper.rule import Rule

__all__ = [
    "ALLOWED_METHODS",
    "accepts_plain_json",
    "bearer_token",
    "forwarded_request_headers",
    "response_headers",
    "screen_request",
]

ALLOWED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})

_REFUSED_PREFIXES = ("impersonate-", "x-remote-")
_REFUSED_HEADERS = frozenset({"x-http-method-override", "x-http-method", "x-method-override"})
_FORWARDED = ("Accept", "Content-Type", "User-Agent")
_RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "cache-control",
        "warning",
        "retry-after",
        "x-content-type-options",
        "x-kubernetes-pf-flowschema-uid",
        "x-kubernetes-pf-prioritylevel-uid",
    }
)


_PLAIN_JSON_RANGES = frozenset({"application/json", "application/*", "*/*"})
_OTHER_ENCODINGS = frozenset({"application/vnd.kubernetes.protobuf", "application/cbor"})
"""The same object in another encoding: client-go's typed clients ask for
``application/vnd.kubernetes.protobuf,application/json``."""


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>``, or None when there is not exactly one."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def accepts_plain_json(accept: str) -> bool:
    """Whether a plain JSON object answers an ``Accept`` header: one of its media ranges is
    answered by it (``application/json`` without ``as=``/``g=``/``v=``, ``application/*``,
    ``*/*``; an empty header too), and none asks for another form of the object (a Table,
    metadata only, YAML). A range for the same object in another encoding (protobuf, CBOR) may
    come first: the client takes JSON too, as the apiserver answers for kinds it cannot encode
    so."""
    plain = not accept.strip()
    for media_range in accept.split(","):
        kind, *params = (part.strip().lower() for part in media_range.split(";"))
        if not kind and not params:
            continue
        names = {param.split("=", 1)[0].strip() for param in params} - {"q", "charset"}
        if kind in _OTHER_ENCODINGS and not names:
            continue
        if kind not in _PLAIN_JSON_RANGES or names:
            return False
        plain = True
    return plain


def screen_request(method: str, headers: Mapping[str, str]) -> None:
    """Refuse (403) methods and headers that change who or what the request is."""
    if method not in ALLOWED_METHODS:
        raise Refusal(403, f"method {method} is not allowed", rule=Rule.METHOD_NOT_ALLOWED)
    for name in headers:
        lower = name.lower()
        # SECURITY: DESIGN §4.5 — identity and method must come from the gatekeeper alone.
        if lower.startswith(_REFUSED_PREFIXES) or lower in _REFUSED_HEADERS:
            raise Refusal(403, f"header {name} is not allowed", rule=Rule.HEADER_NOT_ALLOWED)
    if (
        "upgrade" in (key.lower() for key in headers)
        or "upgrade" in headers.get("Connection", "").lower()
    ):
        raise Refusal(
            403,
            "connection upgrades (exec, attach, port-forward, websockets) are not allowed",
            rule=Rule.UPGRADE_NOT_ALLOWED,
        )


def forwarded_request_headers(
    headers: Mapping[str, str], *, audit_id: str, content_type: str | None
) -> dict[str, str]:
    """An allow-list copy: nothing the driver sent about credentials or hops reaches upstream
    (the upstream adds the node's own credentials)."""
    # Headers the driver named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
    hop = {token.strip().lower() for token in headers.get("Connection", "").split(",")}
    out = {
        name: headers[name] for name in _FORWARDED if name in headers and name.lower() not in hop
    }
    out.pop("Content-Type", None)
    if content_type is not None:
        out["Content-Type"] = content_type
    out["Audit-ID"] = audit_id
    return out


def response_headers(upstream: Mapping[str, str], *, audit_id: str) -> dict[str, str]:
    """The upstream response headers passed back (hop-by-hop and framing headers dropped)."""
    out = {name: value for name, value in upstream.items() if name.lower() in _RESPONSE_HEADERS}
    out["Audit-Id"] = audit_id
    return out
