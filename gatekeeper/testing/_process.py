"""A real ``dra-gatekeeper serve`` process under test: its command line, a token kubeconfig for
it, a free loopback port for its health listener, and waiting until it reports ready."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import aiohttp
import yaml

from gatekeeper.testing._fixtures import NODE_TOKEN

__all__ = ["SERVE", "free_port", "run_process", "token_kubeconfig", "wait_ready"]

SERVE = [sys.executable, "-m", "gatekeeper", "serve"]
"""The ``serve`` command line, run with this interpreter (the installed package under test)."""


async def run_process(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``args`` to completion (at most 30 s): its exit code and its stderr."""
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode or 0, err.decode()


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def token_kubeconfig(path: Path, server: str | None, token: str = NODE_TOKEN) -> str:
    """Write a kubeconfig for ``server`` (none: the key is left out) with a bearer ``token``."""
    cluster = {"server": server} if server else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


async def wait_ready(port: int, tries: int = 200) -> None:
    """Poll ``/readyz`` on the health ``port`` every 50 ms until it answers 200, ``tries`` times
    at most; then raise ``AssertionError``."""
    async with aiohttp.ClientSession() as session:
        for _ in range(tries):
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as ready:
                    if ready.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"serve did not become ready on port {port}")
