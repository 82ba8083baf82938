"""The processes of the real tier besides the cluster: ``dra-gatekeeper serve`` in front of the
real apiserver, with the node-bound credentials of its own service account, and the Go DRA
driver, driven line by line over its stdin and stdout."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.testing.harness import PKI
from tests.realcluster.cluster import Api, RealCluster, free_port, poll, remove_workdir

__all__ = [
    "DriverProcess",
    "GatekeeperProcess",
    "assert_refusals_never_reached",
    "in_cluster_env",
    "in_pod",
    "service_account_volume",
    "terminate",
]


@dataclass
class GatekeeperProcess:
    """``dra-gatekeeper serve --node-name node-a`` in front of the real apiserver."""

    cluster: RealCluster
    policy: Path
    drivers: tuple[str, ...]
    token_file: Path
    node: str = "node-a"
    extra_args: tuple[str, ...] = ()
    listen_token: bool = False
    """Also the token listener (drivers' service-account tokens, TokenReview)."""
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gk-serve-")))
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.pki = PKI.create(self.workdir)
        self.socket_dir = self.workdir / "sockets"
        self.audit_log = self.workdir / "audit.log"
        self.tls_port = free_port()
        self.token_port = free_port()
        self.health_port = free_port()
        self.kubeconfig = self.cluster.kubeconfig(
            self.workdir / "upstream.kubeconfig", token_file=self.token_file
        )

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"

    def start(self) -> GatekeeperProcess:
        args = [
            sys.executable, "-m", "gatekeeper", "serve",
            "--node-name", self.node,
            "--policy", str(self.policy),
            "--kubeconfig", str(self.kubeconfig),
            "--socket-dir", str(self.socket_dir),
            "--listen", f"127.0.0.1:{self.tls_port}",
            "--tls-cert-file", self.pki.path("server.crt"),
            "--tls-key-file", self.pki.path("server.key"),
            "--client-ca-file", self.pki.path("ca.crt"),
            "--audit-log", str(self.audit_log),
            "--audit-level", "RequestResponse",
            "--health-listen", f"127.0.0.1:{self.health_port}",
            *[arg for driver in self.drivers for arg in ("--driver", driver)],
            *(("--listen-token", f"127.0.0.1:{self.token_port}") if self.listen_token else ()),
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.workdir / "serve.log", "wb")  # noqa: SIM115 - lives as long as it
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        poll("dra-gatekeeper serve /readyz", self._ready, timeout=60)
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"serve exited {self.process.returncode}: {self.log_tail()}")
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "serve.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)
        remove_workdir(self.workdir)

    # --- how drivers reach it -------------------------------------------------------------------

    def socket(self, driver: str) -> str:
        return str(self.socket_dir / driver / "api.sock")

    def driver_kubeconfig(self, driver: str, directory: Path) -> Path:
        """A kubeconfig for ``driver``: the mTLS listener and the driver's client certificate."""
        cert, key = self.pki.client_files(driver)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gk",
                    "cluster": {
                        "server": self.tls_url,
                        "certificate-authority": self.pki.path("ca.crt"),
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

    def driver_api(self, driver: str) -> Api:
        """A JSON client of the gatekeeper as ``driver`` (mTLS)."""
        api = Api(self.tls_url, Path(self.pki.path("ca.crt")))
        api.context.load_cert_chain(*self.pki.client_files(driver))
        return api

    # --- its audit log --------------------------------------------------------------------------

    def audit_events(self, stage: str = "ResponseComplete") -> list[dict[str, Any]]:
        """Its audit events of ``stage`` (a watch has ResponseStarted at once, and
        ResponseComplete only when it ends)."""
        if not self.audit_log.exists():
            return []
        events = []
        for line in self.audit_log.read_text().splitlines():
            if line.strip():
                event = json.loads(line)
                if event.get("stage") == stage:
                    events.append(event)
        return events

    def audit_mark(self) -> int:
        return len(self.audit_events())

    def settle(self) -> None:
        """Wait until every request answered so far is in the audit log. The gatekeeper writes
        an event just after it sends the answer, so a client can see the answer first; a last
        request of our own, sent after those answers, is logged after them."""
        api = self.driver_api(self.drivers[0])
        request = urllib.request.Request(f"{api.url}/version", headers={"User-Agent": "settle"})
        try:
            with urllib.request.urlopen(request, context=api.context, timeout=30) as answer:
                audit_id = answer.headers["Audit-Id"]
        except urllib.error.HTTPError as error:  # any answer is logged, a refusal too
            audit_id = error.headers["Audit-Id"]
        poll(
            "the gatekeeper's audit log to catch up",
            lambda: any(e["auditID"] == audit_id for e in self.audit_events()),
            timeout=10,
        )


def terminate(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, as a kubelet stops a container, and a wait for it to end (SIGKILL after
    ``timeout`` seconds)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def assert_refusals_never_reached(
    cluster: RealCluster, gatekeeper: GatekeeperProcess, since: int = 0
) -> tuple[int, int]:
    """The apiserver's own audit log holds no request the gatekeeper refused (matched by the
    Audit-ID the gatekeeper forwards with a request), and holds every request the gatekeeper
    forwarded and the apiserver answered (so the check is not vacuous).

    Returns the (refused, forwarded) counts of the gatekeeper's events after ``since``.
    """
    gatekeeper.settle()
    events = gatekeeper.audit_events()[since:]
    refused = {
        e["auditID"]: e
        for e in events
        if e["annotations"].get("authorization.k8s.io/decision") == "forbid"
    }
    forwarded = {
        e["annotations"]["dra-gatekeeper.io/upstream-audit-id"]
        for e in events
        if "dra-gatekeeper.io/upstream-audit-id" in e["annotations"]
    }
    seen = poll(
        "the apiserver's audit log to hold every forwarded request",
        lambda: (ids := cluster.audit_ids()) >= forwarded and ids,
        timeout=10,
    )
    reached = sorted(set(refused) & seen)
    assert not reached, [
        (refused[i]["verb"], refused[i]["requestURI"], refused[i]["annotations"]) for i in reached
    ]
    return len(refused), len(forwarded)


class DriverProcess:
    """The Go driver (``cmd/dradriver``): one JSON command in, one JSON answer out."""

    def __init__(
        self,
        binary: str,
        connect: str,
        *,
        driver: str = "gpu.example.com",
        node: str = "node-a",
        content_type: str = "",
        env: dict[str, str] | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        self.plugin_dir = tempfile.mkdtemp(prefix="gk-dradriver-")
        args = [
            *(wrap or []),
            binary,
            f"--connect={connect}",
            f"--driver={driver}",
            f"--node={node}",
            f"--plugin-dir={self.plugin_dir}",
        ]
        if content_type:
            args.append(f"--content-type={content_type}")
        self.stderr = open(Path(self.plugin_dir) / "stderr.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env={**os.environ, **(env or {})},
        )
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = poll("the driver to start", lambda: self.event("ready") or self.event("fatal"))
        if ready.get("event") == "fatal":
            raise RuntimeError(f"driver failed to start: {ready}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "op" in message:
                self.answers.put(message)
            else:
                with self._lock:
                    self.events.append(message)

    def event(self, name: str, **match: Any) -> dict[str, Any] | None:
        """The first background event called ``name`` whose fields include ``match``."""
        with self._lock:
            for event in self.events:
                if event.get("event") == name and all(event.get(k) == v for k, v in match.items()):
                    return event
        return None

    def events_of(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == name]

    def __call__(self, op: str, timeout: float = 90, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.process.stdin.flush()
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"driver did not answer {op} within {timeout} s") from None
        assert answer["op"] == op, answer
        return answer

    def stderr_tail(self, lines: int = 40) -> str:
        self.stderr.flush()
        text = (Path(self.plugin_dir) / "stderr.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(AssertionError, BrokenPipeError, OSError):
                self("exit", timeout=10)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()
        remove_workdir(Path(self.plugin_dir))

    def __enter__(self) -> DriverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_IN_POD = (
    # A private mount namespace in which the service-account volume is where in-cluster
    # clients read it (/var/run is /run): the client's code and paths stay unchanged.
    "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && "
    'mount --bind "$0" /run/secrets/kubernetes.io/serviceaccount && exec "$@"'
)


def service_account_volume(directory: Path, token: str, ca_file: str, namespace: str) -> Path:
    """What a pod's projected service-account volume holds: token, ca.crt, namespace."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(Path(ca_file).read_bytes())
    (directory / "namespace").write_text(namespace)
    return directory


def in_pod(volume: Path) -> list[str]:
    """The prefix that runs a command as in a pod whose service-account volume is ``volume``
    (needs root for the mount namespace, as CI has)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_POD, str(volume)]


def in_cluster_env(gatekeeper: GatekeeperProcess) -> dict[str, str]:
    """The environment a driver pod gets to reach the gatekeeper's token listener in-cluster."""
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(gatekeeper.token_port),
    }
