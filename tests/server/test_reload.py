"""Reloads without a restart: policy (SIGHUP, file change, ConfigMap symlink swap), upstream
token file, serving certificate and client CA; certificate expiry warnings."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.certs import create_ca, issue_client_cert, issue_server_cert, write_pem
from gatekeeper.cli.served import served_kinds
from gatekeeper.listen.tls import TLSFiles
from gatekeeper.policy import Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.server.server import GatekeeperServer, run_until_signal
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    PKI,
    Running,
    metric_value,
    running_gatekeeper,
    serve_config,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from tests.paths import REPO

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"
DEFAULT = REPO / "gatekeeper" / "policies" / "default.yaml"


def policy_text(*, slice_verbs: str | None = None) -> str:
    text = DEFAULT.read_text().replace("drivers: []", f"drivers: [{GPU}]")
    if slice_verbs is not None:
        text = text.replace(  # the first kind is ResourceSlice
            "    verbs: [get, list, watch, create, update, patch, delete, deletecollection]\n",
            f"    verbs: [{slice_verbs}]\n",
            1,
        )
        assert f"verbs: [{slice_verbs}]" in text
    return text


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("condition not reached")


async def list_status(running: Running) -> int:
    async with running.unix_session(GPU) as session, session.get(f"{SLICES}?{PINNED}") as r:
        return r.status


def metrics_text(running: Running) -> str:
    return running.server.metrics.render().decode()


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text())
    return path


async def test_invalid_policy_is_refused_and_the_old_one_keeps_serving(
    apiserver: APIServer, pki: PKI, policy_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gatekeeper.reload")
    policy = load_policy(str(policy_file))
    async with running_gatekeeper(apiserver, policy, pki, policy_path=str(policy_file)) as gk:
        assert await list_status(gk) == 200
        policy_file.write_text(policy_text().replace("resource: resourceslices", "resurce: x"))
        await gk.server.reloader.reload()
        assert gk.server.engine.policy is policy
        assert await list_status(gk) == 200
        text = metrics_text(gk)
        assert (
            metric_value(text, "dra_gatekeeper_reloads_total", file="policy", result="error") == 1
        )
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="policy", result="ok") == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith("policy reload refused, keeping the previous policy: ")
    assert f"{policy_file}:" in errors[0] and "kinds[0].resurce: unknown key" in errors[0]


async def test_stricter_policy_refuses_at_once_without_dropping_in_flight(
    apiserver: APIServer, pki: PKI, policy_file: Path
) -> None:
    policy = load_policy(str(policy_file))
    async with (
        running_gatekeeper(apiserver, policy, pki, policy_path=str(policy_file)) as gk,
        gk.unix_session(GPU) as session,
    ):
        async with session.get(f"{SLICES}?{PINNED}&watch=true") as watch:
            assert watch.status == 200
            policy_file.write_text(policy_text(slice_verbs="get, create"))
            await gk.server.reloader.reload()
            async with session.get(f"{SLICES}?{PINNED}") as refused:
                assert refused.status == 403
                assert "list" in (await refused.json())["message"]
            # The watch opened under the old policy goes on: it sees a slice created now.
            apiserver.add(resource_slice(f"{NODE}-new", driver=GPU, node=NODE))
            line = await asyncio.wait_for(watch.content.readline(), 10)
            assert b'"ADDED"' in line and f"{NODE}-new".encode() in line
        assert metric_value(
            metrics_text(gk), "dra_gatekeeper_reloads_total", file="policy", result="ok"
        )


async def test_in_flight_write_completes_across_a_reload(
    apiserver: APIServer, pki: PKI, policy_file: Path
) -> None:
    policy = load_policy(str(policy_file))
    async with running_gatekeeper(apiserver, policy, pki, policy_path=str(policy_file)) as gk:
        started, release = asyncio.Event(), asyncio.Event()

        async def body() -> Any:  # the driver sends its body slowly
            started.set()
            await release.wait()
            yield json_bytes(resource_slice(f"{NODE}-slow", driver=GPU, node=NODE))

        async with gk.unix_session(GPU) as session:
            create = asyncio.ensure_future(
                session.post(SLICES, data=body(), headers={"Content-Type": "application/json"})
            )
            await started.wait()
            policy_file.write_text(policy_text(slice_verbs="get"))
            await gk.server.reloader.reload()
            release.set()
            response = await asyncio.wait_for(create, 10)
            # Decided when its body arrived: after the reload, under the stricter policy,
            # and answered (not dropped).
            assert response.status == 403
            response.release()


def json_bytes(obj: object) -> bytes:
    return json.dumps(obj).encode()


async def test_configmap_symlink_swap_is_picked_up(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    # A ConfigMap volume: policy.yaml -> ..data/policy.yaml, ..data -> ..<timestamp>/
    volume = tmp_path / "configmap"
    first = volume / "..2026_01"
    first.mkdir(parents=True)
    (first / "policy.yaml").write_text(policy_text())
    os.symlink("..2026_01", volume / "..data")
    os.symlink("..data/policy.yaml", volume / "policy.yaml")
    path = str(volume / "policy.yaml")
    async with running_gatekeeper(
        apiserver, load_policy(path), pki, policy_path=path, reload_interval=0.02
    ) as gk:
        assert await list_status(gk) == 200
        second = volume / "..2026_02"
        second.mkdir()
        (second / "policy.yaml").write_text(policy_text(slice_verbs="get"))
        os.symlink("..2026_02", volume / "..data_tmp")
        os.replace(volume / "..data_tmp", volume / "..data")

        async def reloaded() -> bool:
            return bool(
                metric_value(
                    metrics_text(gk), "dra_gatekeeper_reloads_total", file="policy", result="ok"
                )
            )

        await until(reloaded)
        assert await list_status(gk) == 403


async def test_a_change_to_an_included_file_is_picked_up(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    """The policy is every file it was read from: its includes are watched as it is."""
    base = tmp_path / "base.yaml"
    base.write_text(policy_text())
    root = tmp_path / "policy.yaml"
    root.write_text("apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ninclude: [base.yaml]\n")
    path = str(root)
    async with running_gatekeeper(
        apiserver, load_policy(path), pki, policy_path=path, reload_interval=0.02
    ) as gk:
        assert await list_status(gk) == 200
        base.write_text(policy_text(slice_verbs="get"))

        async def reloaded() -> bool:
            return await list_status(gk) == 403

        await until(reloaded)
        assert gk.server.engine.policy.files == (path, str(base))


async def test_an_include_named_before_it_exists_is_picked_up_when_it_appears(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    (tmp_path / "base.yaml").write_text(policy_text())
    root = tmp_path / "policy.yaml"
    head = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\n"
    root.write_text(head + "include: [base.yaml]\n")
    path = str(root)
    async with running_gatekeeper(
        apiserver, load_policy(path), pki, policy_path=path, reload_interval=0.02
    ) as gk:
        root.write_text(head + "include: [base.yaml, nic.yaml]\n")

        async def refused() -> bool:
            text = metrics_text(gk)
            return bool(
                metric_value(text, "dra_gatekeeper_reloads_total", file="policy", result="error")
            )

        await until(refused)
        assert gk.server.engine.policy.drivers == {GPU}
        (tmp_path / "nic.yaml").write_text(head + f"drivers: [{NIC}]\n")

        async def reloaded() -> bool:
            return gk.server.engine.policy.drivers == {GPU, NIC}

        await until(reloaded)


async def test_sighup_reloads(policy: Policy) -> None:
    reloaded = asyncio.Event()
    started = asyncio.Event()

    async def start() -> None:
        started.set()

    async def reload() -> None:
        reloaded.set()
        os.kill(os.getpid(), signal.SIGTERM)

    async def stop() -> None:
        return None

    async def send_hup() -> None:
        await started.wait()
        os.kill(os.getpid(), signal.SIGHUP)

    sender = asyncio.ensure_future(send_hup())
    await asyncio.wait_for(run_until_signal(start, stop, reload), 10)
    await sender
    assert reloaded.is_set()


async def test_token_file_change_is_used_for_the_next_request(
    policy: Policy, pki: PKI, tmp_path: Path
) -> None:
    upstream = APIServer(served_kinds(policy), token="new-token")
    await upstream.start()
    token = tmp_path / "token"
    token.write_text("old-token\n")
    config = serve_config(
        upstream,
        policy,
        pki,
        tmp_path / "sockets",
        upstream=UpstreamConfig(server=upstream.url, token_file=str(token)),
    )
    server = GatekeeperServer(config)
    await server.start()
    running = Running(server, tmp_path / "sockets", pki)
    try:
        assert await list_status(running) == 401
        rotated = tmp_path / "token.new"
        rotated.write_text("new-token\n")
        os.replace(rotated, token)  # as the kubelet rotates a projected token: a new file
        await server.reloader.reload(force=False)
        assert await list_status(running) == 200
        text = metrics_text(running)
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="token", result="ok") == 1
    finally:
        await server.stop()
        await upstream.close()


def _write_pair(directory: Path, stem: str, cert: bytes, key: bytes) -> None:
    write_pem(directory / f"{stem}.crt", cert)
    write_pem(directory / f"{stem}.key", key, private=True)


async def _tls_status(running: Running, directory: Path, stem: str, ca: str) -> int | str:
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(directory / f"{stem}.crt", directory / f"{stem}.key")
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", running.server.tls_port, ssl=context
        )
        writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    except (ssl.SSLError, ConnectionError) as exc:
        return type(exc).__name__
    return int(answer.split(b" ", 2)[1]) if answer else "closed"


async def test_serving_cert_and_client_ca_reload(
    apiserver: APIServer,
    policy: Policy,
    pki: PKI,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = tmp_path / "tls"
    files.mkdir()
    old_ca, new_ca = create_ca("old-ca"), create_ca("new-ca")
    for stem, ca in (("old", old_ca), ("new", new_ca)):
        write_pem(files / f"{stem}-ca.crt", ca.cert_pem)
        server_cert = issue_server_cert(ca)
        _write_pair(files, f"{stem}-server", server_cert.cert_pem, server_cert.key_pem)
        client = issue_client_cert(ca, GPU)
        _write_pair(files, f"{stem}-client", client.cert_pem, client.key_pem)
    live = TLSFiles(str(files / "server.crt"), str(files / "server.key"), str(files / "ca.crt"))
    for suffix in ("crt", "key"):
        (files / f"server.{suffix}").write_bytes((files / f"old-server.{suffix}").read_bytes())
    (files / "ca.crt").write_bytes((files / "old-ca.crt").read_bytes())
    from gatekeeper.listen.tls import ServerTLS

    async with running_gatekeeper(
        apiserver, policy, pki, listen_tls=ServerTLS.load(live)
    ) as running:
        old_ca_file, new_ca_file = str(files / "old-ca.crt"), str(files / "new-ca.crt")
        assert await _tls_status(running, files, "old-client", old_ca_file) == 200
        assert await _tls_status(running, files, "new-client", new_ca_file) != 200
        for name in ("server.crt", "server.key", "ca.crt"):
            source = files / ("new-" + name)
            (files / f"{name}.tmp").write_bytes(source.read_bytes())
            os.replace(files / f"{name}.tmp", files / name)
        await running.server.reloader.reload(force=False)
        # New connections: the new serving certificate (verified by the new CA) and client CA.
        assert await _tls_status(running, files, "new-client", new_ca_file) == 200
        assert await _tls_status(running, files, "old-client", old_ca_file) != 200
        text = metrics_text(running)
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="tls", result="ok") == 1
        # SIGHUP (a forced reload) with the files as they are: no TLS reload to log or count.
        with caplog.at_level(logging.INFO, logger="gatekeeper"):
            await running.server.reloader.reload()
        assert "file=tls" not in caplog.text
        text = metrics_text(running)
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="tls", result="ok") == 1
        # A broken file is refused; the current files keep serving.
        (files / "ca.crt").write_text("garbage")
        await running.server.reloader.reload(force=False)
        assert await _tls_status(running, files, "new-client", new_ca_file) == 200
        text = metrics_text(running)
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="tls", result="error") == 1


async def test_certificate_close_to_expiry_is_logged_and_exported(
    apiserver: APIServer, policy: Policy, pki: PKI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gatekeeper.reload")
    short = issue_server_cert(pki.ca, days=2)
    _write_pair(tmp_path, "short", short.cert_pem, short.key_pem)
    from gatekeeper.listen.tls import ServerTLS

    tls = ServerTLS.load(
        TLSFiles(str(tmp_path / "short.crt"), str(tmp_path / "short.key"), pki.path("ca.crt"))
    )
    async with running_gatekeeper(
        apiserver, policy, pki, listen_tls=tls, cert_expiry_warning=7 * 86400.0
    ) as running:
        text = metrics_text(running)
    assert metric_value(text, "dra_gatekeeper_certificate_expiring", certificate="serving") == 1
    assert metric_value(text, "dra_gatekeeper_certificate_expiring", certificate="client-ca") == 0
    left = metric_value(text, "dra_gatekeeper_certificate_expiry_seconds", certificate="serving")
    assert 86400 < left <= 2 * 86400
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert warnings[0].startswith("certificate expires soon certificate=serving")


async def test_reload_adds_and_removes_driver_sockets(
    apiserver: APIServer, pki: PKI, policy_file: Path
) -> None:
    async with running_gatekeeper(
        apiserver, load_policy(str(policy_file)), pki, policy_path=str(policy_file)
    ) as gk:
        gpu, nic = gk.socket_path(GPU), gk.socket_path(NIC)
        assert gpu.exists() and not nic.exists()
        policy_file.write_text(policy_text().replace(f"drivers: [{GPU}]", f"drivers: [{NIC}]"))
        await gk.server.reloader.reload()
        assert nic.exists() and not gpu.exists()
        async with gk.unix_session(NIC) as session, session.get("/version") as response:
            assert response.status == 200
        with pytest.raises(aiohttp.ClientConnectorError):
            async with gk.unix_session(GPU) as session, session.get("/version"):
                pass
