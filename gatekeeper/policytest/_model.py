"""Policy test files (DESIGN §4.8): found, loaded and checked, every fault naming its line.

A file names a policy (relative to the file, or ``packaged:<name>``), a node, optionally its
labels and the drivers allowed on it (as ``serve --node-label``/``--driver``), and cases. Each
case is one request of one driver, the objects already stored, and what must happen. See README
"Policy tests in CI".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gatekeeper.errors import ConfigError
from gatekeeper.names import is_dns_subdomain, is_driver_name
from gatekeeper.policy import Policy, load_policy
from gatekeeper.policy.loader import PACKAGED
from gatekeeper.policytest._yaml import LineDict, LineList, YamlError, load_yaml, plain

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
_FILE_KEYS = {"policy", "node", "nodeLabels", "drivers", "cases"}
_CASE_KEYS = {"name", "driver", "token", "request", "existing", "expect"}
_TOKEN_KEYS = {"serviceAccount", "pod", "node"}
_REQUEST_KEYS = {"method", "path", "query", "headers", "body"}
_EXPECT_KEYS = {"allowed", "code", "reason", "message", "validation", "forwarded"}
_FORWARDED_KEYS = {"method", "path", "query", "headers", "body"}
_METHOD = re.compile(r"^[A-Z]+$")


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


class _Checker:
    """Type checks naming the file, case, key and line of each fault."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.case = ""

    def fail(self, line: int, key: str, message: str) -> MalformedTest:
        return MalformedTest(self.path, line, message, case=self.case, key=key)

    def mapping(self, value: Any, key: str, line: int, allowed: set[str]) -> LineDict:
        if not isinstance(value, LineDict):
            raise self.fail(line, key, "must be a mapping")
        for name in value:
            if key == "" and isinstance(name, str) and name.startswith("x-"):
                continue  # extension keys: a place for YAML anchors, ignored
            if name not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.fail(
                    value.key_line(name),
                    f"{key}.{name}".lstrip("."),
                    f"unknown key (known: {known})",
                )
        return value

    def string(self, parent: LineDict, key: str, where: str, *, required: bool = True) -> str:
        value = parent.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or not value:
            raise self.fail(parent.key_line(key), where, "must be a non-empty string")
        return value

    def string_map(self, value: Any, where: str, line: int) -> dict[str, str]:
        if not isinstance(value, LineDict):
            raise self.fail(line, where, "must be a mapping of names to values")
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or isinstance(item, dict | list) or item is None:
                raise self.fail(value.key_line(name), f"{where}.{name}", "must be a plain value")
            out[name] = _text(item)
        return out


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


def _pattern(checker: _Checker, expect: LineDict, key: str) -> re.Pattern[str] | None:
    if key not in expect:
        return None
    value = checker.string(expect, key, f"expect.{key}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise checker.fail(expect.key_line(key), f"expect.{key}", f"not a regex: {exc}") from exc


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
    check = _Checker(path)
    if isinstance(doc, LineDict) and doc.get("kind") == "Policy":
        # Given a policy where a test file was expected (``test policies/default.yaml``).
        raise check.fail(
            doc.key_line("kind"),
            "kind",
            "this is a policy (kind: Policy), not a test file: a test file names it with "
            "`policy: <file>` and lists `cases` (README, Policy tests; e.g. "
            "policies/default_test.yaml)",
        )
    top = check.mapping(doc, "", 1, _FILE_KEYS)
    for key in ("policy", "node", "cases"):
        if key not in top:
            raise check.fail(top.line or 1, key, "is required")
    node = check.string(top, "node", "node")
    if not is_dns_subdomain(node):
        raise check.fail(top.key_line("node"), "node", f'"{node}" is not a valid node name')
    labels = check.string_map(
        top.get("nodeLabels", LineDict()), "nodeLabels", top.key_line("nodeLabels")
    )
    drivers = _drivers(check, top)
    policy = _policy(check, top, path).with_drivers(frozenset(drivers))
    cases = top["cases"]
    if not isinstance(cases, LineList) or not cases:
        raise check.fail(top.key_line("cases"), "cases", "must be a non-empty list")
    loaded: list[TestCase] = []
    names: set[str] = set()
    for raw, line in zip(cases, cases.item_lines, strict=True):
        case = _case(check, raw, line, policy)
        if case.name in names:
            raise check.fail(line, "name", "is used by another case of this file")
        names.add(case.name)
        loaded.append(case)
    return TestFile(path, policy.source, policy, node, labels, tuple(loaded))


def _drivers(check: _Checker, top: LineDict) -> list[str]:
    raw = top.get("drivers", [])
    line = top.key_line("drivers")
    if not isinstance(raw, list) or not all(isinstance(d, str) and d for d in raw):
        raise check.fail(line, "drivers", "must be a list of driver names")
    for driver in raw:
        if not is_driver_name(driver):
            raise check.fail(line, "drivers", f'"{driver}" is not a valid driver name')
    return list(raw)


def _policy(check: _Checker, top: LineDict, path: str) -> Policy:
    relative = check.string(top, "policy", "policy")
    # A packaged policy (packaged:default) is tested where it ships, not copied beside its tests.
    target = relative if relative.startswith(PACKAGED) else str(Path(path).parent / relative)
    try:
        return load_policy(target)
    except ConfigError as exc:
        raise check.fail(top.key_line("policy"), "policy", str(exc)) from exc


def _case(check: _Checker, raw: Any, line: int, policy: Policy) -> TestCase:
    check.case = raw.get("name", "") if isinstance(raw, dict) else ""
    case = check.mapping(raw, "", line, _CASE_KEYS)
    for key in ("name", "request", "expect"):
        if key not in case:
            raise check.fail(case.line, key, "is required")
    if "driver" not in case and "token" not in case:
        raise check.fail(case.line, "driver", "is required (or a token: {serviceAccount: ...})")
    name = check.string(case, "name", "name")
    token = _token(check, case["token"], case.key_line("token")) if "token" in case else None
    mapped = policy.service_accounts.get(token.user, "") if token is not None else ""
    driver = check.string(case, "driver", "driver") if "driver" in case else mapped
    if token is not None and "driver" in case and driver != mapped:
        raise check.fail(
            case.key_line("driver"),
            "driver",
            f'is "{driver}", but the policy maps {token.namespace}/{token.name} to '
            f'"{mapped or "no driver"}": leave driver out of a token case, or name that one',
        )
    if driver and not is_driver_name(driver):
        raise check.fail(case.key_line("driver"), "driver", f'"{driver}" is not a driver name')
    request = _request(check, case["request"], case.key_line("request"))
    existing = _existing(check, case.get("existing", []), case.key_line("existing"))
    expect = _expectation(check, case["expect"], case.key_line("expect"))
    return TestCase(name, case.line, driver, request, existing, expect, token)


def _token(check: _Checker, raw: Any, line: int) -> TokenSpec:
    spec = check.mapping(raw, "token", line, _TOKEN_KEYS)
    account = check.string(spec, "serviceAccount", "token.serviceAccount")
    namespace, _, name = account.partition("/")
    if not is_dns_subdomain(namespace) or not is_dns_subdomain(name):
        raise check.fail(
            spec.key_line("serviceAccount"),
            "token.serviceAccount",
            f'"{account}" is not namespace/name',
        )
    pod = check.string(spec, "pod", "token.pod", required=False)
    node = check.string(spec, "node", "token.node", required=False)
    if node and not pod:
        raise check.fail(
            spec.key_line("node"), "token.node", "is the node of token.pod: name the pod"
        )
    return TokenSpec(namespace, name, pod, node)


def _request(check: _Checker, raw: Any, line: int) -> RequestSpec:
    request = check.mapping(raw, "request", line, _REQUEST_KEYS)
    method = check.string(request, "method", "request.method")
    if not _METHOD.match(method):
        raise check.fail(request.key_line("method"), "request.method", "must be upper case")
    path = check.string(request, "path", "request.path")
    if not path.startswith("/"):
        raise check.fail(request.key_line("path"), "request.path", 'must start with "/"')
    target = path
    query = request.get("query")
    if isinstance(query, str):
        encoded = query
    elif query is not None:
        pairs = check.string_map(query, "request.query", request.key_line("query"))
        encoded = "&".join(f"{_escape(k)}={_escape(v)}" for k, v in pairs.items())
    else:
        encoded = ""
    if encoded:
        target += ("&" if "?" in path else "?") + encoded
    headers = check.string_map(
        request.get("headers", LineDict()), "request.headers", request.key_line("headers")
    )
    body: bytes | None = None
    if request.get("body") is not None:
        value = request["body"]
        body = value.encode() if isinstance(value, str) else json.dumps(plain(value)).encode()
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
            if method == "PATCH" and isinstance(value, dict):
                headers["Content-Type"] = "application/merge-patch+json"
            elif method == "PATCH" and isinstance(value, list):
                headers["Content-Type"] = "application/json-patch+json"
    return RequestSpec(method, target, tuple(headers.items()), body)


def _existing(check: _Checker, raw: Any, line: int) -> tuple[tuple[dict[str, Any], int], ...]:
    if not isinstance(raw, list):
        raise check.fail(line, "existing", "must be a list of objects")
    lines = raw.item_lines if isinstance(raw, LineList) else [line] * len(raw)
    out = []
    for obj, item_line in zip(raw, lines, strict=True):
        if not isinstance(obj, dict):
            raise check.fail(item_line, "existing", "each entry must be an object")
        for key in ("apiVersion", "kind"):
            if not isinstance(obj.get(key), str):
                raise check.fail(item_line, f"existing.{key}", "is required")
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise check.fail(item_line, "existing.metadata.name", "is required")
        out.append((plain(obj), item_line))
    return tuple(out)


def _expectation(check: _Checker, raw: Any, line: int) -> Expectation:
    expect = check.mapping(raw, "expect", line, _EXPECT_KEYS)
    allowed = expect.get("allowed")
    if not isinstance(allowed, bool):
        raise check.fail(expect.key_line("allowed"), "expect.allowed", "must be true or false")
    code = expect.get("code")
    if code is not None and (
        not isinstance(code, int) or isinstance(code, bool) or not 100 <= code <= 599
    ):
        raise check.fail(expect.key_line("code"), "expect.code", "must be an HTTP status code")
    forwarded = None
    if expect.get("forwarded") is not None:
        forwarded = _forwarded(check, expect["forwarded"], expect.key_line("forwarded"))
    return Expectation(
        allowed=allowed,
        code=code,
        reason=_pattern(check, expect, "reason"),
        message=_pattern(check, expect, "message"),
        forwarded=forwarded,
        check_forwarded="forwarded" in expect,
        validation=check.string(expect, "validation", "expect.validation", required=False) or None,
    )


def _forwarded(check: _Checker, raw: Any, line: int) -> ForwardedSpec:
    spec = check.mapping(raw, "expect.forwarded", line, _FORWARDED_KEYS)
    method = check.string(spec, "method", "expect.forwarded.method", required=False) or None
    path = check.string(spec, "path", "expect.forwarded.path", required=False) or None
    query = headers = None
    if "query" in spec:
        query = check.string_map(spec["query"], "expect.forwarded.query", spec.key_line("query"))
    if "headers" in spec:
        headers = check.string_map(
            spec["headers"], "expect.forwarded.headers", spec.key_line("headers")
        )
    return ForwardedSpec(method, path, query, headers, plain(spec.get("body")), "body" in spec)
