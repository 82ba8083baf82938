"""`dra-gatekeeper demo`: the embedded API server and a gatekeeper in front of it, ready to try.

``--upstream-only`` runs the embedded API server alone (with a kubeconfig for it), for trying
``dra-gatekeeper serve`` by hand. Every ``--change-every`` seconds (10) until stopped, the demo
publishes or removes one more ResourceSlice of the demo driver through the gatekeeper, on the
driver's Unix socket as the driver would: the printed ``kubectl … -w`` shows a change whenever
it was started, and the audit log records each write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import ssl
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gatekeeper.apiserver import TOKEN_KINDS, APIServer, resource_slice
from gatekeeper.audit import AuditLevel
from gatekeeper.cli.certs import (
    IssuedCert,
    create_ca,
    issue_client_cert,
    issue_server_cert,
    write_pem,
)
from gatekeeper.cli.served import served_kinds
from gatekeeper.errors import ConfigError
from gatekeeper.listen.listeners import too_long_for_a_socket
from gatekeeper.policy import Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.server.config import (
    AuditSettings,
    ServeConfig,
    server_ssl_context,
    token_ssl_context,
)
from gatekeeper.server.server import GatekeeperServer, run_until_signal, socket_path
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.usage import UsageParser

__all__ = ["CHANGE_EVERY_SECONDS", "DEMO_DRIVER", "DEMO_NODE", "command_name", "run_demo_command"]

DEMO_NODE = "demo-node"
DEMO_DRIVER = "gpu.example.com"
CHANGE_EVERY_SECONDS = 10.0
"""How often the demo adds or removes its extra slice (what the printed watch shows)."""
_PROG = "dra-gatekeeper demo"
_SELECTOR = f"spec.nodeName={DEMO_NODE},spec.driver={DEMO_DRIVER}"
_DEMO_SA = {"name": "gpu-driver", "namespace": "gpu-system"}
"""The demo driver's ServiceAccount, mapped to it in the demo's policy (the token listener)."""
_DEMO_POD = f"gpu-driver-{DEMO_NODE}"
_DEMO_AGENT = {"User-Agent": "dra-gatekeeper-demo (the demo driver's periodic change)"}


class _Parser(UsageParser):
    command = _PROG


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_PROG, description="An embedded API server and a gatekeeper to try.")
    parser.add_argument(
        "--dir",
        type=Path,
        help="write certificates, kubeconfig, sockets and audit log here (kept on exit; "
        "default: a temporary directory, removed on exit, and the audit log beside it, kept)",
    )
    parser.add_argument(
        "--audit-level",
        choices=[level.value for level in AuditLevel],
        default=AuditLevel.REQUEST_RESPONSE.value,
        help="what the audit log records of each request (default: RequestResponse, so that "
        "`dra-gatekeeper audit check` can re-decide writes on their bodies and objects)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="loopback port of the mTLS listener (with --upstream-only: of the API server); "
        "default: any free port",
    )
    parser.add_argument(
        "--change-every",
        type=float,
        default=CHANGE_EVERY_SECONDS,
        metavar="SECONDS",
        help="add or remove a ResourceSlice this often, so a watch shows changes "
        f"(default: {CHANGE_EVERY_SECONDS:g}; 0: never)",
    )
    parser.add_argument(
        "--upstream-only",
        action="store_true",
        help="run only the embedded API server, to try `dra-gatekeeper serve` against it",
    )
    return parser


def run_demo_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper demo ARGS`` until Ctrl-C or SIGTERM."""
    try:
        ns = _parser().parse_args(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    if not 0 <= ns.port <= 65535:
        print(f"{_PROG}: --port {ns.port} is not a port", file=sys.stderr)
        return 2
    if ns.change_every < 0:
        print(f"{_PROG}: --change-every {ns.change_every:g} is negative", file=sys.stderr)
        return 2
    keep = ns.dir is not None
    # Absolute: the kubeconfig names its certificate files, and a relative path there is read
    # relative to the kubeconfig's own directory, not to where the demo was started.
    workdir: Path = (ns.dir or Path(tempfile.mkdtemp(prefix="dra-gatekeeper-demo-"))).absolute()
    # The audit log outlives a temporary directory: it is what `audit` reads afterwards.
    audit = workdir / "audit.log" if keep else Path(f"{workdir}-audit.log")
    settings = AuditSettings(path=str(audit), level=AuditLevel(ns.audit_level))
    try:
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Refused here, in one line: the gatekeeper alone would skip the driver's socket.
        if too_long := too_long_for_a_socket(socket_path(workdir / "sockets", DEMO_DRIVER)):
            raise ConfigError(f"--dir {workdir}: {too_long}")
        asyncio.run(
            _upstream_only(workdir, ns.port)
            if ns.upstream_only
            else _demo(workdir, ns.port, settings, keep=keep, every=ns.change_every)
        )
    except ConfigError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{_PROG}: {exc.filename or workdir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    kept = "" if keep or ns.upstream_only else f"; the audit log is kept: {audit}"
    print(f"demo stopped; {'kept' if keep else 'removed'} {workdir}{kept}", flush=True)
    return 0


def _embedded_api(policy: Policy) -> APIServer:
    api = APIServer((*served_kinds(policy), *TOKEN_KINDS), token=secrets.token_urlsafe(24))
    # The driver's ServiceAccount and its pod on this node: a TokenRequest bound to that pod
    # gives the token a driver reads from its service-account volume.
    api.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": DEMO_NODE}})
    api.add({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _DEMO_SA})
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": _DEMO_POD, "namespace": _DEMO_SA["namespace"]},
            "spec": {"nodeName": DEMO_NODE, "serviceAccountName": _DEMO_SA["name"]},
        }
    )
    for name, driver, node in (
        ("demo-node-gpu.example.com-0", DEMO_DRIVER, DEMO_NODE),
        ("demo-node-nic.example.com-0", "nic.example.com", DEMO_NODE),
        ("other-node-gpu.example.com-0", DEMO_DRIVER, "other-node"),
    ):
        api.add(resource_slice(name, driver=driver, node=node))
    return api


async def _change_periodically(api: APIServer, sock: Path, every: float) -> None:
    """Publish, then remove, then publish again… one slice, until cancelled: through the
    gatekeeper, on the demo driver's socket (its writes are decided and audited)."""
    name = f"{DEMO_NODE}-{DEMO_DRIVER}-1"
    slices = "http://localhost/apis/resource.k8s.io/v1/resourceslices"
    connector = aiohttp.UnixConnector(path=str(sock))
    async with aiohttp.ClientSession(connector=connector, headers=_DEMO_AGENT) as driver:
        while True:
            await asyncio.sleep(every)
            if api.get("resource.k8s.io", "resourceslices", name) is None:
                body = json.dumps(resource_slice(name, driver=DEMO_DRIVER, node=DEMO_NODE))
                sent = driver.post(slices, data=body, headers={"Content-Type": "application/json"})
                done = "published ResourceSlice {} (a watch shows ADDED)"
            else:
                sent = driver.delete(f"{slices}/{name}")
                done = "removed ResourceSlice {} (a watch shows DELETED)"
            try:
                async with sent as answer:
                    text = await answer.text()
                    ok = answer.status < 300
            except aiohttp.ClientError as exc:
                ok, text = False, str(exc)
            if ok:
                print(f"demo: {done.format(name)} through the gatekeeper", flush=True)
            else:
                print(f"demo: the gatekeeper answered the demo's change: {text}", flush=True)


def command_name() -> str:
    """How to run this dra-gatekeeper again, as printed for the user to type: the bare name
    only when the PATH finds this same program, else its path (relative to the current
    directory when inside it), or the interpreter with ``-m gatekeeper``."""
    program = sys.argv[0]
    if Path(program).name != "dra-gatekeeper" or not Path(program).exists():
        return f"{_shown(sys.executable)} -m gatekeeper"
    on_path = shutil.which("dra-gatekeeper")
    if on_path is not None and os.path.samefile(on_path, program):
        return "dra-gatekeeper"
    return _shown(program)


def _shown(path: str) -> str:
    # abspath, not Path.absolute(): ``../../elsewhere`` must not pass for a path inside the
    # current directory.
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


async def _demo(
    workdir: Path, port: int, audit: AuditSettings, *, keep: bool, every: float
) -> None:
    policy = load_policy(None).with_drivers(frozenset({DEMO_DRIVER}))
    account = f"system:serviceaccount:{_DEMO_SA['namespace']}:{_DEMO_SA['name']}"
    policy = replace(policy, service_accounts={account: DEMO_DRIVER})
    api = _embedded_api(policy)
    files = _write_pki(workdir, create_ca("dra-gatekeeper-demo-ca"))
    url = await api.start()
    tasks: list[asyncio.Task[None]] = []
    try:
        server = GatekeeperServer(_demo_config(workdir, port, policy, api, url, files, audit))

        async def start() -> None:
            await server.start()
            _print_how_to_connect(workdir, server, api, files, audit, keep=keep, every=every)
            if every > 0:
                sock = socket_path(workdir / "sockets", DEMO_DRIVER)
                tasks.append(asyncio.ensure_future(_change_periodically(api, sock, every)))

        await run_until_signal(start, server.stop, server.reloader.reload)
    finally:
        for task in tasks:
            task.cancel()
        await api.close()


def _demo_config(
    workdir: Path,
    port: int,
    policy: Policy,
    api: APIServer,
    url: str,
    files: dict[str, str],
    audit: AuditSettings,
) -> ServeConfig:
    """The demo's gatekeeper: every listener, in front of the embedded API server."""
    return ServeConfig(
        node_name=DEMO_NODE,
        policy=policy,
        upstream=UpstreamConfig(server=url, token=api.token),
        socket_dir=workdir / "sockets",
        listen=("127.0.0.1", port),
        listen_flag="--port",
        listen_tls=server_ssl_context(files["server.crt"], files["server.key"], files["ca.crt"]),
        listen_token=("127.0.0.1", 0),
        token_tls=token_ssl_context(files["server.crt"], files["server.key"]),
        audit=audit,
        shutdown_grace=5.0,
    )


def _print_how_to_connect(
    workdir: Path,
    server: GatekeeperServer,
    api: APIServer,
    files: dict[str, str],
    audit: AuditSettings,
    *,
    keep: bool,
    every: float,
) -> None:
    """Write the drivers' kubeconfigs (certificate and token) and print how to use them."""
    kubeconfig = _write_kubeconfig(
        workdir / f"{DEMO_DRIVER}.kubeconfig",
        f"https://127.0.0.1:{server.tls_port}",
        {"certificate-authority": files["ca.crt"]},
        {
            "client-certificate": files[f"{DEMO_DRIVER}.crt"],
            "client-key": files[f"{DEMO_DRIVER}.key"],
        },
    )
    token = _write_service_account(workdir, api, files["ca.crt"])
    token_kubeconfig = _write_kubeconfig(
        workdir / "token.kubeconfig",
        f"https://127.0.0.1:{server.token_port}",
        {"certificate-authority": files["ca.crt"]},
        {"tokenFile": str(token)},
    )
    _print_instructions(workdir, kubeconfig, audit, keep=keep, every=every)
    _print_token_instructions(workdir, token_kubeconfig, server.token_port)


async def _upstream_only(workdir: Path, port: int) -> None:
    policy = load_policy(None).with_drivers(frozenset({DEMO_DRIVER}))
    api = _embedded_api(policy)

    files = _write_pki(workdir, create_ca("dra-gatekeeper-demo-ca"))
    # TLS, as a kube-apiserver: kubectl sends a bearer token only over https.
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(files["server.crt"], files["server.key"])

    async def start() -> None:
        try:
            url = await api.start(port=port, ssl_context=tls)
        except OSError as exc:
            raise ConfigError(
                f"--port {port}: cannot listen on 127.0.0.1:{port}: "
                f"{os.strerror(exc.errno) if exc.errno else exc}"
            ) from None
        kubeconfig = _write_kubeconfig(
            workdir / "upstream.kubeconfig",
            url,
            {"certificate-authority": files["ca.crt"]},
            {"token": api.token},
        )
        print(
            f"""
The embedded API server is running at {url} (resource.k8s.io, devmgmtproto.k8s.io).
A kubeconfig with its token (the node's credentials, for the gatekeeper):

KUBECONFIG={kubeconfig}

Try the gatekeeper in front of it, in another shell:
  {command_name()} serve --node-name {DEMO_NODE} --driver {DEMO_DRIVER} \\
    --kubeconfig {kubeconfig} --socket-dir {workdir / "sockets"} \\
    --health-listen 127.0.0.1:8081 --audit-log -
  curl --unix-socket {socket_path(workdir / "sockets", DEMO_DRIVER)} \\
    'http://localhost/apis/resource.k8s.io/v1/resourceslices?fieldSelector={_SELECTOR}'

Ctrl-C stops it.
READY""",
            flush=True,
        )

    await run_until_signal(start, api.close)


def _write_service_account(workdir: Path, api: APIServer, ca_file: str) -> Path:
    """What the driver pod's service-account volume would hold: a token bound to its pod on
    this node, the gatekeeper's CA, the namespace."""
    volume = workdir / "serviceaccount"
    volume.mkdir(exist_ok=True)
    token = api.tokens.mint(_DEMO_SA["namespace"], _DEMO_SA["name"], pod=_DEMO_POD)
    write_pem(volume / "token", token.encode(), private=True)
    write_pem(volume / "ca.crt", Path(ca_file).read_bytes())
    (volume / "namespace").write_text(_DEMO_SA["namespace"])
    return volume / "token"


def _print_token_instructions(workdir: Path, kubeconfig: Path, port: int | None) -> None:
    print(
        f"""
The driver's own ServiceAccount token works too (the token listener, 127.0.0.1:{port}): what
rest.InClusterConfig() reads is in {workdir / "serviceaccount"} (token, ca.crt, namespace),
with KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT={port}. The same as a kubeconfig:
  kubectl --kubeconfig {kubeconfig} get resourceslices --field-selector {_SELECTOR}
READY""",
        flush=True,
    )


def _write_pki(workdir: Path, ca: IssuedCert) -> dict[str, str]:
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


def _write_kubeconfig(
    path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any]
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "demo", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "demo", "user": user}],
        "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}],
        "current-context": "demo",
    }
    write_pem(path, yaml.safe_dump(config).encode(), private=True)
    return path


def _print_instructions(
    workdir: Path, kubeconfig: Path, audit: AuditSettings, *, keep: bool, every: float
) -> None:
    sock = socket_path(workdir / "sockets", DEMO_DRIVER)
    changes = (
        f"Every {every:g} s until stopped, the demo adds or removes the slice "
        f"{DEMO_NODE}-{DEMO_DRIVER}-1: a watch shows it.\n"
        "It writes through the gatekeeper, on the driver's socket: the audit log shows each.\n"
        if every > 0
        else ""
    )
    watching = f"# changes every {every:g} s" if every > 0 else "# the driver's slices, live"
    cleanup = "" if keep else f" and removes {workdir}"
    level = audit.level.value
    print(
        f"""
dra-gatekeeper demo is running: node "{DEMO_NODE}", driver "{DEMO_DRIVER}".
An embedded API server is the upstream; the gatekeeper listens on mTLS and on a Unix socket.

KUBECONFIG={kubeconfig}

Try, in another shell:
  export KUBECONFIG={kubeconfig}
  kubectl get resourceslices --field-selector {_SELECTOR}     # allowed: the driver's own slices
  kubectl get resourceslices --field-selector {_SELECTOR} -w  {watching}
  kubectl get resourceslices                                  # refused: cluster-wide list
  kubectl get secrets                                         # refused: not a DRA kind
  curl --unix-socket {sock} \\
    'http://localhost/apis/resource.k8s.io/v1/resourceslices?fieldSelector={_SELECTOR}'
  tail -f {audit.path}                             # one audit event per request
  {command_name()} audit summarize {audit.path}      # after a few requests
  {command_name()} audit check {audit.path}          # re-decided under the policy

The audit log records each request at level {level}, and is kept when the demo stops:
  {audit.path}

{changes}Ctrl-C stops everything{cleanup}.""",
        flush=True,
    )
