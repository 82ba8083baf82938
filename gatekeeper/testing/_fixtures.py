"""A gatekeeper running for a test: throwaway PKI, a fresh socket directory, drivers' sessions.

What the project's own tests share, shipped so that operators' tests can do the same: start a
real :class:`~gatekeeper.server.server.GatekeeperServer` in front of an embedded API server and
talk to it as a driver would (Unix socket, mTLS, or raw bytes).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gatekeeper.apiserver._factories import resource_slice
from gatekeeper.apiserver.server import APIServer
from gatekeeper.audit import AuditSink
from gatekeeper.cli.certs import (
    IssuedCert,
    create_ca,
    issue_client_cert,
    issue_server_cert,
    write_pem,
)
from gatekeeper.policy import Policy
from gatekeeper.server.config import ServeConfig, server_ssl_context
from gatekeeper.server.server import GatekeeperServer, socket_path
from gatekeeper.types import KubeObject
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import Upstream

__all__ = [
    "GPU",
    "NIC",
    "NODE",
    "NODE_TOKEN",
    "PINNED",
    "PKI",
    "SLICES",
    "Audited",
    "RecordingSink",
    "Running",
    "raw_request",
    "running_gatekeeper",
    "seed",
    "serve_config",
    "slice_body",
]

NODE = "node-a"
"""The node the test gatekeeper runs on."""
GPU = "gpu.example.com"
NIC = "nic.example.com"
"""Two drivers allowed on the node."""
NODE_TOKEN = "node-a-upstream-token"
"""The node's credential at the embedded API server (never a driver's)."""
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}"
"""The query that pins a ResourceSlice list or watch to the GPU driver on this node."""


@dataclass(frozen=True)
class PKI:
    """Throwaway certificates generated for a test session (never committed)."""

    directory: Path
    ca: IssuedCert

    @classmethod
    def create(cls, directory: Path) -> PKI:
        """A CA and a server certificate for 127.0.0.1, written to ``directory``."""
        ca = create_ca()
        write_pem(directory / "ca.crt", ca.cert_pem)
        write_pem(directory / "ca.key", ca.key_pem, private=True)
        server = issue_server_cert(ca)
        write_pem(directory / "server.crt", server.cert_pem)
        write_pem(directory / "server.key", server.key_pem, private=True)
        return cls(directory, ca)

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


@dataclass
class Audited(Running):
    """A gatekeeper with its audit log; ``stop()`` flushes it, ``events()`` reads it."""

    log_path: Path = Path()
    stopped: bool = False

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.server.stop()

    async def events(self) -> list[dict[str, Any]]:
        await self.stop()
        with open(self.log_path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]


class RecordingSink:
    """An audit sink that keeps events in memory and says when a request has completed;
    ``writable`` may be set False to stand for a log that cannot be written."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.completed = asyncio.Event()
        self.writable = True

    async def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["stage"] == "ResponseComplete":
            self.completed.set()

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def by_id(self, audit_id: str) -> list[dict[str, Any]]:
        """The events recorded for one audit ID, in order."""
        return [event for event in self.events if event["auditID"] == audit_id]


def serve_config(
    apiserver: APIServer, policy: Policy, pki: PKI, socket_dir: Path, **options: Any
) -> ServeConfig:
    """The tests' serve configuration: the embedded API server upstream, sockets and mTLS.

    ``options`` override any :class:`~gatekeeper.server.config.ServeConfig` field.
    """
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
    """A gatekeeper on a fresh socket directory and an ephemeral mTLS port.

    ``upstream`` and ``audit_sink`` replace the ones the configuration would build.
    """
    socket_dir = Path(tempfile.mkdtemp(prefix="gk-sock-"))
    config = serve_config(apiserver, policy, pki, socket_dir, **options)
    server = GatekeeperServer(config, upstream=upstream, audit=audit_sink)
    await server.start()
    try:
        yield Running(server, socket_dir, pki)
    finally:
        await server.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def slice_body(
    name: str | None = "node-a-gpu-0",
    driver: str = GPU,
    node: str = NODE,
    pool: str = "node-a/gpus",
) -> KubeObject:
    """A ResourceSlice of ``driver`` on ``node`` (the GPU driver on this node by default)."""
    return resource_slice(name, driver=driver, node=node, pool=pool)


def seed(apiserver: APIServer, **kwargs: Any) -> KubeObject:
    """Store :func:`slice_body` straight in the API server (another actor, not a driver)."""
    return apiserver.add(slice_body(**kwargs))


async def raw_request(
    running: Running, method: str, target: str, body: Any = None, driver: str = GPU
) -> tuple[int, dict[str, str], Any]:
    """Send the request line byte for byte (HTTP clients normalize paths; attackers do not)."""
    reader, writer = await asyncio.open_unix_connection(str(running.socket_path(driver)))
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    if payload:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    writer.write(head.encode("latin-1") + b"\r\n" + payload)
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head_bytes, _, body_bytes = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body_bytes)
