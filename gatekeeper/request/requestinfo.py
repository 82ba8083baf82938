"""The canonical request parser: raw request target -> RequestInfo (DESIGN §4.5).

What the policy decides on is what is forwarded: `RequestInfo.target` is rebuilt from the parsed
parts, and every form the kube-apiserver could read differently from us is refused with 400.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote_to_bytes

from gatekeeper.errors import Refusal
from gatekeeper.names import DNS_SUBDOMAIN
from gatekeeper.rule import Rule

__all__ = ["ALLOWED_QUERY_PARAMETERS", "METHOD_NOT_ALLOWED", "RequestInfo", "parse_request"]

ALLOWED_QUERY_PARAMETERS: frozenset[str] = frozenset(
    {
        # ListOptions / GetOptions / watch
        "allowWatchBookmarks", "continue", "fieldSelector", "labelSelector", "limit", "watch",
        "resourceVersion", "resourceVersionMatch", "sendInitialEvents", "timeoutSeconds",
        # Create/Update/PatchOptions
        "dryRun", "fieldManager", "fieldValidation", "force",
        # DeleteOptions
        "gracePeriodSeconds", "orphanDependents", "propagationPolicy",
        # every endpoint: output formatting, handler timeout (kubectl sends timeout=32s)
        "pretty", "timeout",
        # /openapi/v3/<path>?hash=... as listed by /openapi/v3 (client-go's cached openapi)
        "hash",
    }
)  # fmt: skip
"""Query keys passed on. The apiserver matches keys case-sensitively and silently ignores unknown
ones (``?fieldselector=`` would list everything), so any other key is refused (DESIGN §4.5)."""

METHOD_NOT_ALLOWED = "the server does not allow this method on the requested resource"
"""The apiserver's 405 message (recording 199: POST to a named path)."""

_CREATE_QUERY = frozenset({"fieldManager", "fieldValidation", "dryRun", "pretty"})
_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_READ_METHODS = frozenset({"GET", "HEAD"})
_BOOL_PARAMETERS = frozenset(
    {"watch", "allowWatchBookmarks", "sendInitialEvents", "force", "orphanDependents", "pretty"}
)
# Values on which Go's strconv.ParseBool and apimachinery's query conversion (only "0" and
# case-insensitive "false" are false; anything else, "" and "f" included, is true) agree.
_TRUE_VALUES = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE_VALUES = frozenset({"0", "false", "False", "FALSE"})
_BOOL_VALUES = _TRUE_VALUES | _FALSE_VALUES
# The apiserver reads these right after the version as a verb (requestinfo.go specialVerbs).
_SPECIAL_VERB_SEGMENTS = frozenset({"watch", "proxy"})
# Subresources of a namespace itself (requestinfo.go namespaceSubresources).
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})

_SEGMENT = re.compile(r"[A-Za-z0-9._:-]+")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request as the apiserver's RequestInfo resolver reads it, in canonical form.

    ``path`` and ``query`` are exactly what is forwarded upstream (``target``). For a collection
    GET, ``name`` stays empty even when a ``metadata.name`` field selector pins one (the apiserver
    copies that into its RequestInfo; here the selector is in ``query``).
    """

    method: str
    """Upper-case HTTP method as received: GET, HEAD, POST, PUT, PATCH or DELETE."""
    path: str
    """Canonical path, equal to the received one (everything ambiguous is refused)."""
    query: tuple[tuple[str, str], ...]
    """Decoded (key, value) pairs in received order; keys are unique and allowed."""
    is_resource_request: bool
    verb: str
    """get list watch create update patch delete deletecollection; non-resource: lower method."""
    api_prefix: str
    """"api" or "apis" for resource requests, "" otherwise."""
    api_group: str
    """"" for the core group."""
    api_version: str
    namespace: str
    """"" when the path has no namespace (for ``/api/v1/namespaces/<ns>`` it is ``<ns>``)."""
    resource: str
    subresource: str
    name: str

    def query_value(self, key: str) -> str | None:
        """The decoded value of ``key``, or None when absent."""
        for k, v in self.query:
            if k == key:
                return v
        return None

    @property
    def query_string(self) -> str:
        """The canonical encoding of ``query``: every key and value percent-encoded, in order."""
        return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.query)

    @property
    def target(self) -> str:
        """The request target forwarded upstream: ``path`` plus ``?query_string`` if any."""
        return f"{self.path}?{self.query_string}" if self.query else self.path

    def with_query(self, key: str, value: str | None) -> RequestInfo:
        """A copy with ``key`` set to ``value`` (replaced in place, else appended; None removes).

        Raises ValueError for keys outside ALLOWED_QUERY_PARAMETERS, for ``watch`` (the verb was
        derived from it and must not change behind the decision) and for a non-canonical boolean.
        """
        if key not in ALLOWED_QUERY_PARAMETERS or key == "watch":
            raise ValueError(f"query parameter {_q(key)} cannot be set")
        if value is not None and key in _BOOL_PARAMETERS and value not in _BOOL_VALUES:
            raise ValueError(f"query parameter {_q(key)} needs true or false, not {_q(value)}")
        if value is None:
            pairs = tuple(pair for pair in self.query if pair[0] != key)
        elif self.query_value(key) is None:
            pairs = (*self.query, (key, value))
        else:
            pairs = tuple((k, value if k == key else v) for k, v in self.query)
        return replace(self, query=pairs)

    def as_create(self) -> RequestInfo:
        """The create (POST to the collection) of the object this request names, with the query
        keys a create takes (``fieldManager``, ``fieldValidation``, ``dryRun``, ``pretty``)."""
        if not self.is_resource_request or not self.name or self.subresource:
            raise ValueError(f"{self.path} does not name an object to create")
        query = tuple(pair for pair in self.query if pair[0] in _CREATE_QUERY)
        collection = self.path.rsplit("/", 1)[0]
        return replace(self, method="POST", path=collection, query=query, verb="create", name="")

    def as_list(self, keep: Iterable[str]) -> RequestInfo:
        """The list (GET) of this request's collection with only the query keys in ``keep``."""
        if not self.is_resource_request or self.name:
            raise ValueError(f"{self.path} is not a collection")
        wanted = frozenset(keep) - {"watch"}
        query = tuple(pair for pair in self.query if pair[0] in wanted)
        return replace(self, method="GET", query=query, verb="list")


def parse_request(method: str, raw_target: str) -> RequestInfo:
    """Parse a request line into its canonical RequestInfo, following apiserver requestinfo.go.

    ``raw_target`` is the target exactly as received (aiohttp ``request.raw_path``, not decoded).
    Raises ``Refusal(403)`` for a method other than GET HEAD POST PUT PATCH DELETE and
    ``Refusal(400)`` for any ambiguous form (DESIGN §4.5); path segments may only use
    ``[A-Za-z0-9._:-]``, which is stricter than the apiserver's rule for names (not ``.``/``..``,
    no ``/`` or ``%``).
    """
    if method not in _READ_METHODS and method not in _METHOD_VERBS:
        raise Refusal(
            403,
            "method not allowed",
            f"method {_q(method)} is not allowed",
            rule=Rule.METHOD_NOT_ALLOWED,
        )
    path, raw_query = _split_target(raw_target)
    segments = _split_path(path)
    query = _parse_query(raw_query)
    watch = _watch_requested(query)
    if watch and method not in _READ_METHODS:
        raise Refusal(
            400, "watch on a write", f"watch is set on a {method} request", rule=Rule.BAD_QUERY
        )
    info = _resource_info(method, path, query, segments, watch)
    return info if info is not None else _non_resource_info(method, path, query, segments, watch)


def _split_target(raw_target: str) -> tuple[str, str]:
    """Split an origin-form target into path and raw query after checking every character."""
    if not raw_target.startswith("/"):
        raise Refusal(400, "not an origin-form target", "request target must start with '/'")
    for index, char in enumerate(raw_target):
        # SECURITY: DESIGN §4.5 - bytes the apiserver's Go parser might read another way.
        if not " " < char < "\x7f":
            raise Refusal(
                400,
                "control or non-ASCII character",
                f"request target has a control or non-ASCII character {_q(char)} at offset {index}",
            )
        if char in "\\;#":
            raise Refusal(
                400, "forbidden character", f"request target has {_q(char)} at offset {index}"
            )
    path, _, raw_query = raw_target.partition("?")
    return path, raw_query


def _split_path(path: str) -> list[str]:
    """The path's segments; refuses empty, dot, escaped and odd-character segments."""
    if path == "/":
        return []
    segments = path[1:].split("/")
    if segments[-1] == "" and _is_discovery(segments[:-1]):
        # The official Python client asks for discovery with a trailing slash (/api/, /apis/<g>/,
        # /version/): the apiserver serves those as without it. Only there; the path is kept.
        segments = segments[:-1]
    for number, segment in enumerate(segments, start=1):
        if segment == "" and number == len(segments):
            raise Refusal(400, "trailing slash", f"path {_q(path)} ends with '/'")
        if segment == "":
            raise Refusal(400, "empty path segment", f"path segment {number} is empty")
        if segment in (".", ".."):
            raise Refusal(400, "dot path segment", f"path segment {number} is {_q(segment)}")
        if "%" in segment:
            # SECURITY: DESIGN §4.5 - no escapes, so the decoded path cannot differ from this one.
            raise Refusal(
                400, "percent-escape in path", f"path segment {number} contains a '%' escape"
            )
        if not _SEGMENT.fullmatch(segment):
            raise Refusal(
                400,
                "forbidden character in path",
                f"path segment {number} {_q(segment)} has characters outside [A-Za-z0-9._:-]",
            )
    return segments


def _is_discovery(segments: list[str]) -> bool:
    """/version, /api[/<v>], /apis[/<g>[/<v>]]: the non-resource discovery paths."""
    prefix = segments[:1]
    return (
        segments == ["version"]
        or (prefix == ["api"] and len(segments) <= 2)
        or (prefix == ["apis"] and len(segments) <= 3)
    )


def _parse_query(raw_query: str) -> tuple[tuple[str, str], ...]:
    """Decode a query as Go's url.ParseQuery does ('+' is a space); refuse anything ambiguous."""
    if raw_query == "":
        return ()
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for number, piece in enumerate(raw_query.split("&"), start=1):
        raw_key, _, raw_value = piece.partition("=")
        key = _decode(raw_key, f"query parameter {number} name")
        value = _decode(raw_value, f"query parameter {_q(key)} value")
        if key == "":
            raise Refusal(
                400,
                "empty query key",
                f"query parameter {number} has an empty name",
                rule=Rule.BAD_QUERY,
            )
        _check_query_key(key)
        if key in seen:
            # SECURITY: DESIGN §4.5 - the apiserver reads the first value, a check may read another.
            raise Refusal(
                400,
                "repeated query parameter",
                f"query parameter {_q(key)} is given more than once",
                rule=Rule.BAD_QUERY,
            )
        seen.add(key)
        if key in _BOOL_PARAMETERS:
            _parse_bool(key, value)
        pairs.append((key, value))
    return tuple(pairs)


def _decode(raw: str, where: str) -> str:
    """Form-decode one query component strictly: valid escapes, UTF-8, no control characters."""
    if _BAD_ESCAPE.search(raw):
        raise Refusal(
            400, "bad query encoding", f"{where} has an invalid percent-escape", rule=Rule.BAD_QUERY
        )
    try:
        text = unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(
            400, "bad query encoding", f"{where} is not valid UTF-8", rule=Rule.BAD_QUERY
        ) from None
    if _CONTROL.search(text):
        raise Refusal(
            400,
            "bad query encoding",
            f"{where} decodes to a control character",
            rule=Rule.BAD_QUERY,
        )
    return text


def _check_query_key(key: str) -> None:
    """Refuse keys the apiserver would silently ignore, suggesting the likely intended one."""
    if key in ALLOWED_QUERY_PARAMETERS:
        return
    # SECURITY: DESIGN §4.5 - an ignored ?fieldselector= would widen a list to everything.
    lower = {allowed.lower(): allowed for allowed in ALLOWED_QUERY_PARAMETERS}
    guess = lower.get(key.lower()) or next(
        iter(difflib.get_close_matches(key, sorted(ALLOWED_QUERY_PARAMETERS), n=1)), None
    )
    hint = f"; did you mean {_q(guess)}?" if guess else ""
    raise Refusal(
        400,
        "unknown query parameter",
        f"query parameter {_q(key)} is not recognized (query keys are case-sensitive{hint})",
        rule=Rule.BAD_QUERY,
    )


def _parse_bool(key: str, value: str) -> bool:
    """A boolean query value both Go's ParseBool and the apiserver read the same way."""
    if value in _TRUE_VALUES:
        return True
    if value in _FALSE_VALUES:
        return False
    raise Refusal(
        400,
        "invalid boolean query value",
        f"query parameter {_q(key)} has value {_q(value)}; use true or false",
        rule=Rule.BAD_QUERY,
    )


def _watch_requested(query: tuple[tuple[str, str], ...]) -> bool:
    """True when ``watch`` is present with a true value (already validated)."""
    return any(k == "watch" and _parse_bool(k, v) for k, v in query)


def _non_resource_info(
    method: str, path: str, query: tuple[tuple[str, str], ...], segments: list[str], watch: bool
) -> RequestInfo:
    """A non-resource request; group/version filled in for /api/<v>, /apis/<g>, /apis/<g>/<v>."""
    if watch:
        why = f"watch is set on {_q(path)}"
        raise Refusal(400, "watch on a non-resource path", why, rule=Rule.BAD_QUERY)
    group = version = ""
    if segments[:1] == ["api"] and len(segments) == 2:
        version = _checked(segments[1], _DNS_1035_LABEL, "API version")
    elif segments[:1] == ["apis"] and len(segments) >= 2:
        group = _checked(segments[1], DNS_SUBDOMAIN, "API group", 253)
        if len(segments) == 3:
            version = _checked(segments[2], _DNS_1035_LABEL, "API version")
    return RequestInfo(
        method, path, query, False, method.lower(), "", group, version, "", "", "", ""
    )


def _resource_info(
    method: str, path: str, query: tuple[tuple[str, str], ...], segments: list[str], watch: bool
) -> RequestInfo | None:
    """A resource request under /api/<v>/... or /apis/<g>/<v>/..., or None if not one."""
    prefix = segments[0] if segments else ""
    if prefix not in ("api", "apis"):
        return None
    consumed = 2 if prefix == "api" else 3  # prefix [group] version
    if len(segments) <= consumed:
        return None
    group = _checked(segments[1], DNS_SUBDOMAIN, "API group", 253) if prefix == "apis" else ""
    version = _checked(segments[consumed - 1], _DNS_1035_LABEL, "API version")
    rest = segments[consumed:]
    if rest[0] in _SPECIAL_VERB_SEGMENTS:
        # SECURITY: DESIGN §4.5 - the apiserver reads /<verb>/ after the version as the verb.
        raise Refusal(
            400, "deprecated verb path prefix", f"the /{rest[0]}/ path prefix is not supported"
        )
    namespace, parts = _locate(rest)
    resource = _checked(parts[0], _DNS_LABEL, "resource")
    name = _checked_name(parts[1]) if len(parts) > 1 else ""
    subresource = _checked(parts[2], _DNS_LABEL, "subresource") if len(parts) > 2 else ""
    verb = _verb(method, name, watch)
    _check_routed(method, verb, name, subresource, path)
    return RequestInfo(
        method, path, query, True, verb, prefix, group, version, namespace, resource,
        subresource, name,
    )  # fmt: skip


def _locate(rest: list[str]) -> tuple[str, list[str]]:
    """Split the parts after the version into namespace and resource/name/subresource."""
    namespace = ""
    parts = rest
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = _checked(rest[1], _DNS_LABEL, "namespace", 63)
        # As requestinfo.go: /namespaces/<ns>[/status|/finalize] is the namespace object itself.
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            parts = rest[2:]
    if len(parts) > 3:
        # SECURITY: DESIGN §4.5 - the apiserver authorizes without the parts after a subresource.
        raise Refusal(
            400,
            "too many path segments",
            f"path has {len(parts) - 3} segment(s) after the subresource {_q(parts[2])}",
        )
    return namespace, parts


def _verb(method: str, name: str, watch: bool) -> str:
    """The Kubernetes verb, as requestinfo.go derives it from method, name and ``watch``."""
    if method in _READ_METHODS:
        if name and watch:
            # The apiserver would serve a plain get here; a watch of one object is a collection
            # watch with fieldSelector=metadata.name=<name> (as client-go and kubectl send it).
            raise Refusal(
                400,
                "watch on a named object",
                f"watch is set on object {_q(name)}; watch the collection with "
                f"fieldSelector=metadata.name={name}",
            )
        return "get" if name else ("watch" if watch else "list")
    verb = _METHOD_VERBS[method]
    return "deletecollection" if verb == "delete" and not name else verb


def _check_routed(method: str, verb: str, name: str, subresource: str, path: str) -> None:
    """405 for a request the apiserver routes to no handler, which the gatekeeper therefore
    cannot classify as one of its verbs: a PUT or PATCH of a collection, a POST to a named
    object (recording 199). Refused with the apiserver's own Status, never forwarded."""
    # SECURITY: DESIGN §4.5 — what the gatekeeper cannot classify, it refuses; it does not ask
    # the apiserver what it would make of it.
    if (verb in ("update", "patch") and not name) or (
        verb == "create" and name and not subresource
    ):
        what = "collection" if not name else "named object"
        raise Refusal(
            405,
            f"{method} to a {what} path",
            METHOD_NOT_ALLOWED,
            rule=Rule.METHOD_NOT_ALLOWED,
        )


def _checked(value: str, pattern: re.Pattern[str], what: str, max_length: int = 63) -> str:
    """``value`` if it fully matches ``pattern`` within ``max_length``, else Refusal(400)."""
    if len(value) > max_length or not pattern.fullmatch(value):
        raise Refusal(400, f"invalid {what}", f"{what} {_q(value)} in the path is not valid")
    return value


def _checked_name(name: str) -> str:
    """An object name the apiserver accepts as a path segment: not ``.``/``..``, no ``/`` or
    ``%`` (DESIGN §4.5); ``_split_path`` already narrowed it further to ``[A-Za-z0-9._:-]``."""
    if name in (".", "..") or "/" in name or "%" in name:
        raise Refusal(400, "invalid name", f"name {_q(name)} in the path is not valid")
    return name


def _q(value: str) -> str:
    """``value`` double-quoted and escaped for a Status message."""
    return json.dumps(value)
