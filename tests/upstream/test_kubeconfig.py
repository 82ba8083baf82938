"""Tests for gatekeeper.upstream.kubeconfig: loading upstream credentials, TLS, token rotation."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gatekeeper.cli.certs import (
    IssuedCert,
    create_ca,
    issue_client_cert,
    issue_server_cert,
    write_pem,
)
from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.listen.identity import client_cert_common_name
from gatekeeper.upstream import kubeconfig
from gatekeeper.upstream.kubeconfig import (
    TokenSource,
    UpstreamConfig,
    build_ssl_context,
    load_in_cluster,
    load_kubeconfig,
    resolve_upstream,
)
from gatekeeper.upstream.session import UpstreamSession


@pytest.fixture(scope="module")
def pki() -> dict[str, IssuedCert]:
    ca = create_ca()
    return {
        "ca": ca,
        "server": issue_server_cert(ca),
        "named": issue_server_cert(ca, ["upstream.internal"]),
        "client": issue_client_cert(ca, "system:node:node-a"),
        "other_ca": create_ca("other"),
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A kubeconfig with context ``c`` → cluster ``k``, user ``u``."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [
            {"name": "k", "cluster": {"server": "https://10.0.0.1:6443", **(cluster or {})}}
        ],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t0k3n"}}],
    }
    doc.update(top)
    return doc


def _write(directory: Path, doc: Any, name: str = "config") -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def test_all_names_exist() -> None:
    assert all(hasattr(kubeconfig, name) for name in kubeconfig.__all__)


# --- accepted kubeconfigs --------------------------------------------------------------------

# Each case: kubeconfig (as a function of the directory it lives in), load kwargs, expected fields.
_ACCEPTED: list[tuple[str, Callable[[Path], dict], dict, dict]] = [
    ("token", lambda d: _kubeconfig(), {}, {"server": "https://10.0.0.1:6443", "token": "t0k3n"}),
    (
        "trailing-slash-and-case",
        lambda d: _kubeconfig({"server": "HTTPS://api.example.com/"}),
        {},
        {"server": "https://api.example.com"},
    ),
    (
        "ipv6-http",
        lambda d: _kubeconfig({"server": "http://[fd00::1]:8080"}, {}),
        {},
        {"server": "http://[fd00::1]:8080", "token": None},
    ),
    (
        "relative-files",
        lambda d: _kubeconfig(
            {"certificate-authority": "pki/ca.crt"},
            {"client-certificate": "pki/c.crt", "client-key": "pki/c.key", "tokenFile": "tok"},
        ),
        {},
        {
            "ca_file": "{d}/pki/ca.crt",
            "client_cert_file": "{d}/pki/c.crt",
            "client_key_file": "{d}/pki/c.key",
            "token_file": "{d}/tok",
        },
    ),
    (
        "absolute-files",
        lambda d: _kubeconfig(
            {"certificate-authority": f"{d}/pki/ca.crt"}, {"tokenFile": f"{d}/tok"}
        ),
        {},
        {"ca_file": "{d}/pki/ca.crt", "token_file": "{d}/tok"},
    ),
    (
        "data",
        lambda d: _kubeconfig(
            {"certificate-authority-data": _b64(b"CA")},
            {"client-certificate-data": _b64(b"CERT"), "client-key-data": _b64(b"KEY")},
        ),
        {},
        {"ca_data": b"CA", "client_cert_data": b"CERT", "client_key_data": b"KEY"},
    ),
    (
        "insecure-and-server-name",
        lambda d: _kubeconfig({"insecure-skip-tls-verify": True, "tls-server-name": "api"}),
        {},
        {"insecure_skip_tls_verify": True, "tls_server_name": "api"},
    ),
    (
        "explicit-context",
        lambda d: {
            **_kubeconfig(),
            "contexts": [
                {"name": "c", "context": {"cluster": "k", "user": "u"}},
                {"name": "other", "context": {"cluster": "k2"}},
            ],
            "clusters": [
                {"name": "k", "cluster": {"server": "https://a:1"}},
                {"name": "k2", "cluster": {"server": "https://b:2"}},
            ],
        },
        {"context": "other"},
        {"server": "https://b:2", "token": None},
    ),
    (
        "explicit-context-without-current",
        lambda d: _kubeconfig(**{"current-context": ""}),
        {"context": "c"},
        {"token": "t0k3n"},
    ),
    (
        "server-override",
        lambda d: _kubeconfig({"server": ""}),
        {"server_override": "https://127.0.0.1:7443/"},
        {"server": "https://127.0.0.1:7443"},
    ),
]


@pytest.mark.parametrize(
    ("doc", "kwargs", "expected"), [c[1:] for c in _ACCEPTED], ids=[c[0] for c in _ACCEPTED]
)
def test_accepted_kubeconfigs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc: Callable, kwargs: dict, expected: dict
) -> None:
    directory = tmp_path / "kube"
    for name in ("pki/ca.crt", "pki/c.crt", "pki/c.key", "tok"):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text("x")
    path = _write(directory, doc(directory))
    monkeypatch.chdir(tmp_path)  # relative paths must not depend on the working directory
    cfg = load_kubeconfig(path, **kwargs)
    for field, value in expected.items():
        if isinstance(value, str):
            value = value.format(d=directory)
        assert getattr(cfg, field) == value, field


# --- refused kubeconfigs ---------------------------------------------------------------------

_REFUSED: list[tuple[str, Any, dict, str]] = [
    ("missing-file", None, {}, "cannot read"),
    ("bad-yaml", "a: [b\n", {}, "not valid YAML at line 2"),
    ("not-a-mapping", "- a\n", {}, "expected a YAML mapping"),
    (
        "no-current-context",
        _kubeconfig(**{"current-context": None}),
        {},
        "current-context: not set",
    ),
    ("context-not-found", _kubeconfig(), {"context": "nope"}, "contexts: context 'nope' not found"),
    (
        "cluster-not-found",
        _kubeconfig(clusters=[{"name": "x", "cluster": {"server": "https://a"}}]),
        {},
        "clusters: cluster 'k' not found",
    ),
    ("user-not-found", _kubeconfig(users=[]), {}, "users: user 'u' not found"),
    (
        "duplicate-cluster",
        _kubeconfig(
            clusters=[
                {"name": "k", "cluster": {"server": "https://a"}},
                {"name": "k", "cluster": {"server": "https://b"}},
            ]
        ),
        {},
        "clusters: cluster 'k' defined more than once",
    ),
    ("no-server", _kubeconfig({"server": None}), {}, "clusters[name=k].cluster.server: not set"),
    ("ftp-server", _kubeconfig({"server": "ftp://h"}), {}, "is not an http(s) URL"),
    ("no-scheme", _kubeconfig({"server": "10.0.0.1:6443"}), {}, "is not an http(s) URL"),
    ("server-path", _kubeconfig({"server": "https://h/api"}), {}, "must not have a path"),
    ("server-query", _kubeconfig({"server": "https://h?x=1"}), {}, "must not have a query"),
    ("server-empty-query", _kubeconfig({"server": "https://h/?"}), {}, "must not have a query"),
    ("server-fragment", _kubeconfig({"server": "https://h#f"}), {}, "or fragment"),
    ("server-userinfo", _kubeconfig({"server": "https://u:hunter2@h"}), {}, "user info"),
    ("server-bad-port", _kubeconfig({"server": "https://h:99999"}), {}, "not a valid URL"),
    ("server-not-string", _kubeconfig({"server": 5}), {}, "server: must be a string"),
    (
        "exec",
        _kubeconfig(user={"exec": {"command": "x"}}),
        {},
        "user.exec: exec credential plugins are not supported",
    ),
    (
        "auth-provider",
        _kubeconfig(user={"auth-provider": {"name": "gcp"}}),
        {},
        "auth-provider plugins are not supported",
    ),
    (
        "basic-auth",
        _kubeconfig(user={"username": "a", "password": "b"}),
        {},
        "basic auth is not supported",
    ),
    (
        "impersonate",
        _kubeconfig(user={"token": "t", "as": "admin"}),
        {},
        "impersonation is not supported",
    ),
    (
        "bad-ca-base64",
        _kubeconfig({"certificate-authority-data": "!!!"}),
        {},
        "certificate-authority-data: not valid base64",
    ),
    (
        "bad-key-base64",
        _kubeconfig(user={"client-certificate-data": "QQ==", "client-key-data": "Q"}),
        {},
        "client-key-data: not valid base64",
    ),
    (
        "cert-without-key",
        _kubeconfig(user={"client-certificate-data": "QQ=="}),
        {},
        "client-key: missing",
    ),
    (
        "key-without-cert",
        _kubeconfig(user={"client-key-data": "QQ=="}),
        {},
        "client-certificate: missing",
    ),
    (
        "ca-file-and-data",
        _kubeconfig({"certificate-authority": "config", "certificate-authority-data": "QQ=="}),
        {},
        "both it and certificate-authority-data",
    ),
    (
        "insecure-with-ca",
        _kubeconfig({"insecure-skip-tls-verify": True, "certificate-authority-data": "QQ=="}),
        {},
        "cannot be combined",
    ),
    (
        "insecure-not-bool",
        _kubeconfig({"insecure-skip-tls-verify": "yes"}),
        {},
        "must be true or false",
    ),
    (
        "missing-ca-file",
        _kubeconfig({"certificate-authority": "nope.crt"}),
        {},
        "certificate-authority: ",
    ),
    ("missing-token-file", _kubeconfig(user={"tokenFile": "nope"}), {}, "user.tokenFile: "),
    (
        "token-with-newline",
        _kubeconfig(user={"token": "a\nX-Evil: 1"}),
        {},
        "token: contains whitespace",
    ),
    ("contexts-not-list", _kubeconfig(contexts={"c": {}}), {}, "contexts: must be a list"),
    (
        "override-with-path",
        _kubeconfig(),
        {"server_override": "https://h/x"},
        "--upstream: 'https://h/x' must not have a path",
    ),
    (
        "override-not-http",
        _kubeconfig(),
        {"server_override": "unix:///s"},
        "--upstream: 'unix:///s' is not an http(s) URL",
    ),
]


@pytest.mark.parametrize(
    ("doc", "kwargs", "fragment"), [c[1:] for c in _REFUSED], ids=[c[0] for c in _REFUSED]
)
def test_refused_kubeconfigs(tmp_path: Path, doc: Any, kwargs: dict, fragment: str) -> None:
    path = str(tmp_path / "config") if doc is None else _write(tmp_path, doc)
    with pytest.raises(ConfigError) as info:
        load_kubeconfig(path, **kwargs)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    if not kwargs.get("server_override"):
        assert message.startswith(f"kubeconfig {path}: ")
    assert "hunter2" not in message


def test_token_file_wins_over_token(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    path = _write(tmp_path, _kubeconfig(user={"token": "static", "tokenFile": "tok"}))
    assert TokenSource(load_kubeconfig(path)).token() == "from-file"


def test_repr_hides_token_and_key() -> None:
    cfg = UpstreamConfig(
        server="https://h", token="s3cret-token", client_key_data=b"KEYMATERIAL",
        client_cert_data=b"CERTDATA",
    )  # fmt: skip
    text = repr(cfg)
    assert "s3cret" not in text
    assert "KEYMATERIAL" not in text
    assert "https://h" in text
    assert "token=<redacted>" in text


# --- in-cluster and resolution ---------------------------------------------------------------


@pytest.fixture
def sa_root(tmp_path: Path) -> Path:
    root = tmp_path / "sa"
    root.mkdir()
    (root / "token").write_text("sa-token\n")
    (root / "ca.crt").write_text("ca")
    return root


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [("10.96.0.1", "443", "https://10.96.0.1:443"), ("fd00::1", "6443", "https://[fd00::1]:6443")],
    ids=["ipv4", "ipv6"],
)
def test_in_cluster(sa_root: Path, host: str, port: str, server: str) -> None:
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    cfg = load_in_cluster(environ=env, root=str(sa_root))
    assert cfg == UpstreamConfig(
        server=server, ca_file=str(sa_root / "ca.crt"), token_file=str(sa_root / "token")
    )
    assert TokenSource(cfg).token() == "sa-token"


def test_in_cluster_override(sa_root: Path) -> None:
    cfg = load_in_cluster(environ={}, root=str(sa_root), server_override="https://h:1")
    assert cfg.server == "https://h:1"


@pytest.mark.parametrize(
    ("env", "remove", "fragment"),
    [
        ({}, None, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "x"}, None, "is not a port"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "token", "token"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "ca.crt", "ca.crt"),
    ],
    ids=["no-env", "bad-port", "no-token", "no-ca"],
)
def test_in_cluster_refusals(sa_root: Path, env: dict, remove: str | None, fragment: str) -> None:
    if remove:
        (sa_root / remove).unlink()
    with pytest.raises(ConfigError, match="in-cluster config") as info:
        load_in_cluster(environ=env, root=str(sa_root))
    assert fragment in str(info.value)


def test_resolve_flag_then_env_then_in_cluster(tmp_path: Path) -> None:
    flag = _write(tmp_path, _kubeconfig({"server": "https://flag"}), "flag")
    env = _write(tmp_path, _kubeconfig({"server": "https://env"}), "env")
    environ = {"KUBECONFIG": f"{os.pathsep}{env}{os.pathsep}{flag}"}
    assert (
        resolve_upstream(kubeconfig=flag, upstream=None, environ=environ).server == "https://flag"
    )
    assert resolve_upstream(kubeconfig=None, upstream=None, environ=environ).server == "https://env"
    got = resolve_upstream(kubeconfig=None, upstream="http://127.0.0.1:8001", environ=environ)
    assert got.server == "http://127.0.0.1:8001"
    with pytest.raises(ConfigError, match="in-cluster config"):
        resolve_upstream(kubeconfig=None, upstream=None, environ={"KUBECONFIG": ""})


# --- token rotation --------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_static_token_and_none() -> None:
    assert TokenSource(UpstreamConfig(server="https://h", token="abc")).token() == "abc"
    assert TokenSource(UpstreamConfig(server="https://h")).token() is None


def test_token_file_rotation_is_read_only_on_reload(tmp_path: Path) -> None:
    """The token is read when the source is made and on reload (the reloader's call when the
    file changed), never when a request asks for it."""
    path = tmp_path / "token"
    path.write_text("one\n")
    source = TokenSource(UpstreamConfig(server="https://h", token_file=str(path)))
    assert source.token() == "one"
    path.write_text("two\n")
    assert source.token() == "one"  # no file read on the request path
    source.reload()
    assert source.token() == "two"
    assert source.last_error is None

    path.unlink()
    with pytest.raises(ConfigError):
        source.reload()
    assert source.token() == "two"  # last good token kept
    assert source.last_error is not None and str(path) in source.last_error
    assert "two" not in source.last_error

    path.write_text("   \n")  # empty: also keeps the last good one
    with pytest.raises(ConfigError):
        source.reload()
    assert source.token() == "two"
    assert "empty" in (source.last_error or "")

    path.write_text("three")
    source.reload()
    assert source.token() == "three"
    assert source.last_error is None


@pytest.mark.parametrize(
    "content", [None, "", "a b", "x" * 70000], ids=["missing", "empty", "space", "huge"]
)
def test_token_file_unreadable_at_start(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="upstream token: token file"):
        TokenSource(UpstreamConfig(server="https://h", token_file=str(path)))


# --- TLS context -----------------------------------------------------------------------------


def _files(directory: Path, stem: str, issued: IssuedCert) -> tuple[str, str]:
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    write_pem(cert, issued.cert_pem)
    write_pem(key, issued.key_pem, private=True)
    return str(cert), str(key)


def _leftover_dirs() -> set[str]:
    found = set()
    for root in ("/dev/shm", tempfile.gettempdir()):
        if os.path.isdir(root):
            found |= {e for e in os.listdir(root) if e.startswith("dra-gatekeeper-")}
    return found


def test_ssl_context_http_is_none() -> None:
    assert build_ssl_context(UpstreamConfig(server="http://127.0.0.1:8080")) is None


def test_ssl_context_verifies_by_default(pki: dict[str, IssuedCert]) -> None:
    ctx = build_ssl_context(UpstreamConfig(server="https://h", ca_data=pki["ca"].cert_pem))
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_ssl_context_insecure() -> None:
    ctx = build_ssl_context(UpstreamConfig(server="https://h", insecure_skip_tls_verify=True))
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


def test_ssl_context_client_data_leaves_no_files(pki: dict[str, IssuedCert]) -> None:
    before = _leftover_dirs()
    cfg = UpstreamConfig(
        server="https://h",
        ca_data=pki["ca"].cert_pem,
        client_cert_data=pki["client"].cert_pem,
        client_key_data=pki["client"].key_pem,
    )
    assert build_ssl_context(cfg) is not None
    assert _leftover_dirs() == before


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"ca_data": b"not pem"}, "cannot load CA from certificate-authority-data"),
        ({"ca_file": "/nonexistent/ca.crt"}, "cannot load CA from /nonexistent/ca.crt"),
        ({"client_cert_data": "client", "client_key_data": "other_ca"}, "cannot load client"),
        ({"client_cert_data": "client", "client_key_data": b"garbage"}, "cannot load client"),
    ],
    ids=["bad-ca-data", "missing-ca-file", "mismatched-key", "garbage-key"],
)
def test_ssl_context_refusals(pki: dict[str, IssuedCert], fields: dict, fragment: str) -> None:
    resolved = {}
    for name, value in fields.items():
        if isinstance(value, str) and name.startswith("client_"):
            issued = pki[value]
            value = issued.cert_pem if name == "client_cert_data" else issued.key_pem
        resolved[name] = value
    before = _leftover_dirs()
    with pytest.raises(ConfigError, match=fragment) as info:
        build_ssl_context(UpstreamConfig(server="https://h", **resolved))
    assert "PRIVATE" not in str(info.value)
    assert _leftover_dirs() == before


# --- real mTLS handshake ---------------------------------------------------------------------


async def _start_mtls_server(
    tmp_path: Path, pki: dict[str, IssuedCert], server_cert: str
) -> AsyncIterator[int]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=pki["ca"].cert_pem.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(*_files(tmp_path, server_cert, pki[server_cert]))

    async def whoami(request: web.Request) -> web.Response:
        cn = client_cert_common_name(request.transport.get_extra_info("peercert"))
        return web.Response(text=f"{cn}|{request.headers.get('Authorization')}")

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def mtls_port(tmp_path: Path, pki: dict[str, IssuedCert]) -> AsyncIterator[int]:
    async for port in _start_mtls_server(tmp_path, pki, "server"):
        yield port


@pytest.fixture
async def named_port(tmp_path: Path, pki: dict[str, IssuedCert]) -> AsyncIterator[int]:
    async for port in _start_mtls_server(tmp_path, pki, "named"):
        yield port


async def _whoami(cfg: UpstreamConfig) -> str:
    """Who the server saw, through the gatekeeper's own upstream session."""
    session = UpstreamSession(cfg)
    await session.start()
    try:
        async with session.stream("GET", "/whoami", {}, None, pool="own") as response:
            return (await response.read(4096)).decode()
    finally:
        await session.close()


def _certificate_refused(info: pytest.ExceptionInfo[UpstreamError]) -> bool:
    return isinstance(info.value.__cause__, aiohttp.ClientConnectorCertificateError)


@pytest.mark.parametrize("source", ["files", "data"])
async def test_mtls_handshake_presents_the_client_cert(
    tmp_path: Path, pki: dict[str, IssuedCert], mtls_port: int, source: str
) -> None:
    ca_file = tmp_path / "ca.crt"
    write_pem(ca_file, pki["ca"].cert_pem)
    if source == "files":
        cert, key = _files(tmp_path, "client", pki["client"])
        user = {"client-certificate": cert, "client-key": key, "token": "tok"}
        cluster = {"certificate-authority": str(ca_file)}
    else:
        user = {
            "client-certificate-data": _b64(pki["client"].cert_pem),
            "client-key-data": _b64(pki["client"].key_pem),
            "token": "tok",
        }
        cluster = {"certificate-authority-data": _b64(pki["ca"].cert_pem)}
    cluster["server"] = f"https://127.0.0.1:{mtls_port}"
    cfg = load_kubeconfig(_write(tmp_path / "kube", _kubeconfig(cluster, user)))
    assert await _whoami(cfg) == "system:node:node-a|Bearer tok"


async def test_mtls_wrong_ca_is_refused(pki: dict[str, IssuedCert], mtls_port: int) -> None:
    cfg = UpstreamConfig(
        server=f"https://127.0.0.1:{mtls_port}",
        ca_data=pki["other_ca"].cert_pem,
        client_cert_data=pki["client"].cert_pem,
        client_key_data=pki["client"].key_pem,
    )
    with pytest.raises(UpstreamError) as refused:
        await _whoami(cfg)
    assert _certificate_refused(refused)


async def test_tls_server_name_is_used_for_verification(
    pki: dict[str, IssuedCert], named_port: int
) -> None:
    base = {
        "server": f"https://127.0.0.1:{named_port}",
        "ca_data": pki["ca"].cert_pem,
        "client_cert_data": pki["client"].cert_pem,
        "client_key_data": pki["client"].key_pem,
    }
    with pytest.raises(UpstreamError) as refused:
        await _whoami(UpstreamConfig(**base))  # the cert is for upstream.internal only
    assert _certificate_refused(refused)
    named = UpstreamConfig(**base, tls_server_name="upstream.internal")
    assert await _whoami(named) == "system:node:node-a|None"
