"""Request header screening and the headers that cross the gatekeeper (DESIGN §4.5)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from gatekeeper.errors import Refusal
from gatekeeper.request.headers import forwarded_request_headers, response_headers, screen_request

REFUSED = [
    ("impersonate-user", "GET", {"Impersonate-User": "admin"}, "header Impersonate-User is not"),
    ("impersonate-uid", "GET", {"impersonate-uid": "1"}, "header impersonate-uid is not"),
    ("x-remote-group", "GET", {"X-Remote-Group": "system:masters"}, "header X-Remote-Group"),
    ("method-override", "GET", {"X-HTTP-Method-Override": "DELETE"}, "X-HTTP-Method-Override"),
    ("x-method-override", "GET", {"X-Method-Override": "PUT"}, "X-Method-Override"),
    ("upgrade-header", "GET", {"Upgrade": "websocket"}, "connection upgrades"),
    ("connection-upgrade", "GET", {"Connection": "keep-alive, Upgrade"}, "connection upgrades"),
    ("connect", "CONNECT", {}, "method CONNECT is not allowed"),
    ("options", "OPTIONS", {}, "method OPTIONS is not allowed"),
]


@pytest.mark.parametrize(
    ("method", "headers", "reason"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused_headers_and_methods(method: str, headers: dict[str, str], reason: str) -> None:
    with pytest.raises(Refusal) as refused:
        screen_request(method, CIMultiDict(headers))
    assert refused.value.code == 403
    assert reason in refused.value.reason


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
def test_plain_requests_pass(method: str) -> None:
    headers = CIMultiDict({"Accept": "application/json", "Connection": "keep-alive"})
    assert screen_request(method, headers) is None


def test_only_allowed_headers_are_forwarded() -> None:
    sent = CIMultiDict(
        {
            "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
            "User-Agent": "kubectl/v1.32",
            "Content-Type": "application/yaml",
            "Authorization": "Bearer driver-secret",
            "Cookie": "a=b",
            "Proxy-Authorization": "Basic eA==",
            "Audit-ID": "driver-chosen",
            "X-Forwarded-For": "10.0.0.1",
        }
    )
    out = forwarded_request_headers(sent, audit_id="gk-1", content_type="application/json")
    assert out == {
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
        "User-Agent": "kubectl/v1.32",
        "Content-Type": "application/json",
        "Audit-ID": "gk-1",
    }


def test_headers_named_in_connection_are_hop_by_hop() -> None:
    sent = CIMultiDict({"Accept": "*/*", "User-Agent": "x", "Connection": "close, User-Agent"})
    out = forwarded_request_headers(sent, audit_id="gk-2", content_type=None)
    assert out == {"Accept": "*/*", "Audit-ID": "gk-2"}


def test_response_headers_pass_only_what_a_client_reads() -> None:
    upstream = CIMultiDict(
        {
            "Content-Type": "application/json",
            "Cache-Control": "no-cache, private",
            "Warning": '299 - "deprecated"',
            "Retry-After": "1",
            "Audit-Id": "upstream-id",
            "Content-Length": "10",
            "Transfer-Encoding": "chunked",
            "Set-Cookie": "s=1",
        }
    )
    assert response_headers(upstream, audit_id="gk-3") == {
        "Content-Type": "application/json",
        "Cache-Control": "no-cache, private",
        "Warning": '299 - "deprecated"',
        "Retry-After": "1",
        "Audit-Id": "gk-3",
    }
