"""kubectl, unchanged, as a driver's client of a running test gatekeeper (over mTLS)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import yaml

from gatekeeper.apiserver._factories import resource_slice
from gatekeeper.testing._fixtures import GPU, NODE, Running
from gatekeeper.types import KubeObject

__all__ = ["KUBECTL", "SELECTOR", "Kubectl", "slice_manifest", "write_kubeconfig"]

KUBECTL = shutil.which("kubectl")
"""The kubectl on PATH, or None (tests that need it are skipped: marker ``kubectl``)."""
SELECTOR = f"spec.nodeName={NODE},spec.driver={GPU}"
"""The field selector a driver's kubectl passes to list its own slices."""


def write_kubeconfig(directory: Path, gatekeeper: Running, driver: str) -> Path:
    """A kubeconfig for ``driver``: the gatekeeper's mTLS URL and the driver's client cert."""
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


def slice_manifest(name: str, driver: str = GPU, node: str = NODE, pool: str = NODE) -> KubeObject:
    """A ResourceSlice manifest as a driver would ``kubectl create`` it."""
    return resource_slice(name, driver=driver, node=node, pool=pool)


class Kubectl:
    """Runs kubectl with one kubeconfig and cache directory; returns (code, stdout, stderr)."""

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
