"""`dra-gatekeeper demo`, the README's first command: it starts, serves kubectl, and cleans up."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from gatekeeper.testing import KUBECTL


@pytest.mark.kubectl
async def test_demo_serves_kubectl_and_cleans_up(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gatekeeper",
        "demo",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        lines: list[str] = []
        while not lines or lines[-1] != "READY":
            raw = await asyncio.wait_for(process.stdout.readline(), 30)
            assert raw, "demo exited before it was ready"
            lines.append(raw.decode().strip())
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        workdir = Path(kubeconfig).parent
        base = [str(KUBECTL), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path)]

        async def kubectl(*args: str) -> tuple[int, str]:
            run = await asyncio.create_subprocess_exec(
                *base, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            out, _ = await asyncio.wait_for(run.communicate(), 60)
            return run.returncode or 0, out.decode()

        code, out = await kubectl(
            "get",
            "resourceslices",
            "--field-selector",
            "spec.nodeName=demo-node,spec.driver=gpu.example.com",
        )
        assert code == 0, out
        assert "demo-node-gpu.example.com-0" in out and "nic" not in out
        code, out = await kubectl("get", "secrets")
        assert code != 0 and 'cannot list resource "secrets"' in out
        assert (workdir / "audit.log").exists()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
    assert not workdir.exists()
    assert os.path.basename(kubeconfig) == "gpu.example.com.kubeconfig"
