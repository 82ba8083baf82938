"""Property tests of the request parser against an independent model of the kube-apiserver's
RequestInfo resolver (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go, written here from
its source, not from gatekeeper/request/requestinfo.py): whatever the gatekeeper accepts, it reads
as the apiserver will; whatever it cannot read the same way, it refuses with 400 or 403.

Hypothesis profiles: ``ci`` (default, a few seconds) and ``long``;
docs/development.md#property-tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, quote

from hypothesis import event, given, note
from hypothesis import strategies as st

from gatekeeper.errors import Refusal
from gatekeeper.request.requestinfo import RequestInfo, parse_request

# --- the model -------------------------------------------------------------------------------

_SPECIAL_VERBS = {"proxy", "watch"}
_NO_SUBRESOURCE_VERBS = {"proxy"}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_METHOD_VERB = {
    "POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
    "DELETE": "delete",
}  # fmt: skip


@dataclass
class ModelInfo:
    is_resource_request: bool = False
    verb: str = ""
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = ()


def model_request_info(method: str, path: str, query: str) -> ModelInfo | str:
    """NewRequestInfo for a decoded path; an error string where it returns an error."""
    info = ModelInfo(verb=method.lower())
    parts = path.strip("/").split("/") if path.strip("/") else []
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return info
    info.api_prefix, parts = parts[0], parts[1:]
    if info.api_prefix != "api":
        if len(parts) < 3:
            return info
        info.api_group, parts = parts[0], parts[1:]
    info.is_resource_request = True
    info.api_version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return "unable to determine kind and namespace"
        info.verb, parts = parts[0], parts[1:]
    else:
        info.verb = _METHOD_VERB.get(method, "")
    if parts[0] == "namespaces" and len(parts) > 1:
        info.namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    info.parts = tuple(parts)
    if len(parts) >= 3 and info.verb not in _NO_SUBRESOURCE_VERBS:
        info.subresource = parts[2]
    if len(parts) >= 2:
        info.name = parts[1]
    info.resource = parts[0]
    if not info.name and info.verb == "get":
        values = parse_qs(query, keep_blank_values=True).get("watch", [])
        watch = bool(values) and not (values[0] == "0" or values[0].lower() == "false")
        info.verb = "watch" if watch else "list"
    if not info.name and info.verb == "delete":
        info.verb = "deletecollection"
    return info


# --- what is generated -----------------------------------------------------------------------

_SEGMENTS = st.sampled_from(
    [
        "api", "apis", "v1", "v1beta2", "resource.k8s.io", "devmgmtproto.k8s.io", "namespaces",
        "default", "kube-system", "status", "finalize", "watch", "proxy", "resourceslices",
        "resourceclaims", "nodes", "node-a", "s1", "a.b", "A", "a:b", "x_y", "", ".", "..",
        "%2e", "%2F", "a;b", "a\\b", "a b", "é", "\x00", "*", "~", "$", "1",
    ]
)  # fmt: skip
_KEYS = st.sampled_from(
    [
        "watch", "fieldSelector", "labelSelector", "limit", "resourceVersion", "dryRun", "pretty",
        "fieldselector", "Watch", "x", "", "timeoutSeconds", "allowWatchBookmarks",
    ]
)  # fmt: skip
_VALUES = st.sampled_from(
    [
        "", "true", "false", "0", "1", "t", "f", "TRUE", "FaLsE", "yes", "All", "a=b",
        "metadata.name=s1", "metadata.name%3Ds1", "%zz", "%00", "+", "%C3%A9", "%FF",
    ]
)  # fmt: skip
_METHODS = st.sampled_from(
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] * 4 + ["OPTIONS", "TRACE", "CONNECT", "get"]
)


_VALID = st.sampled_from(
    ["resourceslices", "resourceclaims", "namespaces", "status", "finalize", "s1", "node-a",
     "a.b", "a:b", "A", "default", "v1", "watch", "proxy"]
)  # fmt: skip


@st.composite
def _structured(draw: st.DrawFn) -> list[str]:
    """Segments shaped like API paths (prefix, version, namespace, resource, name, sub, more),
    any of which may be replaced by a random segment."""
    parts = draw(st.sampled_from([["api", "v1"], ["apis", "resource.k8s.io", "v1"], ["apis"]]))
    if draw(st.booleans()):
        parts += ["namespaces", draw(st.sampled_from(["default", "status", "finalize", "x"]))]
    parts += draw(st.lists(_VALID, max_size=4))
    return [draw(_SEGMENTS) if draw(st.integers(0, 19)) == 0 else p for p in parts]


@st.composite
def targets(draw: st.DrawFn) -> str:
    segments = draw(st.one_of(_structured(), st.lists(_SEGMENTS, max_size=8)))
    path = "/" + "/".join(segments)
    if draw(st.booleans()):
        return path
    pairs = draw(st.lists(st.tuples(_KEYS, _VALUES), max_size=3))
    separator = draw(st.sampled_from(["=", ""]))
    return path + "?" + "&".join(f"{k}{separator if v else '='}{v}" for k, v in pairs)


# --- the properties --------------------------------------------------------------------------


def _compare(info: RequestInfo, model: ModelInfo) -> None:
    assert info.is_resource_request == model.is_resource_request
    assert info.verb == model.verb
    if not info.is_resource_request:
        return
    assert (info.api_prefix, info.api_group, info.api_version) == (
        model.api_prefix, model.api_group, model.api_version,
    )  # fmt: skip
    assert (info.namespace, info.resource, info.name, info.subresource) == (
        model.namespace, model.resource, model.name, model.subresource,
    )  # fmt: skip
    # Nothing past the subresource: the apiserver authorizes without it.
    assert len(model.parts) <= 3


@given(_METHODS, targets())
def test_accepted_targets_read_as_the_apiserver_reads_them(method: str, target: str) -> None:
    try:
        info = parse_request(method, target)
    except Refusal as refusal:
        assert refusal.code in (400, 403, 405), refusal.message
        if refusal.code == 405:
            path, _, query = target.partition("?")
            model = model_request_info(method, path, query)
            assert isinstance(model, ModelInfo) and _unrouted(model), (model, refusal.message)
        event(f"refused: {refusal.reason}")
        return
    note(repr(info))
    event("accepted resource request" if info.is_resource_request else "accepted non-resource")
    path, _, query = target.partition("?")
    # Accepted paths have no escapes: the apiserver's decoded req.URL.Path is the same string.
    assert "%" not in path and info.path == path
    model = model_request_info(method, path, query)
    assert isinstance(model, ModelInfo), model
    _compare(info, model)
    # The canonical target forwarded upstream reads the same again (in the model too).
    again = parse_request(method, info.target)
    assert again == info
    _compare(again, model_request_info(method, again.path, again.target.partition("?")[2]))  # type: ignore[arg-type]


def _unrouted(model: ModelInfo) -> bool:
    """A request the apiserver routes to no handler (405): a PUT or PATCH of a collection, a
    POST to a named object without a subresource."""
    collection_write = model.verb in ("update", "patch") and not model.name
    named_create = model.verb == "create" and bool(model.name) and not model.subresource
    return model.is_resource_request and (collection_write or named_create)


@given(_METHODS, st.text(max_size=60))
def test_any_text_is_parsed_or_refused_never_crashes(method: str, text: str) -> None:
    try:
        parse_request(method, "/" + text)
    except Refusal as refusal:
        assert refusal.code in (400, 403, 405)


@given(st.lists(st.text(alphabet="ab%/.;?&=+\\", max_size=6), max_size=6))
def test_escaped_forms_are_refused_or_identical(parts: list[str]) -> None:
    target = "/apis/resource.k8s.io/v1/" + "/".join(quote(p, safe="%/.;?&=+\\") for p in parts)
    try:
        info = parse_request("GET", target)
    except Refusal:
        return
    assert "%" not in info.path and ".." not in info.path.split("/")


def test_model_examples() -> None:
    """The model itself, on examples read off requestinfo.go's own tests."""
    pods = model_request_info("GET", "/api/v1/namespaces/other/pods/foo", "")
    assert isinstance(pods, ModelInfo)
    assert (pods.verb, pods.namespace, pods.resource, pods.name) == ("get", "other", "pods", "foo")
    watch = model_request_info("GET", "/api/v1/watch/namespaces/other/pods", "")
    assert isinstance(watch, ModelInfo) and watch.verb == "watch" and watch.namespace == "other"
    listing = model_request_info("GET", "/apis/g/v/things", "watch=FALSE")
    assert isinstance(listing, ModelInfo) and listing.verb == "list"
    ns_status = model_request_info("PUT", "/api/v1/namespaces/other/status", "")
    assert isinstance(ns_status, ModelInfo)
    assert (ns_status.resource, ns_status.name, ns_status.subresource) == (
        "namespaces", "other", "status",
    )  # fmt: skip
    assert (
        model_request_info("GET", "/api/v1/watch", "") == "unable to determine kind and namespace"
    )
    assert not model_request_info("GET", "/apis/g/v", "").is_resource_request  # type: ignore[union-attr]
