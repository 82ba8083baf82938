"""The bounded copy of a response body that ``responseObject`` logs."""

from __future__ import annotations

from gatekeeper.audit.capture import MAX_CAPTURED_RESPONSE, ResponseCapture


def test_a_json_object_is_captured_across_chunks() -> None:
    capture = ResponseCapture(True, "application/json; charset=utf-8")
    for chunk in (b'{"kind": "Res', b'ourceSlice"}'):
        capture.feed(chunk)
    assert capture.result() == {"kind": "ResourceSlice"}


def test_nothing_is_captured_when_disabled_or_not_json() -> None:
    for capture in (
        ResponseCapture(False, "application/json"),
        ResponseCapture(True, "application/vnd.kubernetes.protobuf"),
        ResponseCapture(True, "application/json"),  # fed nothing
    ):
        assert capture.result() is None
    yaml = ResponseCapture(True, "application/yaml")
    yaml.feed(b"{}")
    assert yaml.result() is None


def test_past_the_limit_the_capture_gives_up() -> None:
    capture = ResponseCapture(True, "application/json", limit=10)
    capture.feed(b'{"a": "12')
    capture.feed(b'345"}')
    assert capture.result() is None
    assert MAX_CAPTURED_RESPONSE == 256 * 1024


def test_only_objects_are_kept() -> None:
    for body in (b"[1, 2]", b"not json", b'"text"'):
        capture = ResponseCapture(True, "application/json")
        capture.feed(body)
        assert capture.result() is None
