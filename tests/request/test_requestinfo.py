"""Tests for gatekeeper.request.requestinfo: the canonical request parser (DESIGN §4.5)."""

from __future__ import annotations

import random
from typing import NamedTuple
from urllib.parse import parse_qsl

import pytest

from gatekeeper.errors import Refusal
from gatekeeper.request import requestinfo
from gatekeeper.request.requestinfo import ALLOWED_QUERY_PARAMETERS, RequestInfo, parse_request
from gatekeeper.rule import Rule
from tests.paths import REPO

RS = "/apis/resource.k8s.io/v1"
SL = f"{RS}/resourceslices"
BOOL = "invalid boolean query value"
REPEATED = "repeated query parameter"
UNKNOWN = "unknown query parameter"
CTL = "control or non-ASCII character"
DRIVER_WATCH = (
    f"{RS}/resourceslices?fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.example.com"
    "&watch=true&resourceVersion=12&allowWatchBookmarks=true&timeoutSeconds=300"
)


class Want(NamedTuple):
    verb: str
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    is_resource: bool = True


PODS = Want("list", "", "v1", "", "pods")
DEPRECATED = "deprecated verb path prefix"


def nonres(verb: str = "get", group: str = "", version: str = "") -> Want:
    return Want(verb, group, version, is_resource=False)


ACCEPTED: list[tuple[str, str, str, Want]] = [
    # ResourceSlices, as a DRA driver's kubelet plugin sends them
    ("slices-driver-watch", "GET", DRIVER_WATCH,
     Want("watch", "resource.k8s.io", "v1", "", "resourceslices")),
    ("slices-list", "GET", f"{SL}?limit=500&timeout=32s",
     Want("list", "resource.k8s.io", "v1", "", "resourceslices")),
    ("slices-get", "GET", f"{SL}/node-a-gpu-x7k2p",
     Want("get", "resource.k8s.io", "v1", "", "resourceslices", "", "node-a-gpu-x7k2p")),
    ("slices-create", "POST", f"{SL}?fieldManager=gpu-driver&fieldValidation=Strict",
     Want("create", "resource.k8s.io", "v1", "", "resourceslices")),
    ("slices-create-dry-run", "POST", f"{SL}?dryRun=All",
     Want("create", "resource.k8s.io", "v1", "", "resourceslices")),
    ("slices-update", "PUT", f"{SL}/s1",
     Want("update", "resource.k8s.io", "v1", "", "resourceslices", "", "s1")),
    ("slices-apply", "PATCH", f"{SL}/s1?fieldManager=gpu&force=true",
     Want("patch", "resource.k8s.io", "v1", "", "resourceslices", "", "s1")),
    ("slices-delete", "DELETE", f"{SL}/s1?gracePeriodSeconds=0&propagationPolicy=Orphan",
     Want("delete", "resource.k8s.io", "v1", "", "resourceslices", "", "s1")),
    ("slices-deletecollection", "DELETE", f"{SL}?fieldSelector=spec.nodeName%3Dnode-a",
     Want("deletecollection", "resource.k8s.io", "v1", "", "resourceslices")),
    ("slices-v1beta1", "GET", "/apis/resource.k8s.io/v1beta1/resourceslices",
     Want("list", "resource.k8s.io", "v1beta1", "", "resourceslices")),
    ("slices-v1alpha3-watch-1", "GET", "/apis/resource.k8s.io/v1alpha3/resourceslices?watch=1",
     Want("watch", "resource.k8s.io", "v1alpha3", "", "resourceslices")),
    ("watch-True", "GET", f"{SL}?watch=True",
     Want("watch", "resource.k8s.io", "v1", "", "resourceslices")),
    ("watch-false-is-list", "GET", f"{SL}?watch=false",
     Want("list", "resource.k8s.io", "v1", "", "resourceslices")),
    ("watch-0-is-list", "GET", f"{SL}?watch=0",
     Want("list", "resource.k8s.io", "v1", "", "resourceslices")),
    ("watch-one-by-selector", "GET", f"{SL}?fieldSelector=metadata.name%3Ds1&watch=true",
     Want("watch", "resource.k8s.io", "v1", "", "resourceslices")),
    ("get-with-watch-false", "GET", f"{SL}/s1?watch=false",
     Want("get", "resource.k8s.io", "v1", "", "resourceslices", "", "s1")),
    ("head-collection-is-list", "HEAD", SL,
     Want("list", "resource.k8s.io", "v1", "", "resourceslices")),
    ("head-named-is-get", "HEAD", f"{SL}/s1",
     Want("get", "resource.k8s.io", "v1", "", "resourceslices", "", "s1")),
    ("head-watch", "HEAD", f"{SL}?watch=true",
     Want("watch", "resource.k8s.io", "v1", "", "resourceslices")),
    # ResourceClaims
    ("claim-status-update", "PUT", f"{RS}/namespaces/default/resourceclaims/c1/status",
     Want("update", "resource.k8s.io", "v1", "default", "resourceclaims", "status", "c1")),
    ("claim-status-patch", "PATCH", f"{RS}/namespaces/default/resourceclaims/c1/status",
     Want("patch", "resource.k8s.io", "v1", "default", "resourceclaims", "status", "c1")),
    ("claim-get", "GET", f"{RS}/namespaces/ns-1/resourceclaims/pod-gpu-claim-abcde",
     Want("get", "resource.k8s.io", "v1", "ns-1", "resourceclaims", "", "pod-gpu-claim-abcde")),
    ("claims-all-namespaces-watch", "GET", f"{RS}/resourceclaims?watch=true&resourceVersion=0",
     Want("watch", "resource.k8s.io", "v1", "", "resourceclaims")),
    ("claims-namespaced-list", "GET", f"{RS}/namespaces/default/resourceclaims",
     Want("list", "resource.k8s.io", "v1", "default", "resourceclaims")),
    ("devicepool-get", "GET", "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools/node-a-pool",
     Want("get", "devmgmtproto.k8s.io", "v1alpha1", "", "devicepools", "", "node-a-pool")),
    # core group, kubectl style
    ("secrets-list", "GET", "/api/v1/namespaces/default/secrets?limit=500",
     Want("list", "", "v1", "default", "secrets")),
    ("pod-get", "GET", "/api/v1/namespaces/default/pods/p1",
     Want("get", "", "v1", "default", "pods", "", "p1")),
    ("pod-log", "GET", "/api/v1/namespaces/default/pods/p1/log",
     Want("get", "", "v1", "default", "pods", "log", "p1")),
    ("node-get", "GET", "/api/v1/nodes/node-a", Want("get", "", "v1", "", "nodes", "", "node-a")),
    ("pods-all-namespaces", "GET", "/api/v1/pods?labelSelector=app%3Dgpu&pretty=true",
     PODS),
    ("clusterrole-colon-name", "GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:node",
     Want("get", "rbac.authorization.k8s.io", "v1", "", "clusterroles", "", "system:node")),
    # requestinfo.go's special cases for namespaces themselves
    ("namespace-get", "GET", "/api/v1/namespaces/kube-system",
     Want("get", "", "v1", "kube-system", "namespaces", "", "kube-system")),
    ("namespaces-list", "GET", "/api/v1/namespaces", Want("list", "", "v1", "", "namespaces")),
    ("namespaces-watch", "GET", "/api/v1/namespaces?watch=t",
     Want("watch", "", "v1", "", "namespaces")),
    ("namespace-status", "GET", "/api/v1/namespaces/ns1/status",
     Want("get", "", "v1", "ns1", "namespaces", "status", "ns1")),
    ("namespace-finalize", "PUT", "/api/v1/namespaces/ns1/finalize",
     Want("update", "", "v1", "ns1", "namespaces", "finalize", "ns1")),
    ("namespace-delete", "DELETE", "/api/v1/namespaces/ns1",
     Want("delete", "", "v1", "ns1", "namespaces", "", "ns1")),
    # query decoding as Go's url.ParseQuery
    ("plus-is-space", "GET", "/api/v1/pods?labelSelector=env+in+(a,b)", PODS),
    ("escaped-key", "GET", "/api/v1/pods?field%53elector=x%3Dy", PODS),
    ("escaped-ampersand", "GET", "/api/v1/pods?fieldSelector=a%26watch%3Dtrue",
     PODS),
    ("empty-value", "GET", "/api/v1/pods?labelSelector=", PODS),
    ("empty-query", "GET", "/api/v1/pods?", PODS),
    # non-resource: discovery, version, openapi, health
    ("root", "GET", "/", nonres()),
    ("api", "GET", "/api?timeout=32s", nonres()),
    ("api-v1", "GET", "/api/v1", nonres(version="v1")),
    ("apis", "GET", "/apis", nonres()),
    ("apis-group", "GET", "/apis/resource.k8s.io", nonres(group="resource.k8s.io")),
    ("apis-group-version", "GET", RS, nonres(group="resource.k8s.io", version="v1")),
    ("version", "GET", "/version?timeout=32s", nonres()),
    ("openapi-v2", "GET", "/openapi/v2", nonres()),
    ("openapi-v3", "GET", "/openapi/v3", nonres()),
    ("openapi-v3-group", "GET", "/openapi/v3/apis/resource.k8s.io/v1?hash=0FE1A2B3C4", nonres()),
    ("healthz", "GET", "/healthz", nonres()),
    ("readyz", "GET", "/readyz", nonres()),
    ("head-version", "HEAD", "/version", nonres("head")),
    ("post-non-resource", "POST", "/apis", nonres("post")),
    # discovery with a trailing slash, as the official Python client asks for it (the apiserver
    # serves the same documents); the path stays as received
    ("api-slash", "GET", "/api/", nonres()),
    ("api-v1-slash", "GET", "/api/v1/", nonres(version="v1")),
    ("apis-slash", "GET", "/apis/", nonres()),
    ("apis-group-slash", "GET", "/apis/resource.k8s.io/", nonres(group="resource.k8s.io")),
    ("apis-group-version-slash", "GET", f"{RS}/", nonres(group="resource.k8s.io", version="v1")),
    ("version-slash", "GET", "/version/", nonres()),
]  # fmt: skip


@pytest.mark.parametrize(("method", "target", "want"), [c[1:] for c in ACCEPTED],
                         ids=[c[0] for c in ACCEPTED])  # fmt: skip
def test_accepted(method: str, target: str, want: Want) -> None:
    info = parse_request(method, target)
    got = Want(
        info.verb, info.api_group, info.api_version, info.namespace, info.resource,
        info.subresource, info.name, info.is_resource_request,
    )  # fmt: skip
    assert got == want
    assert info.method == method
    assert info.path == target.partition("?")[0]
    assert info.api_prefix == (target.split("/")[1] if want.is_resource else "")


@pytest.mark.parametrize(("method", "target"), [c[1:3] for c in ACCEPTED],
                         ids=[c[0] for c in ACCEPTED])  # fmt: skip
def test_target_round_trips(method: str, target: str) -> None:
    info = parse_request(method, target)
    again = parse_request(method, info.target)
    assert again == info
    assert again.target == info.target


REFUSED: list[tuple[str, str, str, str]] = [
    # path shape
    ("double-slash", "GET", "/apis//resource.k8s.io/v1/resourceslices", "empty path segment"),
    ("leading-double-slash", "GET", "//api/v1/pods", "empty path segment"),
    ("dot-segment", "GET", "/api/v1/./pods", "dot path segment"),
    ("dotdot-segment", "GET", f"{RS}/../v1/resourceslices", "dot path segment"),
    ("trailing-slash-collection", "GET", f"{SL}/", "trailing slash"),
    ("trailing-slash-object", "GET", f"{SL}/s1/", "trailing slash"),
    ("trailing-slash-openapi", "GET", "/openapi/v3/", "trailing slash"),
    ("trailing-slash-healthz", "GET", "/healthz/", "trailing slash"),
    ("double-trailing-slash-api", "GET", "/api//", "trailing slash"),
    ("pct-2e2e-name", "GET", "/api/v1/namespaces/default/secrets/%2e%2e", "percent-escape in path"),
    ("pct-2f-name", "GET", f"{SL}/a%2Fb", "percent-escape in path"),
    ("pct-letter", "GET", "/api/v1/namespaces/%64efault/pods", "percent-escape in path"),
    ("at-in-name", "GET", "/api/v1/namespaces/default/pods/a@b", "forbidden character in path"),
    ("plus-in-name", "GET", "/api/v1/namespaces/default/pods/a+b", "forbidden character in path"),
    ("tilde-in-name", "GET", "/api/v1/namespaces/default/pods/a~b", "forbidden character in path"),
    ("too-many-parts", "GET", "/api/v1/namespaces/default/pods/p/log/x", "too many path segments"),
    ("namespace-status-extra", "PUT", "/api/v1/namespaces/ns/status/x", "too many path segments"),
    # forbidden bytes anywhere in the target
    ("backslash-path", "GET", "/api/v1/pods\\x", "forbidden character"),
    ("backslash-query", "GET", "/api/v1/pods?labelSelector=a\\b", "forbidden character"),
    ("semicolon-jsessionid", "GET", "/api/v1/pods;jsessionid=1", "forbidden character"),
    ("semicolon-query", "GET", "/api/v1/pods?limit=1;watch=true", "forbidden character"),
    ("fragment", "GET", "/api/v1/pods#x", "forbidden character"),
    ("tab", "GET", "/api/v1/po\tds", CTL),
    ("newline-query", "GET", "/api/v1/pods?limit=1\n", CTL),
    ("space", "GET", "/api/v1/pods x", CTL),
    ("nul", "GET", "/api/v1/pods\x00", CTL),
    ("del", "GET", "/api/v1/pods\x7f", CTL),
    ("non-ascii-path", "GET", "/api/v1/namespaces/d\u00e9fault/pods", CTL),
    ("non-ascii-query", "GET", "/api/v1/pods?labelSelector=\u00e9", CTL),
    ("absolute-form", "GET", "http://10.0.0.1/api/v1/pods", "not an origin-form target"),
    ("asterisk-form", "GET", "*", "not an origin-form target"),
    ("empty-target", "GET", "", "not an origin-form target"),
    # deprecated verb prefixes
    ("watch-prefix-core", "GET", "/api/v1/watch/namespaces/default/pods", DEPRECATED),
    ("watch-prefix-group", "GET", f"{RS}/watch/resourceslices", DEPRECATED),
    ("proxy-prefix", "GET", "/api/v1/proxy/nodes/node-a", DEPRECATED),
    # watch values and placement
    ("watch-yes", "GET", f"{SL}?watch=yes", BOOL),
    ("watch-f", "GET", f"{SL}?watch=f", BOOL),
    ("watch-empty", "GET", f"{SL}?watch=", BOOL),
    ("watch-bare", "GET", f"{SL}?watch", BOOL),
    ("watch-mixed-case", "GET", f"{SL}?watch=FaLsE", BOOL),
    ("bookmarks-yes", "GET", f"{SL}?allowWatchBookmarks=yes", BOOL),
    ("force-empty", "PATCH", f"{SL}/s1?force=", BOOL),
    ("watch-named", "GET", f"{SL}/s1?watch=true", "watch on a named object"),
    ("watch-on-post", "POST", f"{SL}?watch=true", "watch on a write"),
    ("watch-non-resource", "GET", "/version?watch=true", "watch on a non-resource path"),
    # query keys
    ("repeated-watch", "GET", f"{SL}?watch=true&watch=false", REPEATED),
    ("repeated-same-value", "GET", f"{SL}?limit=1&limit=1", REPEATED),
    ("repeated-via-escape", "GET", "/api/v1/pods?fieldSelector=a&field%53elector=b",
     REPEATED),
    ("fieldselector-lower", "GET", f"{SL}?fieldselector=x", UNKNOWN),
    ("fieldSelector-upper", "GET", f"{SL}?FieldSelector=x", UNKNOWN),
    ("unknown-key", "GET", f"{SL}?foo=bar", UNKNOWN),
    ("unsafe-delete-option", "DELETE",
     f"{SL}/s1?ignoreStoreReadErrorWithClusterBreakingPotential=true",
     UNKNOWN),
    ("empty-key", "GET", "/api/v1/pods?=x", "empty query key"),
    ("empty-piece", "GET", "/api/v1/pods?limit=1&&watch=true", "empty query key"),
    ("lone-ampersand", "GET", "/api/v1/pods?&", "empty query key"),
    # query encoding
    ("bad-escape", "GET", "/api/v1/pods?fieldSelector=%zz", "bad query encoding"),
    ("short-escape", "GET", "/api/v1/pods?fieldSelector=a%4", "bad query encoding"),
    ("bad-escape-key", "GET", "/api/v1/pods?%G0=x", "bad query encoding"),
    ("invalid-utf8", "GET", "/api/v1/pods?labelSelector=%ff", "bad query encoding"),
    ("decoded-nul", "GET", "/api/v1/pods?labelSelector=a%00", "bad query encoding"),
    ("decoded-newline", "GET", "/api/v1/pods?fieldSelector=a%3Db%0A", "bad query encoding"),
    # names, namespaces, groups, versions, resources
    ("namespace-upper", "GET", "/api/v1/namespaces/Default/pods", "invalid namespace"),
    ("namespace-dot", "GET", "/api/v1/namespaces/a.b/pods", "invalid namespace"),
    ("namespace-dash", "GET", "/api/v1/namespaces/-ns/pods", "invalid namespace"),
    ("namespace-colon", "GET", "/api/v1/namespaces/a:b", "invalid namespace"),
    ("namespace-too-long", "GET", f"/api/v1/namespaces/{'a' * 64}/pods", "invalid namespace"),
    ("group-upper", "GET", "/apis/Resource.k8s.io/v1/resourceslices", "invalid API group"),
    ("group-non-resource", "GET", "/apis/resource_k8s_io", "invalid API group"),
    ("version-upper", "GET", "/api/V1/pods", "invalid API version"),
    ("version-digit-first", "GET", "/apis/resource.k8s.io/1/resourceslices", "invalid API version"),
    ("resource-upper", "GET", "/api/v1/Pods", "invalid resource"),
    ("resource-colon", "GET", "/api/v1/pods:x", "invalid resource"),
    ("subresource-upper", "PUT", f"{RS}/namespaces/default/resourceclaims/c1/Status",
     "invalid subresource"),
    # methods (DESIGN §4.5: 403)
    ("method-options", "OPTIONS", "/api/v1/pods", "method not allowed"),
    ("method-connect", "CONNECT", "/api/v1/pods", "method not allowed"),
    ("method-lowercase", "get", "/api/v1/pods", "method not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "target", "reason"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])  # fmt: skip
def test_refused(method: str, target: str, reason: str) -> None:
    with pytest.raises(Refusal) as caught:
        parse_request(method, target)
    assert caught.value.reason == reason
    assert caught.value.code == (403 if reason == "method not allowed" else 400)
    assert caught.value.message and caught.value.message != reason


UNROUTED = [
    ("put-collection", "PUT", SL),
    ("patch-collection", "PATCH", f"{SL}?fieldManager=x"),
    ("put-namespaced-collection", "PUT", f"{RS}/namespaces/default/resourceclaims"),
    ("patch-namespaces", "PATCH", "/api/v1/namespaces"),
    ("post-named", "POST", f"{SL}/s1"),
    ("post-named-namespaced", "POST", f"{RS}/namespaces/default/resourceclaims/c1"),
]


@pytest.mark.parametrize(
    ("method", "target"), [c[1:] for c in UNROUTED], ids=[c[0] for c in UNROUTED]
)
def test_a_request_the_apiserver_routes_nowhere_is_405(method: str, target: str) -> None:
    """The gatekeeper cannot classify it as one of its verbs: refused with the apiserver's own
    Status (recording 199), never forwarded to ask what the apiserver makes of it."""
    with pytest.raises(Refusal) as caught:
        parse_request(method, target)
    refusal = caught.value
    assert (refusal.code, refusal.rule) == (405, Rule.METHOD_NOT_ALLOWED)
    assert refusal.message == "the server does not allow this method on the requested resource"


@pytest.mark.parametrize(
    ("method", "target"),
    [("POST", f"{RS}/namespaces/default/pods/p/eviction"), ("PUT", f"{SL}/s1"),
     ("PATCH", f"{RS}/namespaces/default/resourceclaims/c1/status"),
     ("PUT", "/api/v1/namespaces/ns/status"), ("DELETE", SL)],
    ids=["post-subresource", "put-named", "patch-status", "put-namespace-status",
         "deletecollection"],
)  # fmt: skip
def test_writes_the_apiserver_routes_are_classified(method: str, target: str) -> None:
    assert parse_request(method, target).verb in ("create", "update", "patch", "deletecollection")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/apis//v1", "path segment 2 is empty"),
        ("/apis/g/./x", 'path segment 3 is "."'),
        (
            f"{SL}?fieldselector=x",
            'query parameter "fieldselector" is not recognized '
            '(query keys are case-sensitive; did you mean "fieldSelector"?)',
        ),
        (f"{SL}?watch=yes", 'query parameter "watch" has value "yes"; use true or false'),
        (f"{SL}?limit=1&limit=2", 'query parameter "limit" is given more than once'),
        ("/api/v1/namespaces/Default/pods", 'namespace "Default" in the path is not valid'),
    ],
    ids=["empty", "dot", "did-you-mean", "watch-value", "repeated", "namespace"],
)  # fmt: skip
def test_refusal_message_says_what_and_where(target: str, message: str) -> None:
    with pytest.raises(Refusal) as caught:
        parse_request("GET", target)
    assert caught.value.message == message


def test_canonical_query_keeps_selector_value() -> None:
    value = "spec.nodeName=node-a,spec.driver=x"
    info = parse_request("GET", SL).with_query("fieldSelector", value)
    assert info.query_string == "fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dx"
    assert parse_qsl(info.query_string, strict_parsing=True) == [("fieldSelector", value)]
    assert parse_request("GET", info.target).query_value("fieldSelector") == value


@pytest.mark.parametrize(
    ("raw_query", "decoded", "canonical"),
    [
        ("labelSelector=env+in+(a,b)", "env in (a,b)", "labelSelector=env%20in%20%28a%2Cb%29"),
        ("fieldSelector=a%26watch%3Dtrue", "a&watch=true", "fieldSelector=a%26watch%3Dtrue"),
        ("labelSelector=a%2Bb", "a+b", "labelSelector=a%2Bb"),
        ("field%53elector=x", "x", "fieldSelector=x"),
        ("labelSelector=%C3%A9", "\u00e9", "labelSelector=%C3%A9"),
    ],
    ids=["plus-space", "escaped-ampersand", "escaped-plus", "escaped-key", "utf8"],
)
def test_query_decoding_and_reencoding(raw_query: str, decoded: str, canonical: str) -> None:
    info = parse_request("GET", f"/api/v1/pods?{raw_query}")
    assert [v for _, v in info.query] == [decoded]
    assert info.query_string == canonical
    assert parse_qsl(info.query_string) == list(info.query)


def test_query_keeps_received_order_and_target() -> None:
    info = parse_request("GET", DRIVER_WATCH)
    assert [k for k, _ in info.query] == [
        "fieldSelector", "watch", "resourceVersion", "allowWatchBookmarks", "timeoutSeconds",
    ]  # fmt: skip
    assert info.target == DRIVER_WATCH
    assert info.query_value("resourceVersion") == "12"
    assert info.query_value("labelSelector") is None


def test_target_without_query_is_the_path() -> None:
    info = parse_request("GET", "/api/v1/pods?")
    assert info.query == ()
    assert info.target == "/api/v1/pods"


class TestWithQuery:
    base = parse_request("GET", f"{SL}?limit=500&watch=true&timeoutSeconds=5")

    def test_appends_a_new_key(self) -> None:
        info = self.base.with_query("fieldSelector", "spec.nodeName=node-a")
        assert info.query[-1] == ("fieldSelector", "spec.nodeName=node-a")
        assert info.verb == "watch"
        assert self.base.query_value("fieldSelector") is None  # the original is unchanged

    def test_replaces_in_place(self) -> None:
        info = self.base.with_query("limit", "10")
        assert info.query == (("limit", "10"), ("watch", "true"), ("timeoutSeconds", "5"))

    def test_none_removes(self) -> None:
        info = self.base.with_query("limit", None).with_query("pretty", None)
        assert info.query == (("watch", "true"), ("timeoutSeconds", "5"))

    def test_empty_value_is_kept(self) -> None:
        assert self.base.with_query("labelSelector", "").query_value("labelSelector") == ""

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("watch", "false"),
            ("fieldselector", "x"),
            ("bogus", "x"),
            ("allowWatchBookmarks", "yes"),
        ],
        ids=["watch", "case", "unknown", "bad-bool"],
    )
    def test_refuses(self, key: str, value: str) -> None:
        with pytest.raises(ValueError):
            self.base.with_query(key, value)


def test_request_info_is_frozen() -> None:
    info = parse_request("GET", "/api/v1/pods")
    with pytest.raises(AttributeError):
        info.verb = "get"  # type: ignore[misc]
    assert isinstance(info, RequestInfo)


def test_allowed_query_parameters() -> None:
    assert isinstance(ALLOWED_QUERY_PARAMETERS, frozenset)
    kubectl_and_client_go = {"timeout", "limit", "fieldValidation", "fieldManager", "watch"}
    assert kubectl_and_client_go <= ALLOWED_QUERY_PARAMETERS
    assert "fieldselector" not in ALLOWED_QUERY_PARAMETERS


def test_exports() -> None:
    assert requestinfo.__all__ == [
        "ALLOWED_QUERY_PARAMETERS",
        "METHOD_NOT_ALLOWED",
        "RequestInfo",
        "parse_request",
    ]


_FUZZ_PIECES = [
    "/", "//", "api", "apis", "v1", "resource.k8s.io", "namespaces", "default", "status",
    "watch", "resourceslices", ".", "..", "%", "%2F", "%zz", "?", "&", "=", "+", ";", "\\",
    "watch=true", "fieldSelector=", "a", "-", ":", "#", " ", "\t", "~", "@",
]  # fmt: skip


def test_fuzz_only_refusals() -> None:
    """Arbitrary ASCII targets either parse (and round-trip) or raise Refusal, nothing else."""
    rng = random.Random(4_5)
    alphabet = [chr(c) for c in range(128)]
    for _ in range(5000):
        if rng.random() < 0.5:
            target = "".join(rng.choice(_FUZZ_PIECES) for _ in range(rng.randint(0, 12)))
        else:
            target = "/" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        method = rng.choice(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
        try:
            info = parse_request(method, target)
        except Refusal as refusal:
            assert refusal.code in (400, 403)
            continue
        assert parse_request(method, info.target) == info


def test_as_create_is_the_collection_post_with_create_options_only() -> None:
    info = parse_request(
        "PATCH", "/apis/resource.k8s.io/v1/resourceslices/s1?fieldManager=a%20b&force=true&pretty=1"
    )
    create = info.as_create()
    assert (create.method, create.verb, create.name) == ("POST", "create", "")
    assert create.target == "/apis/resource.k8s.io/v1/resourceslices?fieldManager=a%20b&pretty=1"
    assert create == parse_request("POST", create.target)
    with pytest.raises(ValueError):
        parse_request("GET", "/apis/resource.k8s.io/v1/resourceslices").as_create()


def test_as_list_keeps_only_the_named_query_keys() -> None:
    info = parse_request(
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/d/resourceclaims?watch=true&labelSelector=a%3Db"
        "&resourceVersion=5&timeoutSeconds=9",
    )
    listing = info.as_list(["labelSelector", "watch"]).with_query("resourceVersion", "7")
    assert (listing.method, listing.verb) == ("GET", "list")
    assert listing.target == (
        "/apis/resource.k8s.io/v1/namespaces/d/resourceclaims?labelSelector=a%3Db&resourceVersion=7"
    )
    assert listing == parse_request("GET", listing.target)


def test_requestinfo_is_the_only_query_encoder() -> None:
    """Every query the gatekeeper sends is RequestInfo's canonical form (not the fake's)."""
    import ast

    package = REPO / "gatekeeper"
    encoders = {"urlencode", "quote", "quote_plus"}
    users = []
    for path in package.rglob("*.py"):
        if "testing" in path.parts or path.name == "requestinfo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else set()
            if getattr(node, "module", None) == "urllib.parse" and encoders & names:
                users.append(path.name)
    assert users == []
