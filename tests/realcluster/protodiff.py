"""The differential check of the gatekeeper's protobuf reader against the kube-apiserver's own
decoding (``cmd/protodiff``): one case is a target (``group/version/Kind`` or
``DeleteOptions``), a body, and what Go's generated code saw in it.

The rule: wherever Go sees a value (apiVersion, kind, name, namespace, resourceVersion, a
DeleteOptions field), the gatekeeper's reader sees the same value or refuses the body; and for
every body the gatekeeper accepts, the pinned body (:func:`with_resource_version`) is read by Go
with exactly the pinned resourceVersion and nothing else changed.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.codec.kubeproto import (
    Envelope,
    ProtobufError,
    ProtobufProblem,
    delete_options,
    read_envelope,
    with_resource_version,
)

__all__ = ["DELETE", "Check", "Pinned", "decode", "generate"]

DELETE = "DeleteOptions"
_VALUES = ("apiVersion", "kind", "name", "namespace", "resourceVersion")


def _text(view: dict[str, Any], key: str) -> bytes:
    return bytes.fromhex(view.get(key, ""))


def _sees(view: dict[str, Any] | None) -> bool:
    return view is not None and "err" not in view


def generate(binary: str, seed: int, count: int, start: int = 0) -> Iterator[dict[str, Any]]:
    """The cases of ``seed``, streamed from ``protodiff generate``."""
    args = [binary, "generate", "-seed", str(seed), "-from", str(start), "-count", str(count)]
    with subprocess.Popen(args, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        for line in process.stdout:
            yield json.loads(line)
    assert process.returncode == 0, f"protodiff generate exited {process.returncode}"


def decode(binary: str, cases: Iterable[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """What Go sees in each (target, body), decoded by ``protodiff decode`` in one batch."""
    lines = "".join(f"{target}\t{body.hex()}\n" for target, body in cases).encode()
    done = subprocess.run(
        [binary, "decode"], input=lines, stdout=subprocess.PIPE, check=True, timeout=300
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


@dataclass(frozen=True, slots=True)
class Pinned:
    """A body the gatekeeper accepted, pinned: Go must read ``resource_version`` in it and the
    rest as in the original."""

    case: str
    target: str
    body: bytes
    resource_version: str
    envelope: Envelope
    original: dict[str, Any]
    """What Go saw in the body before the pin."""


@dataclass
class Check:
    """Cases checked so far: the divergences found, the pins to check, and counts by outcome."""

    failures: list[str] = field(default_factory=list)
    pins: list[Pinned] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def fail(self, case: str, target: str, body: bytes, problem: str) -> None:
        self.failures.append(f"{case} {target} {body.hex()}: {problem}")

    def case(self, case: str, target: str, body: bytes, go: dict[str, Any], pin_to: str) -> None:
        """Check one case of what Go saw (``go``); an accepted object body is pinned to
        ``pin_to`` for :meth:`pinned`."""
        if target == DELETE:
            self._delete(case, body, go)
            return
        go_sees = [name for name in ("u", "c", "m") if _sees(go.get(name))]
        self.counts[f"go sees values: {bool(go_sees)}"] += 1
        try:
            envelope = read_envelope(body)
        except ProtobufError as exc:
            self.counts[f"refused ({exc.problem.value}) where go sees values: {bool(go_sees)}"] += 1
            if exc.problem is ProtobufProblem.MALFORMED and {"c", "m"} & set(go_sees):
                # A malformed body's dry run goes upstream unpinned, for the apiserver's words.
                self.fail(case, target, body, f"refused as malformed ({exc}), but Go reads it")
            return
        for problem in _object_differences(envelope, target, go):
            self.fail(case, target, body, problem)
        if _envelope_of(target) != (envelope.api_version, envelope.kind):
            self.counts["read, refused as another kind or version"] += 1
            return
        self.counts["accepted"] += 1
        try:
            pinned = with_resource_version(body, pin_to)
        except ProtobufError as exc:
            self.fail(case, target, body, f"read, but the pin fails: {exc}")
            return
        self.pins.append(Pinned(case, target, pinned, pin_to, envelope, go))

    def _delete(self, case: str, body: bytes, go: dict[str, Any]) -> None:
        seen = go.get("d")
        self.counts[f"go sees DeleteOptions: {_sees(seen)}"] += 1
        try:
            options = delete_options(body)
        except ProtobufError as exc:
            self.counts[f"DeleteOptions refused ({exc.problem.value})"] += 1
            return
        self.counts["DeleteOptions read"] += 1
        if seen is not None and _sees(seen):
            ours = {k: v for k, v in options.items() if k not in ("kind", "apiVersion")}
            theirs = seen["options"]
            if ours != theirs:
                self.fail(
                    case, DELETE, body, f"DeleteOptions: gatekeeper {ours}, apiserver {theirs}"
                )
        unknown = go["u"]
        if _sees(unknown):
            expected = (
                _text(unknown, "kind").decode(errors="replace") or "DeleteOptions",
                _text(unknown, "apiVersion").decode(errors="replace") or "meta.k8s.io/v1",
            )
            if (options["kind"], options["apiVersion"]) != expected:
                self.fail(
                    case, DELETE, body, f"typeMeta: gatekeeper {options}, apiserver {expected}"
                )

    def pinned(self, decoded: list[dict[str, Any]]) -> None:
        """Check what Go saw in the pinned bodies (in the order of :attr:`pins`)."""
        assert len(decoded) == len(self.pins)
        for pin, go in zip(self.pins, decoded, strict=True):
            for problem in _pin_differences(pin, go):
                self.fail(
                    pin.case, pin.target, pin.body, f"pinned to {pin.resource_version!r}: {problem}"
                )
        self.counts["pins checked"] += len(self.pins)
        self.pins = []


def _envelope_of(target: str) -> tuple[str, str]:
    api_version, _, kind = target.rpartition("/")
    return api_version, kind


def _object_differences(envelope: Envelope, target: str, go: dict[str, Any]) -> Iterator[str]:
    """Where Go saw a value the gatekeeper's reader read otherwise."""
    ours = {
        "apiVersion": envelope.api_version.encode(),
        "kind": envelope.kind.encode(),
        "name": envelope.name.encode(),
        "namespace": envelope.namespace.encode(),
        "resourceVersion": envelope.resource_version.encode(),
    }
    views = {"u": ("apiVersion", "kind"), "m": _VALUES[2:]}
    if _envelope_of(target) == (envelope.api_version, envelope.kind):
        views["c"] = _VALUES  # the gatekeeper refuses an envelope that is not the URL's
    for name, keys in views.items():
        view = go.get(name)
        if not _sees(view):
            continue
        assert view is not None
        for key in keys:
            if _text(view, key) != ours[key]:
                yield f"{name}.{key}: gatekeeper {ours[key]!r}, apiserver {_text(view, key)!r}"


def _pin_differences(pin: Pinned, go: dict[str, Any]) -> Iterator[str]:
    try:
        again = read_envelope(pin.body)
    except ProtobufError as exc:
        yield f"the gatekeeper cannot read its own pinned body: {exc}"
        return
    if again.resource_version != pin.resource_version:
        yield f"the gatekeeper reads {again.resource_version!r} back"
    codec, before = go.get("c"), pin.original.get("c")
    if _sees(before) and not _sees(codec):
        yield f"the apiserver decoded the body, but not the pinned one: {codec}"
    expected = {
        "resourceVersion": pin.resource_version.encode(),
        "name": pin.envelope.name.encode(),
        "namespace": pin.envelope.namespace.encode(),
    }
    for name in ("c", "m"):
        view = go.get(name)
        if not _sees(view):
            continue
        assert view is not None
        for key, value in expected.items():
            if _text(view, key) != value:
                yield f"{name}.{key}: apiserver reads {_text(view, key)!r}, not {value!r}"
    if _sees(before) and _sees(codec):
        assert before is not None and codec is not None
        if before["rest"] != codec["rest"]:
            yield "the pin changed more of the object than its resourceVersion"
