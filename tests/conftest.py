"""Shared fixtures: throwaway PKI, the embedded API server as upstream, a running gatekeeper."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gatekeeper.audit import AuditSink
from gatekeeper.certs import IssuedCert, create_ca, issue_client_cert, issue_server_cert, write_pem
from gatekeeper.config import ServeConfig, server_ssl_context
from gatekeeper.kubeconfig import UpstreamConfig
from gatekeeper.policy import Policy, load_policy
from gatekeeper.server import GatekeeperServer, socket_path
from gatekeeper.testing import APIServer, resource_slice, served_kinds
from gatekeeper.upstream import Upstream

NODE = "node-a"
GPU = "gpu.example.com"
NIC = "nic.example.com"
NODE_TOKEN = "node-a-upstream-token"


@dataclass(frozen=True)
class PKI:
    """Throwaway certificates generated for this test session (never committed)."""

    directory: Path
    ca: IssuedCert

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def client_files(self, driver: str) -> tuple[str, str]:
        cert, key = self.directory / f"{driver}.crt", self.directory / f"{driver}.key"
        if not cert.exists():
            issued = issue_client_cert(self.ca, driver)
            write_pem(cert, issued.cert_pem)
            write_pem(key, issued.key_pem, private=True)
        return str(cert), str(key)

    def client_context(self, driver: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.path("ca.crt"))
        if driver is not None:
            context.load_cert_chain(*self.client_files(driver))
        return context


@pytest.fixture(scope="session")
def pki() -> Iterator[PKI]:
    directory = Path(tempfile.mkdtemp(prefix="gk-pki-"))
    ca = create_ca()
    write_pem(directory / "ca.crt", ca.cert_pem)
    write_pem(directory / "ca.key", ca.key_pem, private=True)
    server = issue_server_cert(ca)
    write_pem(directory / "server.crt", server.cert_pem)
    write_pem(directory / "server.key", server.key_pem, private=True)
    yield PKI(directory, ca)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def policy() -> Policy:
    return load_policy(None).with_drivers(frozenset({GPU, NIC}))


@pytest.fixture
async def apiserver(policy: Policy) -> AsyncIterator[APIServer]:
    server = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await server.start()
    yield server
    await server.close()


@dataclass
class Running:
    """A started gatekeeper and how drivers reach it."""

    server: GatekeeperServer
    socket_dir: Path
    pki: PKI

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.server.tls_port}"

    def socket_path(self, driver: str) -> Path:
        return socket_path(self.socket_dir, driver)

    def unix_session(self, driver: str) -> aiohttp.ClientSession:
        connector = aiohttp.UnixConnector(path=str(self.socket_path(driver)))
        return aiohttp.ClientSession(base_url="http://localhost", connector=connector)

    def tls_session(self, driver: str | None) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self.pki.client_context(driver))
        return aiohttp.ClientSession(base_url=self.tls_url, connector=connector)


def serve_config(
    apiserver: APIServer, policy: Policy, pki: PKI, socket_dir: Path, **options: Any
) -> ServeConfig:
    """The tests' serve configuration: the embedded API server upstream, sockets and mTLS."""
    settings: dict[str, Any] = {
        "node_name": NODE,
        "policy": policy,
        "upstream": UpstreamConfig(server=apiserver.url, token=NODE_TOKEN),
        "socket_dir": socket_dir,
        "listen": ("127.0.0.1", 0),
        "listen_tls": server_ssl_context(
            pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt")
        ),
    }
    settings.update(options)
    return ServeConfig(**settings)


@asynccontextmanager
async def running_gatekeeper(
    apiserver: APIServer,
    policy: Policy,
    pki: PKI,
    *,
    upstream: Upstream | None = None,
    audit_sink: AuditSink | None = None,
    **options: Any,
) -> AsyncIterator[Running]:
    """A gatekeeper on a fresh socket directory and an ephemeral mTLS port."""
    socket_dir = Path(tempfile.mkdtemp(prefix="gk-sock-"))
    config = serve_config(apiserver, policy, pki, socket_dir, **options)
    server = GatekeeperServer(config, upstream=upstream, audit=audit_sink)
    await server.start()
    try:
        yield Running(server, socket_dir, pki)
    finally:
        await server.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
async def gatekeeper(apiserver: APIServer, policy: Policy, pki: PKI) -> AsyncIterator[Running]:
    async with running_gatekeeper(apiserver, policy, pki) as running:
        yield running


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
SELECTOR = f"spec.nodeName={NODE},spec.driver={GPU}"


def write_kubeconfig(directory: Path, gatekeeper: Running, driver: str) -> Path:
    cert, key = gatekeeper.pki.client_files(driver)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gk",
                "cluster": {
                    "server": gatekeeper.tls_url,
                    "certificate-authority": gatekeeper.pki.path("ca.crt"),
                },
            }
        ],
        "users": [{"name": driver, "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "gk", "context": {"cluster": "gk", "user": driver}}],
        "current-context": "gk",
    }
    path = directory / f"{driver}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def slice_manifest(
    name: str, driver: str = GPU, node: str = NODE, pool: str = NODE
) -> dict[str, Any]:
    return resource_slice(name, driver=driver, node=node, pool=pool)


class Kubectl:
    def __init__(self, kubeconfig: Path, cache: Path) -> None:
        self.base = [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache)]

    async def __call__(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *self.base,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(
            process.communicate(stdin.encode() if stdin else None), timeout=60
        )
        return process.returncode or 0, out.decode(), err.decode()


@pytest.fixture
def kubectl(gatekeeper: Running, tmp_path: Path) -> Kubectl:
    return Kubectl(write_kubeconfig(tmp_path, gatekeeper, GPU), tmp_path / "cache")
