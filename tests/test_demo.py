"""`dra-gatekeeper demo`, the README's first command: it starts, serves kubectl, and cleans up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from gatekeeper.testing import resource_slice
from gatekeeper.testing.harness import GPU, KUBECTL, free_port


@pytest.mark.kubectl
async def test_demo_serves_kubectl_and_cleans_up(tmp_path: Path) -> None:
    process, lines = await _start_demo()
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        workdir = Path(kubeconfig).parent
        assert (workdir / "audit.log").exists()
    finally:
        await _stop(process)
    assert process.returncode == 0
    assert not workdir.exists()
    assert os.path.basename(kubeconfig) == "gpu.example.com.kubeconfig"


async def _start_demo(*args: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gatekeeper",
        "demo",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "READY":
        raw = await asyncio.wait_for(process.stdout.readline(), 30)
        assert raw, "demo exited before it was ready"
        lines.append(raw.decode().strip())
    return process, lines


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
    await asyncio.wait_for(process.wait(), 30)


@pytest.mark.kubectl
async def test_demo_watch_sees_objects_created_later(tmp_path: Path) -> None:
    workdir, port = tmp_path / "demo", free_port()
    process, lines = await _start_demo("--dir", str(workdir), "--port", str(port))
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        assert Path(kubeconfig).parent == workdir
        selector = "spec.nodeName=demo-node,spec.driver=gpu.example.com"
        printed = next(line for line in lines if line.strip().endswith("s") and " -w " in line)
        assert f"kubectl get resourceslices --field-selector {selector} -w" in printed
        base = [str(KUBECTL), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "c")]
        watch = await asyncio.create_subprocess_exec(
            *base,
            *("get", "resourceslices", "--field-selector", selector, "-w", "-o", "name"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert watch.stdout is not None
        try:
            first = await asyncio.wait_for(watch.stdout.readline(), 30)
            assert first.decode().strip().endswith("/demo-node-gpu.example.com-0")
            await asyncio.sleep(3)  # the watch has been open for a while: it still delivers
            manifest = tmp_path / "late.yaml"
            manifest.write_text(
                json.dumps(resource_slice("demo-node-late", driver=GPU, node="demo-node"))
            )
            create = await asyncio.create_subprocess_exec(
                *base, "create", "-f", str(manifest), stdout=asyncio.subprocess.PIPE
            )
            assert await asyncio.wait_for(create.wait(), 60) == 0
            seen: set[str] = set()
            while not {"demo-node-late", "demo-node-gpu.example.com-1"} <= seen:
                line = await asyncio.wait_for(watch.stdout.readline(), 30)
                assert line, "the watch ended"
                seen.add(line.decode().strip().rsplit("/", 1)[-1])
        finally:
            watch.kill()
            await watch.wait()
        assert f"127.0.0.1:{port}" in Path(kubeconfig).read_text()
    finally:
        await _stop(process)
    assert process.returncode == 0
    assert workdir.is_dir() and (workdir / "audit.log").exists()  # --dir is kept
    assert not (workdir / "sockets" / GPU / "api.sock").exists()


@pytest.mark.kubectl
async def test_upstream_only_runs_the_embedded_api_server_alone(tmp_path: Path) -> None:
    process, lines = await _start_demo("--upstream-only", "--dir", str(tmp_path))
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        assert any(line.strip().startswith("dra-gatekeeper serve") for line in lines)
        run = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            *("--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "c")),
            *("get", "resourceslices", "-o", "name"),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(run.communicate(), 60)
        # The upstream itself: every slice, no gatekeeper in between.
        assert "other-node-gpu.example.com-0" in out.decode()
        assert not (tmp_path / "sockets").exists()
    finally:
        await _stop(process)
    assert process.returncode == 0
