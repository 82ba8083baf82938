"""No patch costs the gatekeeper more than it costs the apiserver (issue 39, item 0): the 2 KB
JSON patch whose copies double the document at each step, sent to a real ``serve`` process, is
refused at the apiserver's own copy limit before anything is asked upstream, and the process's
peak resident memory stays where it was (/proc, not a clock: the timings are in bench/)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from bench.patch_bench import doubling
from gatekeeper.apiserver import APIServer
from gatekeeper.policy.jsonpatches import MAX_COPY_BYTES
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    SERVE,
    free_port,
    seed,
    token_kubeconfig,
    wait_ready,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{NIC}"
JSON_PATCH = "application/json-patch+json"


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


async def test_thirty_doubling_copies_are_refused_and_memory_stays_flat(
    apiserver: APIServer, tmp_path: Path
) -> None:
    seed(apiserver, name="node-a-gpus")
    seed(apiserver, name="node-a-nics", driver=NIC, pool="node-a/nics")
    sockets, health = tmp_path / "s", free_port()
    process = await asyncio.create_subprocess_exec(
        *SERVE,
        *("--node-name", NODE, "--driver", GPU, "--driver", NIC, "--socket-dir", str(sockets)),
        *("--kubeconfig", token_kubeconfig(tmp_path / "kc", apiserver.url)),
        *("--health-listen", f"127.0.0.1:{health}", "--audit-log", str(tmp_path / "audit.log")),
    )
    try:
        await wait_ready(health)
        gpu = aiohttp.UnixConnector(path=str(sockets / GPU / "api.sock"))
        nic = aiohttp.UnixConnector(path=str(sockets / NIC / "api.sock"))
        async with (
            aiohttp.ClientSession("http://localhost", connector=gpu) as driver,
            aiohttp.ClientSession("http://localhost", connector=nic) as other,
        ):
            # Warm: the process has served a patch and a read before it is measured.
            small = await driver.patch(
                f"{SLICES}/node-a-gpus", data=json.dumps(doubling(2), separators=(",", ":")),
                headers={"Content-Type": JSON_PATCH},
            )  # fmt: skip
            assert small.status == 200, await small.text()
            assert (await other.get(f"{SLICES}?{PINNED}")).status == 200
            before = peak_rss_kib(process.pid)
            sent = len(apiserver.journal)
            body = json.dumps(doubling(30), separators=(",", ":"))
            assert len(body) < 2_100  # 2 KB
            answer = await driver.patch(
                f"{SLICES}/node-a-gpus", data=body, headers={"Content-Type": JSON_PATCH}
            )
            status = await answer.json()
            # Another driver is served meanwhile and after: the node's gatekeeper stays up.
            assert (await other.get(f"{SLICES}?{PINNED}")).status == 200
            after = peak_rss_kib(process.pid)
    finally:
        process.terminate()
        await process.wait()
    assert answer.status == 422, status
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert (
        "Unable to complete the copy, the accumulated size increase of copy is"
        in (status["message"])
    )
    assert f"exceeding the limit {MAX_COPY_BYTES}" in status["message"]
    # Nothing of it went upstream, not even a dry run: only the other driver's list.
    patched = [e for e in apiserver.journal[sent:] if e.method == "PATCH"]
    assert patched == []
    # 2**30 KiB before: the bound keeps the document within the apiserver's 3 MiB of copies.
    assert after - before < 16 * 1024, (before, after)
