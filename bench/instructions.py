"""Instructions per request of ``dra-gatekeeper serve``, counted by valgrind (callgrind), not
timed: a measure a loaded machine does not move, to compare two policies (or two commits) when
CPU time per request varies with the load of other processes.

    python bench/instructions.py [--requests N] [--workload create|update] [--code DIR]
                                 POLICY [POLICY ...]

Each policy's ``serve`` runs under callgrind with counting off, behind the fixed-answer upstream
(:mod:`bench.upstream_app`); once it is ready, counting is switched on, N requests are sent
through the driver's Unix socket one at a time, counting is switched off: the instructions of
those N requests alone, divided by N. ``packaged:default`` names the packaged policy. ``--code
DIR`` runs the ``gatekeeper`` package of DIR (another commit's files: ``git archive REF | tar -x
-C DIR``), for a before and after counted alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

if __package__ in (None, ""):  # python bench/instructions.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fixtures import (
    DRIVER,
    NODE,
    SLICES,
    free_port,
    item_slice,
    make_pki,
    python_process,
    slice_body,
    stop_process,
    wait_ready,
    write_kubeconfig,
)

__all__ = ["count", "main"]


async def _send(socket: str, workload: str, requests: int) -> None:
    connector = aiohttp.UnixConnector(path=socket)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(base_url="http://localhost", connector=connector) as s:
        for n in range(requests):
            if workload == "create":
                body = json.dumps(slice_body(f"{NODE}-i-{n}")).encode()
                call = s.post(SLICES, data=body, headers=headers)
            else:
                body = json.dumps(item_slice()).encode()
                call = s.put(f"{SLICES}/{NODE}-bench", data=body, headers=headers)
            async with call as response:
                await response.read()
                assert response.status < 300, (response.status, await response.text())


def count(policy: str, workload: str, requests: int, code: str | None = None) -> int:
    """Instructions of ``requests`` requests through ``serve`` under ``policy`` (the package of
    ``code`` when given)."""
    work = Path(tempfile.mkdtemp(prefix="gk-instructions-"))
    pki = make_pki(work)
    upstream_port, health = free_port(), free_port()
    upstream = python_process(
        ["-m", "bench.upstream_app", "--port", str(upstream_port), "--cert", pki.server_cert,
         "--key", pki.server_key, "--workdir", str(work)],
        work / "upstream.log",
    )  # fmt: skip
    wait_ready(upstream, port=upstream_port, what="upstream")
    kubeconfig = write_kubeconfig(work / "kubeconfig", f"https://127.0.0.1:{upstream_port}", pki)
    out = work / "callgrind.out"
    serve = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, "-m", "gatekeeper", "serve", "--node-name", NODE, "--policy", policy,
         "--driver", DRIVER, "--socket-dir", str(work / "sockets"), "--kubeconfig",
         str(kubeconfig), "--health-listen", f"127.0.0.1:{health}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": code} if code else None, cwd=code,
    )  # fmt: skip
    socket = str(work / "sockets" / DRIVER / "api.sock")
    try:
        # Its health listener listens last, once every listener does.
        wait_ready(serve, port=health, timeout=900, what="serve under valgrind")
        asyncio.run(_send(socket, workload, 20))  # warm: first-request work aside
        subprocess.run(["callgrind_control", "-i", "on", str(serve.pid)], check=True,
                       capture_output=True)  # fmt: skip
        asyncio.run(_send(socket, workload, requests))
        subprocess.run(["callgrind_control", "-i", "off", str(serve.pid)], check=True,
                       capture_output=True)  # fmt: skip
    finally:
        serve.terminate()
        serve.wait(120)
        stop_process(upstream)
    total = 0
    for path in work.glob("callgrind.out*"):
        found = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
        total += int(found.group(1)) if found else 0
    if not total:
        raise RuntimeError(f"callgrind wrote no count in {work} (did serve exit cleanly?)")
    shutil.rmtree(work, ignore_errors=True)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workload", choices=("create", "update"), default="create")
    parser.add_argument("--code", help="a directory holding another gatekeeper/ package")
    args = parser.parse_args()
    for policy in args.policies:
        per = count(policy, args.workload, args.requests, args.code) / args.requests
        print(f"{policy}: {per:,.0f} instructions per {args.workload}", flush=True)


if __name__ == "__main__":
    main()
