"""Raw HTTP/1.1 over a Unix socket: bytes as written, for requests no client library would send."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RawResponse", "build_request", "parse_responses", "send_raw", "send_raw_all"]


@dataclass
class RawResponse:
    """The first response on the connection (``status`` 0: closed without one)."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw: bytes = b""

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def build_request(
    method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost", "Connection: close"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    head = "\r\n".join(lines) + "\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


async def send_raw(path: Path, data: bytes, *, timeout: float = 10.0) -> RawResponse:
    """Send ``data``, read until the server closes (or ``timeout``), parse the first response."""
    responses = await send_raw_all(path, data, timeout=timeout)
    return responses[0] if responses else RawResponse()


async def send_raw_all(path: Path, data: bytes, *, timeout: float = 10.0) -> list[RawResponse]:
    """Send ``data``, read until the server closes (or ``timeout``); every final response."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(timeout):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        writer.close()
    return parse_responses(b"".join(chunks))


def parse_responses(raw: bytes) -> list[RawResponse]:
    """The final (non-1xx) responses in ``raw``, in order."""
    responses: list[RawResponse] = []
    while raw.startswith(b"HTTP/"):
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            raw = rest
            continue
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, raw = _dechunk(rest)
        else:
            length = int(headers.get("content-length", len(rest)))
            body, raw = rest[:length], rest[length:]
        responses.append(RawResponse(status, headers, body, head))
    return responses


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out), data.partition(b"\r\n")[2]
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out), b""
