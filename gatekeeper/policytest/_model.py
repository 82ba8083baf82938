"""Policy test files (DESIGN §4.8): found, loaded and checked, every fault naming its line.

Their shape is the schema's (``policytest.schema.json``, read by ``gatekeeper.policyfile``);
what a schema cannot say (unique case names, a token's driver, regexes, the policy) is checked
here.

A file names a policy (relative to the file, or ``packaged:<name>``), a node, optionally its
labels and the drivers allowed on it (as ``serve --node-label``/``--driver``), and cases. Each
case is one request of one driver, the objects already stored, and what must happen. See
docs/policy-tests.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gatekeeper.errors import ConfigError
from gatekeeper.policy import Policy
from gatekeeper.policy.draft import KeyPath, render_path
from gatekeeper.policyfile import (
    PACKAGED,
    POLICY_TEST,
    YamlError,
    first_fault,
    line_at,
    load_policy,
    load_yaml,
    plain,
)

__all__ = [
    "TEST_FILE_SUFFIX",
    "Expectation",
    "ForwardedSpec",
    "MalformedTest",
    "RequestSpec",
    "TestCase",
    "TestFile",
    "TokenSpec",
    "discover",
    "load_test_file",
]

TEST_FILE_SUFFIX = "_test.yaml"


class MalformedTest(Exception):
    """A test file (or the policy it names) that cannot be run: the command exits 2."""

    def __init__(
        self, path: str, line: int, message: str, *, case: str = "", key: str = ""
    ) -> None:
        where = f"{path}:{line}" if line else path
        what = " ".join(part for part in (f'case "{case}"' if case else "", key) if part)
        super().__init__(f"{where}: {what + ': ' if what else ''}{message}")
        self.path = path
        self.line = line
        self.case = case
        self.key = key
        self.reason = message


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the driver sends: the request target is sent byte for byte, never normalized."""

    method: str
    target: str
    """Path plus ``?query`` exactly as written (a ``query`` mapping percent-encoded)."""
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class ForwardedSpec:
    """What the upstream must have received; only the keys given are compared.

    ``query`` and ``headers`` compare the names given (headers case-insensitively); ``body``
    compares mappings by their given keys (recursively) and lists item by item.
    """

    method: str | None = None
    path: str | None = None
    query: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    body: Any = None
    has_body: bool = False


@dataclass(frozen=True, slots=True)
class Expectation:
    allowed: bool
    """The gatekeeper's decision (the audit annotation ``authorization.k8s.io/decision``)."""
    code: int | None = None
    """The HTTP status the driver got."""
    reason: re.Pattern[str] | None = None
    """Searched in the gatekeeper's reason, or else in the Status message the driver got."""
    message: re.Pattern[str] | None = None
    """Searched in the Status message the driver got."""
    forwarded: ForwardedSpec | None = None
    check_forwarded: bool = False
    """True when ``forwarded`` was given; ``forwarded: null`` means nothing was forwarded."""
    validation: str | None = None
    """The name of the policy's CEL validation that refused (``scope``, ``variables.<name>``
    for an expression that failed to evaluate)."""


@dataclass(frozen=True, slots=True)
class TokenSpec:
    """A case sent with a ServiceAccount's token to the token listener (``token:``): the
    account and the pod it is bound to are stored unless ``existing`` has them."""

    namespace: str
    name: str
    pod: str = ""
    """The pod the token is bound to ("" : a token bound to no pod)."""
    node: str = ""
    """The pod's node (default: the file's node)."""

    @property
    def user(self) -> str:
        """The username the apiserver gives the account's tokens."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"


@dataclass(frozen=True, slots=True)
class TestCase:
    __test__: ClassVar[bool] = False  # not a pytest class

    name: str
    line: int
    driver: str
    """The driver: the socket the request is sent on, or (with ``token``) the driver the
    policy maps the ServiceAccount to."""
    request: RequestSpec
    existing: tuple[tuple[dict[str, Any], int], ...]
    """Objects stored before the request, each with its line."""
    expect: Expectation
    token: TokenSpec | None = None


@dataclass(frozen=True, slots=True)
class TestFile:
    __test__: ClassVar[bool] = False  # not a pytest class

    path: str
    policy_path: str
    policy: Policy
    """The loaded policy, with the file's ``drivers`` added."""
    node: str
    node_labels: Mapping[str, str]
    cases: tuple[TestCase, ...]


def discover(paths: Iterable[str]) -> list[str]:
    """Every ``*_test.yaml`` under ``paths`` (a file is taken as given), sorted, no duplicates."""
    found: list[str] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found.extend(
                str(p) for p in sorted(path.rglob(f"*{TEST_FILE_SUFFIX}")) if ".venv" not in p.parts
            )
        elif path.exists():
            found.append(str(path))
        else:
            raise MalformedTest(given, 0, "no such file or directory")
    return list(dict.fromkeys(found))


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _escape(text: str) -> str:
    """Percent-encode all but RFC 3986 unreserved bytes, as client-go encodes query values.

    (The driver's side of the wire: what the gatekeeper forwards is RequestInfo's own form.)
    """
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode())


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _texts(values: Mapping[str, Any] | None) -> dict[str, str] | None:
    return None if values is None else {name: _text(value) for name, value in values.items()}


class _File:
    """A test file being read (valid by the schema): each fault names its line, case and key."""

    def __init__(self, path: str, doc: Any) -> None:
        self.path = path
        self.doc = doc

    def fault(self, at: KeyPath, message: str) -> MalformedTest:
        case, key = "", render_path(at)
        if len(at) > 2 and at[0] == "cases" and isinstance(at[1], int):
            entry = self.doc["cases"][at[1]]
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str):  # named: the key is the case's own
                case, key = name, render_path(at[2:])
        return MalformedTest(self.path, line_at(self.doc, at), message, case=case, key=key)


def load_test_file(path: str) -> TestFile:
    """Load and check ``path``, and the policy it names; MalformedTest on any fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MalformedTest(path, 0, f"cannot read: {exc}") from exc
    try:
        doc = load_yaml(text)
    except YamlError as exc:
        raise MalformedTest(path, exc.line, exc.message) from exc
    file = _File(path, doc)
    if isinstance(doc, dict) and doc.get("kind") == "Policy":
        # Given a policy where a test file was expected (``test policies/default.yaml``).
        raise file.fault(
            ("kind",),
            "this is a policy (kind: Policy), not a test file: a test file names it with "
            "`policy: <file>` and lists `cases` (docs/policy-tests.md; e.g. "
            "policies/default_test.yaml)",
        )
    fault = first_fault(POLICY_TEST, doc)
    if fault is not None:
        raise file.fault(fault.path, fault.message)
    policy = _policy(file, doc["policy"]).with_drivers(frozenset(doc.get("drivers", ())))
    cases: list[TestCase] = []
    names: set[str] = set()
    for index, raw in enumerate(doc["cases"]):
        case = _case(file, index, raw, policy)
        if case.name in names:
            raise file.fault(("cases", index, "name"), "is used by another case of this file")
        names.add(case.name)
        cases.append(case)
    labels = _texts(doc.get("nodeLabels", {})) or {}
    return TestFile(path, policy.source, policy, doc["node"], labels, tuple(cases))


def _policy(file: _File, named: str) -> Policy:
    # A packaged policy (packaged:default) is tested where it ships, not copied beside its tests.
    target = named if named.startswith(PACKAGED) else str(Path(file.path).parent / named)
    try:
        return load_policy(target)
    except ConfigError as exc:
        raise file.fault(("policy",), str(exc)) from exc


def _case(file: _File, index: int, raw: Mapping[str, Any], policy: Policy) -> TestCase:
    at: KeyPath = ("cases", index)
    token = _token(raw["token"]) if "token" in raw else None
    mapped = policy.service_accounts.get(token.user, "") if token is not None else ""
    driver = raw.get("driver", mapped)
    if token is not None and "driver" in raw and driver != mapped:
        raise file.fault(
            (*at, "driver"),
            f'is "{driver}", but the policy maps {token.namespace}/{token.name} to '
            f'"{mapped or "no driver"}": leave driver out of a token case, or name that one',
        )
    existing = tuple(
        (plain(obj), line_at(file.doc, (*at, "existing", position)))
        for position, obj in enumerate(raw.get("existing", ()))
    )
    return TestCase(
        name=raw["name"],
        line=line_at(file.doc, at),
        driver=driver,
        request=_request(raw["request"]),
        existing=existing,
        expect=_expectation(file, (*at, "expect"), raw["expect"]),
        token=token,
    )


def _token(raw: Mapping[str, Any]) -> TokenSpec:
    namespace, _, name = raw["serviceAccount"].partition("/")
    return TokenSpec(namespace, name, raw.get("pod", ""), raw.get("node", ""))


def _request(raw: Mapping[str, Any]) -> RequestSpec:
    method, target = raw["method"], raw["path"]
    query = raw.get("query")
    if isinstance(query, dict):
        encoded = "&".join(f"{_escape(k)}={_escape(_text(v))}" for k, v in query.items())
    else:
        encoded = query or ""
    if encoded:
        target += ("&" if "?" in target else "?") + encoded
    headers = _texts(raw.get("headers", {})) or {}
    body: bytes | None = None
    if raw.get("body") is not None:
        value = raw["body"]
        body = value.encode() if isinstance(value, str) else json.dumps(plain(value)).encode()
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
            if method == "PATCH" and isinstance(value, dict):
                headers["Content-Type"] = "application/merge-patch+json"
            elif method == "PATCH" and isinstance(value, list):
                headers["Content-Type"] = "application/json-patch+json"
    return RequestSpec(method, target, tuple(headers.items()), body)


def _pattern(
    file: _File, at: KeyPath, expect: Mapping[str, Any], key: str
) -> re.Pattern[str] | None:
    if key not in expect:
        return None
    try:
        return re.compile(expect[key])
    except re.error as exc:
        raise file.fault((*at, key), f"not a regex: {exc}") from exc


def _expectation(file: _File, at: KeyPath, expect: Mapping[str, Any]) -> Expectation:
    forwarded = expect.get("forwarded")
    return Expectation(
        allowed=expect["allowed"],
        code=expect.get("code"),
        reason=_pattern(file, at, expect, "reason"),
        message=_pattern(file, at, expect, "message"),
        forwarded=None if forwarded is None else _forwarded(forwarded),
        check_forwarded="forwarded" in expect,
        validation=expect.get("validation"),
    )


def _forwarded(spec: Mapping[str, Any]) -> ForwardedSpec:
    return ForwardedSpec(
        method=spec.get("method"),
        path=spec.get("path"),
        query=_texts(spec.get("query")),
        headers=_texts(spec.get("headers")),
        body=plain(spec.get("body")),
        has_body="body" in spec,
    )
