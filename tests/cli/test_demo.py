"""`dra-gatekeeper demo`, the README's first command: it starts, serves kubectl, and cleans up."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gatekeeper.apiserver import resource_slice
from gatekeeper.testing.harness import GPU, KUBECTL, free_port
from tests.paths import REPO

REPO = REPO


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose sockets' paths fit a Unix socket (pytest's own can be too long)."""
    path = Path(tempfile.mkdtemp(prefix="gk-demo-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.kubectl
async def test_demo_serves_kubectl_and_cleans_up_but_keeps_its_audit_log(tmp_path: Path) -> None:
    """The temporary directory goes, the audit log stays (the banner and the last line say
    where), recorded with bodies: `audit check` re-decides the demo's writes on them."""
    process, lines = await _start_demo()
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        workdir = Path(kubeconfig).parent
        audit = Path(f"{workdir}-audit.log")
        assert audit.exists()
        assert any("level RequestResponse" in line for line in lines)
        assert any(line.strip() == str(audit) for line in lines)
        env = {**os.environ, "KUBECONFIG": kubeconfig}
        body = json.dumps(resource_slice("demo-node-x", driver=GPU, node="demo-node",
                                         pool="demo-node/x"))  # fmt: skip
        create = await asyncio.create_subprocess_exec(
            str(KUBECTL), "create", "-f", "-", stdin=asyncio.subprocess.PIPE, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await create.communicate(body.encode())
        assert create.returncode == 0
    finally:
        await _stop(process)
        assert process.stdout is not None
        last = (await process.stdout.read()).decode()
    assert process.returncode == 0
    assert not workdir.exists() and audit.exists()
    assert f"the audit log is kept: {audit}" in last
    assert os.path.basename(kubeconfig) == "gpu.example.com.kubeconfig"
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    (created,) = [e for e in events if e["verb"] == "create"
                  and e["requestObject"]["metadata"]["name"] == "demo-node-x"]  # fmt: skip
    assert created["level"] == "RequestResponse" and created["requestObject"]["spec"]
    checked = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gatekeeper", "audit", "check", str(audit),
        stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    out, _ = await checked.communicate()
    assert checked.returncode == 0 and " 0 changed" in out.decode()
    audit.unlink()


CONSOLE_SCRIPT = Path(sysconfig.get_path("scripts")) / "dra-gatekeeper"
"""The console script of the environment running the tests, wherever its venv is."""


async def _start_demo(
    *args: str,
    program: tuple[str, ...] = (sys.executable, "-m", "gatekeeper"),
    cwd: Path = REPO,
) -> tuple[asyncio.subprocess.Process, list[str]]:
    process = await asyncio.create_subprocess_exec(
        *program,
        "demo",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
    )
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "READY":
        raw = await asyncio.wait_for(process.stdout.readline(), 30)
        assert raw, "demo exited before it was ready"
        lines.append(raw.decode().strip())
    return process, lines


def _as_typed_from_the_clone(program: str) -> str:
    """A program's path as the demo prints it for a user in the clone: relative inside it (the
    README's .venv), absolute outside (a venv elsewhere, as .ci/newest makes)."""
    path = Path(os.path.abspath(program))
    return os.path.relpath(path, REPO) if path.is_relative_to(REPO) else str(path)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
    await asyncio.wait_for(process.wait(), 30)


@pytest.mark.kubectl
async def test_demo_watch_sees_objects_created_later(tmp_path: Path, short_dir: Path) -> None:
    workdir, port = short_dir / "demo", free_port()
    process, lines = await _start_demo(
        "--dir", str(workdir), "--port", str(port), "--change-every", "1"
    )
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        assert Path(kubeconfig).parent == workdir
        selector = "spec.nodeName=demo-node,spec.driver=gpu.example.com"
        printed = next(line for line in lines if " -w " in line)
        assert f"kubectl get resourceslices --field-selector {selector} -w" in printed
        assert printed.endswith("# changes every 1 s")
        assert (
            "Every 1 s until stopped, the demo adds or removes the slice "
            "demo-node-gpu.example.com-1: a watch shows it." in lines
        )
        # The watch starts only after the demo's first change: later changes still show.
        assert process.stdout is not None
        first_change = await asyncio.wait_for(process.stdout.readline(), 30)
        assert first_change.decode().startswith("demo: published ResourceSlice")
        base = [str(KUBECTL), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "c")]
        watch = await asyncio.create_subprocess_exec(
            *base,
            *("get", "resourceslices", "--field-selector", selector, "-w"),
            *("--output-watch-events", "-o", 'jsonpath={.type} {.object.metadata.name}{"\\n"}'),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert watch.stdout is not None
        try:
            first = await asyncio.wait_for(watch.stdout.readline(), 30)
            assert first.decode().split() == ["ADDED", "demo-node-gpu.example.com-0"]
            manifest = tmp_path / "late.yaml"
            manifest.write_text(
                json.dumps(resource_slice("demo-node-late", driver=GPU, node="demo-node"))
            )
            create = await asyncio.create_subprocess_exec(
                *base, "create", "-f", str(manifest), stdout=asyncio.subprocess.PIPE
            )
            assert await asyncio.wait_for(create.wait(), 60) == 0
            seen: set[tuple[str, str]] = set()
            wanted = {
                ("ADDED", "demo-node-late"),
                ("ADDED", "demo-node-gpu.example.com-1"),
                ("DELETED", "demo-node-gpu.example.com-1"),
            }
            for _ in range(100):  # the demo changes its slice every second: bounded
                line = await asyncio.wait_for(watch.stdout.readline(), 30)
                assert line, "the watch ended"
                event, name = line.decode().split()
                seen.add((event, name))
                if wanted <= seen:
                    break
            assert wanted <= seen, seen
        finally:
            watch.kill()
            await watch.wait()
        assert f"127.0.0.1:{port}" in Path(kubeconfig).read_text()
    finally:
        await _stop(process)
    assert process.returncode == 0
    assert workdir.is_dir() and (workdir / "audit.log").exists()  # --dir is kept
    assert not (workdir / "sockets" / GPU / "api.sock").exists()
    # The demo's own changes went through the gatekeeper as the driver's: audited, allowed.
    events = [json.loads(line) for line in (workdir / "audit.log").read_text().splitlines()]
    changes = [e for e in events if e["userAgent"].startswith("dra-gatekeeper-demo")
               and e["stage"] == "ResponseComplete"]  # fmt: skip
    assert {e["verb"] for e in changes} == {"create", "delete"}, changes
    for event in changes:
        assert event["user"]["username"] == GPU
        named = event["objectRef"].get("name") or event["requestObject"]["metadata"]["name"]
        assert named == "demo-node-gpu.example.com-1"
        assert event["annotations"]["authorization.k8s.io/decision"] == "allow"
        assert event["responseStatus"]["code"] in (200, 201)


@pytest.mark.kubectl
async def test_upstream_only_runs_the_embedded_api_server_alone(tmp_path: Path) -> None:
    process, lines = await _start_demo("--upstream-only", "--dir", str(tmp_path))
    try:
        kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
        (serve,) = [line.split() for line in lines if " serve --node-name " in line]
        # Printed as it runs from here: the interpreter that runs the demo, with -m gatekeeper.
        assert serve[:3] == [_as_typed_from_the_clone(sys.executable), "-m", "gatekeeper"]
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


async def test_the_printed_serve_command_runs_as_printed(tmp_path: Path) -> None:
    """Started as the README says (the venv's console script, from the clone), the demo prints
    the command that runs from there; a bare ``dra-gatekeeper`` only when the PATH finds it."""
    process, lines = await _start_demo(
        "--upstream-only", "--dir", str(tmp_path), program=(os.path.relpath(CONSOLE_SCRIPT, REPO),)
    )
    await _stop(process)
    (serve,) = [line.split() for line in lines if " serve --node-name " in line]
    on_path = shutil.which("dra-gatekeeper")
    if on_path is not None and os.path.samefile(on_path, CONSOLE_SCRIPT):
        assert serve[0] == "dra-gatekeeper"
    else:
        assert serve[0] == _as_typed_from_the_clone(str(CONSOLE_SCRIPT))
    ran = await asyncio.create_subprocess_exec(
        serve[0], "--version", cwd=REPO, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(ran.communicate(), 60)
    assert out.decode().startswith("dra-gatekeeper ")


@pytest.mark.parametrize("upstream_only", [False, True], ids=["demo", "upstream-only"])
async def test_a_busy_port_names_the_port_flag(tmp_path: Path, upstream_only: bool) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["--dir", str(tmp_path), "--port", str(port)]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gatekeeper", "demo", *args,
            *(["--upstream-only"] if upstream_only else []),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    message = err.decode().strip().splitlines()[-1]
    assert message.startswith(f"dra-gatekeeper demo: --port {port}") or message.startswith(
        f"dra-gatekeeper demo: --port 127.0.0.1:{port}"
    ), message
    assert "--listen" not in err.decode() and "Address already in use" in message


async def test_a_dir_too_long_for_the_drivers_socket_is_refused_in_one_line(
    short_dir: Path,
) -> None:
    """bind(2) takes at most 107 bytes of a Unix socket's path; the demo says so before it
    starts, instead of a gatekeeper without the demo driver's socket."""
    workdir = short_dir / ("d" * 100)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gatekeeper", "demo", "--dir", str(workdir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    (line,) = err.decode().splitlines()
    sock = workdir / "sockets" / GPU / "api.sock"
    assert line == (
        f"dra-gatekeeper demo: --dir {workdir}: {sock} is {len(str(sock))} bytes long, over the "
        "107 a Unix socket's path may have: choose a shorter socket directory"
    )


async def test_a_relative_dir_gives_a_kubeconfig_that_works_from_anywhere(
    short_dir: Path,
) -> None:
    process, lines = await _start_demo("--dir", "rel", "--change-every", "0", cwd=short_dir)
    await _stop(process)
    kubeconfig = next(line.split("=", 1)[1] for line in lines if line.startswith("KUBECONFIG="))
    assert kubeconfig == str(short_dir / "rel" / "gpu.example.com.kubeconfig")
    user = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]
    assert user["client-certificate"] == str(short_dir / "rel" / "gpu.example.com.crt")


@pytest.mark.kubectl
async def test_the_demo_shows_the_token_listener(tmp_path: Path, short_dir: Path) -> None:
    """The printed kubeconfig with the driver's ServiceAccount token works, and the
    service-account volume it points at is what in-cluster config reads."""
    process, lines = await _start_demo("--dir", str(short_dir / "demo"))
    try:
        command = next(line for line in lines if "token.kubeconfig" in line).split()
        assert command[:2] == ["kubectl", "--kubeconfig"]
        volume = short_dir / "demo" / "serviceaccount"
        assert {p.name for p in volume.iterdir()} == {"token", "ca.crt", "namespace"}
        done = await asyncio.create_subprocess_exec(
            str(KUBECTL), *command[1:], "-o", "json", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(done.communicate(), 30)
        assert done.returncode == 0
        names = [item["metadata"]["name"] for item in json.loads(out)["items"]]
        assert names == ["demo-node-gpu.example.com-0"]
        audit = [
            json.loads(line) for line in (short_dir / "demo" / "audit.log").read_text().splitlines()
        ]
        assert any(
            e["user"]["extra"].get("dra-gatekeeper.io/transport") == ["token"] for e in audit
        )
    finally:
        await _stop(process)
