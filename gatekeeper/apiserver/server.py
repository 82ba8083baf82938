"""The embedded API server: an in-memory kube-apiserver stand-in speaking HTTP(S) on loopback.

Generic over a list of :class:`ServedKind`; faithful to recordings of a real kube-apiserver
1.36 (``tests/recordings`` in the repository). Deliberate differences are documented in the
modules that implement them (``_objects``, ``_patch``, ``_watch``, ``_render``, ``_negotiate``,
``_discovery``); the notable ones: no authorization (a valid token or client certificate
may do anything), no anonymous access (401, where the apiserver would answer 403), JSON
only, simplified managedFields (``_managed``), little per-kind validation (``_typed``), no
defaulting, no version conversion.
"""

from __future__ import annotations

import contextlib
import copy
import hmac
import ipaddress
import json
import re
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

import gatekeeper.apiserver._discovery as disc
from gatekeeper.apiserver._errors import APIError, bad_request, path_not_found
from gatekeeper.apiserver._handlers import Call, handle_resource, json_response, method_not_allowed
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._negotiate import negotiate_discovery, not_acceptable, parse_accept
from gatekeeper.apiserver._objects import check_type_meta, metadata_of, prepare_create
from gatekeeper.apiserver._routing import resolve_resource_path
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._tokens import SERVICE_ACCOUNTS, TokenAuthority
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import Store, object_key

__all__ = ["APIServer", "JournalEntry", "running_api_server"]

_MAX_BODY = 3 * 1024 * 1024  # the apiserver's request size limit
_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_TOKEN_REQUEST = re.compile(r"/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)/token")
_SERVER_KEY: web.AppKey[APIServer] = web.AppKey("gatekeeper.testing.server")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One request as it arrived (before authentication): raw path and query, headers
    (``Authorization`` included, as received), body."""

    method: str
    path: str
    query_string: str
    headers: Mapping[str, str]
    body: bytes


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class APIServer:
    """In-memory API server for ``kinds``; ``token`` (if set) is the bearer token required.

    With TLS and ``client_ca_file``, a client certificate verified against that CA also
    authenticates. ``rv_wait_seconds`` is how long a list at a future resourceVersion waits
    before 504 (the apiserver: 3 s); ``bookmark_interval`` spaces watch bookmarks;
    ``journal`` keeps the last ``journal_limit`` requests.
    """

    def __init__(
        self,
        kinds: Iterable[ServedKind],
        *,
        token: str | None = None,
        client_ca_file: str | None = None,
    ) -> None:
        self.kinds: tuple[ServedKind, ...] = tuple(kinds)
        self._by_resource: dict[tuple[str, str], ServedKind] = {}
        for kind in self.kinds:
            key = (kind.group, kind.resource)
            if key in self._by_resource:
                raise ValueError(f"{kind.resource}.{kind.group}: served twice")
            self._by_resource[key] = kind
        if token is not None and not token:
            raise ValueError("token must be a non-empty string or None")
        self.token = token
        self.client_ca_file = client_ca_file
        self.store = Store(self._by_resource)
        self.journal: list[JournalEntry] = []
        self.journal_limit = 100_000
        self.rv_wait_seconds = 3.0
        self.bookmark_interval = 1.0
        self.url = ""
        self.app = web.Application(
            middlewares=[self._journal_middleware, self._auth_middleware, self._error_middleware],
            client_max_size=_MAX_BODY,
        )
        self.app[_SERVER_KEY] = self
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self.app.on_response_prepare.append(_add_apiserver_headers)
        self._runner: web.AppRunner | None = None
        self.tokens = TokenAuthority(lambda: self.store)
        """Service-account tokens: TokenRequest (when ServiceAccounts and Pods are served,
        :data:`~gatekeeper.apiserver._tokens.TOKEN_KINDS`) and TokenReview."""

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl_context: ssl.SSLContext | None = None
    ) -> str:
        """Listen on loopback; returns the base URL. ``client_ca_file`` needs ``ssl_context``
        (whose verify locations and mode it then extends: CA loaded, ``CERT_OPTIONAL``)."""
        if not _is_loopback(host):
            raise ValueError(f"the embedded API server listens on loopback only, not {host!r}")
        if self._runner is not None:
            raise RuntimeError("already started")
        if self.client_ca_file is not None:
            if ssl_context is None:
                raise ValueError("client_ca_file needs TLS: pass ssl_context to start()")
            ssl_context.load_verify_locations(cafile=self.client_ca_file)
            if ssl_context.verify_mode == ssl.CERT_NONE:
                ssl_context.verify_mode = ssl.CERT_OPTIONAL
        runner = web.AppRunner(
            self.app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        self._runner = runner
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"{'https' if ssl_context else 'http'}://{shown}:{bound[1]}"
        return self.url

    async def close(self) -> None:
        """End every watch, then stop listening (idempotent)."""
        self.store.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # --- direct access -----------------------------------------------------------------------

    def _kind_of(self, obj: KubeObject) -> ServedKind:
        api_version, kind_name = str(obj.get("apiVersion", "")), obj.get("kind")
        group, _, version = api_version.rpartition("/")
        for kind in self.kinds:
            if kind.group == group and kind.kind == kind_name and version in kind.versions:
                return kind
        raise ValueError(f"{kind_name} {api_version!r} is not a served kind")

    def add(self, obj: KubeObject) -> KubeObject:
        """Seed ``obj`` directly (no HTTP); returns the stored copy.

        A resourceVersion is assigned (one in ``obj`` is ignored); uid, creationTimestamp and
        generation are assigned unless ``obj`` has them; ``.status`` is kept; the namespace
        comes from the metadata (``default`` if absent for a namespaced kind). Watchers see
        an ``ADDED`` event. ValueError if the kind is not served or the object exists.
        """
        kind = self._kind_of(obj)
        version = str(obj["apiVersion"]).rpartition("/")[2]
        check_type_meta(obj, kind, version)
        meta = metadata_of(obj)
        namespace = str(meta.get("namespace") or "default") if kind.namespaced else ""
        prepared = prepare_create(kind, version, namespace, obj, reset_status=False, seeding=True)
        key = (kind.group, kind.resource)
        if self.store.get(key, object_key(prepared)) is not None:
            raise ValueError(f"{kind.resource} {object_key(prepared)} already exists")
        return _copy(self.store.create(key, prepared))

    def get(self, group: str, resource: str, name: str, namespace: str = "") -> KubeObject | None:
        """A copy of the stored object, or None."""
        stored = self.store.get((group, resource), (namespace, name))
        return None if stored is None else _copy(stored)

    def objects(self, group: str, resource: str) -> list[KubeObject]:
        """Copies of every stored object of ``group``/``resource`` in key order."""
        return [_copy(obj) for obj in self.store.items((group, resource))]

    def compact(self) -> None:
        """Forget history up to now: older resourceVersions become too old (410)."""
        self.store.compact()

    def reset(self) -> None:
        """Start again from an empty store: every object and all history forgotten, the
        resourceVersion counter back at 0, open watches ended."""
        self.store.close()
        self.store = Store(self._by_resource)

    # --- middlewares -------------------------------------------------------------------------

    @web.middleware
    async def _journal_middleware(
        self, request: web.Request, handler: _Handler
    ) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._record(request, b"")
            return json_response(
                status_body(413, "Request entity too large: limit is 3145728"), 413
            )
        self._record(request, body)
        return await handler(request)

    def _record(self, request: web.Request, body: bytes) -> None:
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.journal.append(
            JournalEntry(
                request.method,
                request.rel_url.raw_path,
                request.rel_url.raw_query_string,
                headers,
                body,
            )
        )
        if len(self.journal) > self.journal_limit:  # bounded for long-running demos
            del self.journal[: len(self.journal) - self.journal_limit]

    def _authenticated(self, request: web.Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("Authorization", "")
        if hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode()):
            return True
        scheme, _, bearer = header.partition(" ")
        if scheme == "Bearer" and self.tokens.user_of(bearer) is not None:
            # A service-account token it issued (a driver's own credentials): authenticated,
            # as by the apiserver's service-account authenticator. Nothing is authorized here.
            return True
        if self.client_ca_file is not None and request.transport is not None:
            # The TLS layer only reports a peer certificate it verified against the CA.
            return bool(request.transport.get_extra_info("peercert"))
        return False

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if not self._authenticated(request):
            return json_response(status_body(401, "Unauthorized"), 401)
        return await handler(request)

    @web.middleware
    async def _error_middleware(
        self, request: web.Request, handler: _Handler
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as exc:
            return json_response(exc.body, exc.code, exc.headers)

    # --- routing -----------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        tokens = await self._token_call(request)
        if tokens is not None:
            return tokens
        parts = request.path.split("/")[1:]
        if parts == [""]:
            return _get_only(
                request,
                {"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version"]},
            )
        if parts[-1] == "" and _is_discovery(parts[:-1]):
            # The apiserver serves discovery with a trailing slash too (/apis/<group>/, /version/:
            # the official Python client asks for these).
            parts = parts[:-1]
        if parts[0] == "api" and len(parts) > 2 and parts[1] == "v1":
            return await self._resource(request, "", "v1", parts[2:])
        if parts[0] == "apis" and len(parts) > 3:
            return await self._resource(request, parts[1], parts[2], parts[3:])
        return self._discovery(request, parts)

    async def _resource(
        self, request: web.Request, group: str, version: str, segments: list[str]
    ) -> web.StreamResponse:
        target = resolve_resource_path(group, version, segments, self._by_resource)
        call = Call(
            request,
            self.store,
            target,
            await request.read(),
            self.rv_wait_seconds,
            self.bookmark_interval,
        )
        return await handle_resource(call)

    async def _token_call(self, request: web.Request) -> web.StreamResponse | None:
        """TokenReview, and TokenRequest where service accounts are served; None otherwise."""
        path = request.path
        if path == _TOKEN_REVIEWS:
            answer = self.tokens.token_review
        elif (match := _TOKEN_REQUEST.fullmatch(path)) and self.store.serves(
            (SERVICE_ACCOUNTS.group, SERVICE_ACCOUNTS.resource)
        ):
            namespace, name = match.groups()

            def answer(body: Any) -> KubeObject:
                return self.tokens.token_request(namespace, name, body)
        else:
            return None
        if request.method != "POST":
            raise method_not_allowed()
        try:
            body = json.loads(await request.read() or b"null")
        except ValueError as exc:
            raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
        return json_response(answer(body), 201)

    def _discovery(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        kinds = self.kinds
        doc: Any = None
        if parts == ["version"]:
            doc = disc.VERSION_INFO
        elif parts in (["healthz"], ["livez"], ["readyz"]):
            if request.method != "GET":
                raise method_not_allowed()
            return web.Response(text="ok", content_type="text/plain")
        elif parts in (["api"], ["apis"]):
            aggregated = negotiate_discovery(accept)
            if aggregated is not None:
                return _aggregated(request, kinds, core=parts == ["api"], version=aggregated)
            doc = (
                disc.api_versions(request.host) if parts == ["api"] else disc.api_group_list(kinds)
            )
        elif parts == ["api", "v1"]:
            doc = disc.api_resource_list(kinds, "", "v1")
        elif parts[0] == "apis" and len(parts) == 2:
            doc = disc.api_group(kinds, parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            doc = disc.api_resource_list(kinds, parts[1], parts[2])
        elif parts[0] == "openapi":
            doc = _openapi(kinds, parts[1:], accept)
        if doc is None:
            raise path_not_found()
        return _get_only(request, doc)


def _is_discovery(parts: list[str]) -> bool:
    """version, api[/<v>], apis[/<g>[/<v>]]."""
    head = parts[:1]
    return parts == ["version"] or (
        (head == ["api"] and len(parts) <= 2) or (head == ["apis"] and len(parts) <= 3)
    )


def _openapi(kinds: tuple[ServedKind, ...], parts: list[str], accept: str) -> Any:
    if accept.strip() and not any(m.accepts_json for m in parse_accept(accept)):
        raise not_acceptable()  # e.g. kubectl asking /openapi/v2 for protobuf only
    if parts == ["v2"]:
        return disc.openapi_v2(kinds)
    if parts == ["v3"]:
        return disc.openapi_v3_index(kinds)
    if len(parts) == 4 and parts[:2] == ["v3", "apis"]:
        return disc.openapi_v3_document(kinds, parts[2], parts[3])
    if parts == ["v3", "api", "v1"]:
        return disc.openapi_v3_document(kinds, "", "v1")
    return None


def _get_only(request: web.Request, doc: Any) -> web.Response:
    if request.method not in ("GET", "HEAD"):
        raise method_not_allowed()
    return json_response(doc)


def _aggregated(
    request: web.Request, kinds: tuple[ServedKind, ...], *, core: bool, version: str
) -> web.Response:
    if request.method != "GET":
        raise method_not_allowed()
    response = json_response(disc.aggregated_discovery(kinds, core=core, version=version))
    response.content_type = "application/json"
    response.headers["Content-Type"] = (
        f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
    )
    response.headers["Cache-Control"] = "public"
    response.headers["Vary"] = "Accept"
    return response


async def _add_apiserver_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response carries an ``Audit-Id`` and, unless set, the apiserver's Cache-Control."""
    response.headers["Audit-Id"] = str(uuid.uuid4())
    response.headers.setdefault("Cache-Control", "no-cache, private")


def _copy(obj: KubeObject) -> KubeObject:
    return copy.deepcopy(obj)


@contextlib.asynccontextmanager
async def running_api_server(
    kinds: Iterable[ServedKind],
    *,
    token: str | None = None,
    client_ca_file: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    objects: Iterable[KubeObject] = (),
) -> AsyncIterator[APIServer]:
    """``async with running_api_server(kinds) as server:`` — started, seeded, closed after."""
    server = APIServer(kinds, token=token, client_ca_file=client_ca_file)
    for obj in objects:
        server.add(obj)
    await server.start(host, port, ssl_context=ssl_context)
    try:
        yield server
    finally:
        await server.close()
