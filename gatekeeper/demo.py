"""`dra-gatekeeper demo`: the embedded API server and a gatekeeper in front of it, ready to try."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
from pathlib import Path

import yaml

from gatekeeper.audit import JsonLinesWriter
from gatekeeper.certs import create_ca, issue_client_cert, issue_server_cert, write_pem
from gatekeeper.cli import run_until_signal
from gatekeeper.config import server_ssl_context
from gatekeeper.kubeconfig import UpstreamConfig
from gatekeeper.policy import load_policy
from gatekeeper.server import GatekeeperServer, socket_path
from gatekeeper.testing import APIServer, resource_slice, served_kinds
from gatekeeper.upstream import UpstreamSession

__all__ = ["DEMO_DRIVER", "DEMO_NODE", "run_demo"]

DEMO_NODE = "demo-node"
DEMO_DRIVER = "gpu.example.com"


def run_demo() -> int:
    asyncio.run(_demo())
    return 0


async def _demo() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="dra-gatekeeper-demo-"))
    policy = load_policy(None).with_drivers(frozenset({DEMO_DRIVER}))
    token = secrets.token_urlsafe(24)
    api = APIServer(served_kinds(policy), token=token)
    _seed(api)
    ca = create_ca("dra-gatekeeper-demo-ca")
    files = _write_pki(workdir, ca)
    upstream = UpstreamSession(UpstreamConfig(server="http://127.0.0.1:1", token=token))
    server = GatekeeperServer(
        policy=policy,
        node_name=DEMO_NODE,
        upstream=upstream,
        audit=JsonLinesWriter(str(workdir / "audit.log")),
        socket_dir=workdir / "sockets",
        listen=("127.0.0.1", 0),
        listen_ssl=server_ssl_context(files["server.crt"], files["server.key"], files["ca.crt"]),
    )

    async def start() -> None:
        url = await api.start()
        upstream.config = UpstreamConfig(server=url, token=token)
        await server.start()
        kubeconfig = _write_kubeconfig(workdir, server.tls_port or 0, files)
        _print_instructions(workdir, kubeconfig)

    async def stop() -> None:
        await server.stop()
        await api.close()
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"demo stopped; removed {workdir}", flush=True)

    await run_until_signal(start, stop)


def _seed(api: APIServer) -> None:
    for name, driver, node in (
        ("demo-node-gpu.example.com-0", DEMO_DRIVER, DEMO_NODE),
        ("demo-node-nic.example.com-0", "nic.example.com", DEMO_NODE),
        ("other-node-gpu.example.com-0", DEMO_DRIVER, "other-node"),
    ):
        api.add(resource_slice(name, driver=driver, node=node))


def _write_pki(workdir: Path, ca) -> dict[str, str]:  # type: ignore[no-untyped-def]
    server = issue_server_cert(ca)
    client = issue_client_cert(ca, DEMO_DRIVER)
    pems = {
        "ca.crt": (ca.cert_pem, False),
        "server.crt": (server.cert_pem, False),
        "server.key": (server.key_pem, True),
        f"{DEMO_DRIVER}.crt": (client.cert_pem, False),
        f"{DEMO_DRIVER}.key": (client.key_pem, True),
    }
    for name, (data, private) in pems.items():
        write_pem(workdir / name, data, private=private)
    return {name: str(workdir / name) for name in pems}


def _write_kubeconfig(workdir: Path, port: int, files: dict[str, str]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gatekeeper",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority": files["ca.crt"],
                },
            }
        ],
        "users": [
            {
                "name": DEMO_DRIVER,
                "user": {
                    "client-certificate": files[f"{DEMO_DRIVER}.crt"],
                    "client-key": files[f"{DEMO_DRIVER}.key"],
                },
            }
        ],
        "contexts": [{"name": "demo", "context": {"cluster": "gatekeeper", "user": DEMO_DRIVER}}],
        "current-context": "demo",
    }
    path = workdir / f"{DEMO_DRIVER}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _print_instructions(workdir: Path, kubeconfig: Path) -> None:
    sock = socket_path(workdir / "sockets", DEMO_DRIVER)
    selector = f"spec.nodeName={DEMO_NODE},spec.driver={DEMO_DRIVER}"
    print(
        f"""
dra-gatekeeper demo is running: node "{DEMO_NODE}", driver "{DEMO_DRIVER}".
An embedded API server is the upstream; the gatekeeper listens on mTLS and on a Unix socket.

KUBECONFIG={kubeconfig}

Try, in another shell:
  export KUBECONFIG={kubeconfig}
  kubectl get resourceslices --field-selector {selector}     # allowed: the driver's own slices
  kubectl get resourceslices                                  # refused: cluster-wide list
  kubectl get secrets                                         # refused: not a DRA kind
  curl --unix-socket {sock} \\
    'http://localhost/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}'
  tail -f {workdir / "audit.log"}                             # one audit event per request

Ctrl-C stops everything and removes {workdir}.
READY""",
        flush=True,
    )
