"""What every benchmark target shares: the objects, a throw-away PKI, kubeconfig, free ports.

Nothing here is committed key material: the CA and certificates are made in a temporary
directory for one run and removed with it.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from gatekeeper.apiserver import resource_slice
from gatekeeper.cli.certs import create_ca, issue_client_cert, issue_server_cert, write_pem
from gatekeeper.codec.kubeproto import PROTOBUF
from gatekeeper.testing.harness import free_port
from gatekeeper.testing.protobuf import envelope as protobuf_envelope
from gatekeeper.testing.protobuf import field, number

__all__ = [
    "COUNTER_WIDTH",
    "DRIVER",
    "NODE",
    "PINNED_QUERY",
    "PROTOBUF",
    "PROTOBUF_ACCEPT",
    "ROOT",
    "SLICES",
    "TOKEN",
    "Pki",
    "counted_slice_protobuf",
    "free_port",
    "item_slice",
    "list_document",
    "make_pki",
    "python_process",
    "serve_tls",
    "slice_body",
    "slice_protobuf",
    "stop_process",
    "wait_ready",
    "write_kubeconfig",
]

ROOT = Path(__file__).resolve().parent.parent
NODE, DRIVER, TOKEN = "node-a", "gpu.example.com", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED_QUERY = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{DRIVER}"
ITEM_NAME = f"{NODE}-bench"
PROTOBUF_ACCEPT = f"{PROTOBUF},application/json"
"""What client-go's typed clients ask for (and send: ``Content-Type: PROTOBUF``)."""


def slice_body(name: str, *, devices: int = 20) -> dict[str, Any]:
    """About 2 KB with 20 devices: a slice of ``DRIVER`` on ``NODE``."""
    items = [
        {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "model": {"string": "bench-x"}}}
        for i in range(devices)
    ]
    return resource_slice(name, driver=DRIVER, node=NODE, devices=items)


def item_slice(name: str = ITEM_NAME, rv: int = 1) -> dict[str, Any]:
    """The stored object a fixed-answer upstream returns for every get/update."""
    obj = slice_body(name)
    obj["metadata"].update(
        uid=f"00000000-0000-4000-8000-{rv:012d}",
        resourceVersion=str(rv),
        creationTimestamp="2026-01-01T00:00:00Z",
    )
    return obj


def slice_protobuf(obj: dict[str, Any]) -> bytes:
    """A ``resource.k8s.io/v1`` ResourceSlice as client-go sends it in protobuf: ``k8s\\0`` +
    runtime.Unknown around the object, fields in number order, empty strings written (gogo).

    Only what :func:`slice_body`, :func:`item_slice` and client-go's recorded slices use
    (labels, uid, resourceVersion, generation, creationTimestamp; driver, pool, nodeName,
    devices with attributes and capacity); anything else is a ValueError rather than silently
    dropped. The wire writer is the tests' (``tests/codec/test_kubeproto.py``)."""
    meta, spec = obj["metadata"], obj["spec"]
    _only(meta, _META_FIELDS, "metadata")
    _only(spec, {"driver", "pool", "nodeName", "devices"}, "spec")
    created = meta.get("creationTimestamp")
    seconds = calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")) if created else 0
    timestamp = number(1, seconds) + number(2, 0) if created else b""
    metadata = (
        field(1, meta.get("name", ""))
        + b"".join(field(n, "") for n in (2, 3, 4))
        + field(5, meta.get("uid", ""))
        + field(6, meta.get("resourceVersion", ""))
        + number(7, meta.get("generation", 0))
        + field(8, timestamp)
        + _map(11, meta.get("labels", {}), lambda value: value)
    )
    pool = spec["pool"]
    message = (
        field(1, spec["driver"])
        + field(
            2,
            field(1, pool["name"])
            + number(2, pool["generation"])
            + number(3, pool["resourceSliceCount"]),
        )
        + field(3, spec["nodeName"])
        + b"".join(field(6, _device(device)) for device in spec["devices"])
    )
    api = obj.get("apiVersion", "resource.k8s.io/v1")
    return protobuf_envelope(metadata, rest=field(2, message), api=api)


_META_FIELDS = {"name", "uid", "resourceVersion", "generation", "creationTimestamp", "labels"}
COUNTER_WIDTH = 12
"""Digits of the load generator's request number in a protobuf create's name (its counters
stay below 10**11: worker index * 10**8 + requests)."""


def counted_slice_protobuf(prefix: str) -> bytes:
    """:func:`slice_protobuf` of :func:`slice_body` named ``prefix{n}``, for the load generator
    to number with ``counter_width=COUNTER_WIDTH``: the length prefixes already count the
    ``COUNTER_WIDTH`` digits that replace the three characters ``{n}``."""
    sentinel = "#" * COUNTER_WIDTH
    return slice_protobuf(slice_body(prefix + sentinel)).replace(sentinel.encode(), b"{n}")


def _only(doc: dict[str, Any], known: set[str], what: str) -> None:
    if extra := set(doc) - known:
        raise ValueError(f"slice_protobuf cannot encode {what} fields {sorted(extra)}")


def _map(number_: int, entries: dict[str, Any], encode: Any) -> bytes:
    """A protobuf map: one entry message per key, sorted (as gogo writes them)."""
    return b"".join(
        field(number_, field(1, key) + field(2, encode(entries[key]))) for key in sorted(entries)
    )


def _attribute(value: dict[str, Any]) -> bytes:
    ((kind, item),) = value.items()
    if kind == "int":
        return number(2, item)
    if kind == "bool":
        return number(3, int(item))
    if kind in ("string", "version"):
        return field(4 if kind == "string" else 5, item)
    raise ValueError(f"slice_protobuf cannot encode a {kind} attribute")


def _device(device: dict[str, Any]) -> bytes:
    _only(device, {"name", "attributes", "capacity"}, "device")
    return (
        field(1, device["name"])
        + _map(2, device.get("attributes", {}), _attribute)
        + _map(3, device.get("capacity", {}), lambda c: field(1, field(1, c["value"])))
    )


def list_document(count: int) -> bytes:
    """A ResourceSliceList of ``count`` ~2 KB slices (500 ≈ 1 MB), as the apiserver sends it."""
    items = [item_slice(f"{NODE}-slice-{i:05d}", rv=i + 1) for i in range(count)]
    doc = {
        "kind": "ResourceSliceList",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"resourceVersion": str(count + 1)},
        "items": items,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of a run's CA, server certificate (loopback) and the driver's client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    client_pem: str
    """Client certificate and key in one file (for ``ab -E``)."""


def make_pki(workdir: Path) -> Pki:
    ca = create_ca("dra-gatekeeper-bench-ca")
    server = issue_server_cert(ca)
    client = issue_client_cert(ca, DRIVER)
    paths = {name: workdir / name for name in ("ca.crt", "srv.crt", "srv.key", "c.crt", "c.key")}
    write_pem(paths["ca.crt"], ca.cert_pem)
    write_pem(paths["srv.crt"], server.cert_pem)
    write_pem(paths["srv.key"], server.key_pem, private=True)
    write_pem(paths["c.crt"], client.cert_pem)
    write_pem(paths["c.key"], client.key_pem, private=True)
    both = workdir / "client.pem"
    write_pem(both, client.cert_pem + client.key_pem, private=True)
    return Pki(
        *(str(paths[n]) for n in ("ca.crt", "srv.crt", "srv.key", "c.crt", "c.key")), str(both)
    )


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    """The node's kubeconfig for ``dra-gatekeeper serve``: the upstream, its CA, a token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "up", "cluster": {"server": server, "certificate-authority": pki.ca}}
        ],
        "users": [{"name": "node", "user": {"token": TOKEN}}],
        "contexts": [{"name": "bench", "context": {"cluster": "up", "user": "node"}}],
        "current-context": "bench",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def serve_tls(
    app: web.Application,
    port: int,
    cert: str,
    key: str,
    *,
    client_ca: str | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Serve ``app`` over TLS on loopback ``port`` until stopped; with ``client_ca``, mutual TLS
    (a client certificate signed by it required)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        ssl_context=context,
        access_log=None,
        print=None,
        backlog=2048,
        shutdown_timeout=1,
        loop=loop,
    )


def python_process(
    args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen:
    """``python ARGS`` in ``cwd`` (the repository root), output to ``log``.

    ``python -m`` puts ``cwd`` first on ``sys.path``: code from elsewhere (``--compare``) must
    run in its own directory, or this repository's package shadows it.
    """
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=full_env
        )


def wait_ready(
    proc: subprocess.Popen | None,
    *,
    port: int | None = None,
    path: str | None = None,
    timeout: float = 20.0,
    what: str = "process",
    log: Path | None = None,
) -> None:
    """Until ``port`` accepts or ``path`` exists; RuntimeError (with the log) on exit/timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if path is not None and os.path.exists(path):
            return
        if port is not None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                pass
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what} did not start within {timeout:.0f} s\n{tail}")


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 5 s: only this process, which the benchmark started."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
