"""Per-driver sockets that no driver can take over: what a driver leaves at its socket path
costs only its own listener; a second instance on the directory exits 2; sockets are 0660 and
owned by ``--socket-group`` so a non-root driver in that group connects, and no one else."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.errors import ConfigError
from gatekeeper.listen.listeners import SocketListeners
from gatekeeper.policy import Policy
from gatekeeper.server.config import ServeConfig
from gatekeeper.server.server import GatekeeperServer, socket_path
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    SERVE,
    free_port,
    token_kubeconfig,
    wait_ready,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig


@asynccontextmanager
async def serving(
    apiserver: APIServer, policy: Policy, socket_dir: Path, **options: object
) -> AsyncIterator[GatekeeperServer]:
    upstream = UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)
    config = ServeConfig(
        node_name=NODE, policy=policy, upstream=upstream, socket_dir=socket_dir, **options
    )  # type: ignore[arg-type]
    server = GatekeeperServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def version_status(path: Path) -> int:
    connector = aiohttp.UnixConnector(path=str(path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get("http://localhost/version") as response,
    ):
        return response.status


def plant_directory(path: Path, outside: Path) -> None:
    path.mkdir()


def plant_file(path: Path, outside: Path) -> None:
    path.write_text("not a socket")


def plant_symlink(path: Path, outside: Path) -> None:
    path.symlink_to(outside)


def plant_live_socket(path: Path, outside: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)
    _KEEP.append(listener)


_KEEP: list[socket.socket] = []
PLANTS: list[tuple[str, Callable[[Path, Path], None], str]] = [
    ("directory", plant_directory, "is a directory, not a socket"),
    ("regular-file", plant_file, "is a regular file, not a socket"),
    ("symlink", plant_symlink, "is a symlink, not a socket"),
    ("live-socket", plant_live_socket, "something else is listening"),
]


@pytest.mark.parametrize(("plant", "reason"), [p[1:] for p in PLANTS], ids=[p[0] for p in PLANTS])
async def test_what_a_driver_leaves_costs_only_its_own_listener(
    apiserver: APIServer,
    policy: Policy,
    tmp_path: Path,
    plant: Callable[[Path, Path], None],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    socket_dir = tmp_path / "s"
    outside = tmp_path / "outside"
    outside.write_text("secret")
    outside.chmod(0o600)
    (socket_dir / GPU).mkdir(parents=True)
    plant(socket_path(socket_dir, GPU), outside)
    try:
        async with serving(apiserver, policy, socket_dir) as server:
            assert await version_status(socket_path(socket_dir, NIC)) == 200
            assert GPU not in server.identifier.socket_drivers.values()
            assert f"not listening for driver={GPU}" in caplog.text and reason in caplog.text
        # Left as it was: nothing followed, replaced or removed.
        assert os.lstat(socket_path(socket_dir, GPU)) is not None
        assert outside.read_text() == "secret" and outside.stat().st_mode & 0o777 == 0o600
    finally:
        while _KEEP:
            _KEEP.pop().close()


async def test_a_stale_socket_is_replaced(
    apiserver: APIServer, policy: Policy, tmp_path: Path
) -> None:
    socket_dir = tmp_path / "s"
    (socket_dir / GPU).mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(socket_path(socket_dir, GPU)))
    stale.close()  # the file stays, nobody accepts: a crashed instance's leftover
    async with serving(apiserver, policy, socket_dir):
        assert await version_status(socket_path(socket_dir, GPU)) == 200
    assert not socket_path(socket_dir, GPU).exists()


async def test_a_symlinked_driver_directory_is_not_entered(
    apiserver: APIServer, policy: Policy, tmp_path: Path
) -> None:
    socket_dir = tmp_path / "s"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    socket_dir.mkdir()
    (socket_dir / GPU).symlink_to(elsewhere)
    async with serving(apiserver, policy, socket_dir) as server:
        assert await version_status(socket_path(socket_dir, NIC)) == 200
        assert list(server.identifier.socket_drivers.values()) == [NIC]
    assert list(elsewhere.iterdir()) == []


async def test_stop_leaves_a_socket_that_is_no_longer_ours(
    apiserver: APIServer, policy: Policy, tmp_path: Path
) -> None:
    socket_dir = tmp_path / "s"
    async with serving(apiserver, policy, socket_dir):
        path = socket_path(socket_dir, GPU)
        path.unlink()
        path.write_text("someone else's")
    assert path.read_text() == "someone else's"


def test_the_directory_lock_names_the_holder(tmp_path: Path) -> None:
    first = SocketListeners(tmp_path / "s")
    first.acquire()
    try:
        with pytest.raises(ConfigError, match=f"socket directory .* in use by PID {os.getpid()}"):
            SocketListeners(tmp_path / "s").acquire()
    finally:
        first.close()
    second = SocketListeners(tmp_path / "s")
    second.acquire()  # released on close
    second.close()


async def test_second_instance_exits_2_and_the_first_keeps_its_sockets(
    apiserver: APIServer, tmp_path: Path
) -> None:
    sockets = tmp_path / "s"
    config = token_kubeconfig(tmp_path / "kc", apiserver.url)
    common = ["--node-name", NODE, "--driver", GPU, "--socket-dir", str(sockets)]
    health = free_port()
    first = await asyncio.create_subprocess_exec(
        *SERVE, *common, "--kubeconfig", config, "--health-listen", f"127.0.0.1:{health}",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_ready(health)
        second = await asyncio.create_subprocess_exec(
            *SERVE, *common, "--kubeconfig", config, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(second.communicate(), 30)
        assert second.returncode == 2
        assert err.decode().strip().splitlines()[-1].endswith(f"in use by PID {first.pid}")
        assert await version_status(socket_path(sockets, GPU)) == 200
    finally:
        first.send_signal(signal.SIGTERM)
        await asyncio.wait_for(first.wait(), 20)
    assert first.returncode == 0


def _connect_as(uid: int, groups: list[int], path: Path) -> str:
    """Connect from a forked child that dropped to ``uid`` with only ``groups``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only syscalls, then _exit
        try:
            os.setgroups(groups)
            os.setgid(65534)
            os.setuid(uid)
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(path))
                os.write(write, b"connected")
            except OSError as exc:
                os.write(write, (exc.strerror or "error").encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as answer:
        return answer.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_socket_group_lets_a_non_root_driver_in_and_no_one_else(
    apiserver: APIServer, policy: Policy, tmp_path: Path
) -> None:
    group = 4242  # a gid no one on this machine has
    top = Path(tempfile.mkdtemp(prefix="gk-group-"))  # pytest's tmp_path is 0700 root's
    top.chmod(0o755)
    socket_dir = top / "s"
    try:
        async with serving(apiserver, policy, socket_dir, socket_group=group):
            path = socket_path(socket_dir, GPU)
            st, parent = path.lstat(), path.parent.lstat()
            assert (st.st_mode & 0o777, st.st_gid) == (0o660, group)
            assert (parent.st_mode & 0o777, parent.st_gid) == (0o750, group)
            assert _connect_as(65534, [group], path) == "connected"
            assert _connect_as(65534, [], path) == "Permission denied"
    finally:
        shutil.rmtree(top, ignore_errors=True)
