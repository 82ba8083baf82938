"""A real kube-apiserver 1.36 with etcd 3.6 on loopback, set up as a node of a real cluster sees it.

``--authorization-mode=Node,RBAC``, ``NodeRestriction``, resource.k8s.io v1, v1beta2 and
v1beta1 (DeviceTaintRules too), a service-account issuer with its signing key, and an audit log
at RequestResponse for resource.k8s.io (Metadata for the rest): the apiserver's own journal,
which the tests read to prove that nothing the gatekeeper refused ever reached it.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.realcluster.build import Binaries
from tests.recorded import parse

__all__ = ["Api", "ApiError", "RealCluster", "free_port", "poll", "remove_workdir"]

T = TypeVar("T")

NODES = ("node-a", "node-b")

_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # The patch oracle's ten thousand dry runs (test_patch_oracle.py) are no journal.
        {"level": "None", "users": ["patch-oracle"]},
        {"level": "RequestResponse", "resources": [{"group": "resource.k8s.io"}]},
        {"level": "RequestResponse", "resources": [{"group": "devmgmtproto.k8s.io"}]},
        {
            "level": "RequestResponse",
            "resources": [{"group": "authentication.k8s.io", "resources": ["tokenreviews"]}],
        },
        {"level": "Metadata"},
    ],
}


def remove_workdir(path: Path) -> None:
    """Remove a process's files, unless ``DRA_GATEKEEPER_KEEP_REALCLUSTER`` is set (to read
    the logs of a failed run)."""
    if not os.environ.get("DRA_GATEKEEPER_KEEP_REALCLUSTER"):
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def poll(what: str, check: Callable[[], T | None], timeout: float = 60.0, every: float = 0.1) -> T:
    """Call ``check`` until it returns something other than None (or False); that value.

    Raises ``AssertionError`` naming ``what`` and the last exception after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except (OSError, ApiError, AssertionError, ValueError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {last!r}")
        time.sleep(every)


# --- PKI ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class _PKI:
    """The cluster's CA and the certificates issued from it (throwaway, per test session)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "realcluster-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca_file = _write(
            directory / "ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM)
        )

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
    ) -> _Pair:
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            import ipaddress

            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return _Pair(
            _write(self.directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(self.directory / f"{stem}.key", _pem_key(key)),
        )


# --- a small JSON client --------------------------------------------------------------------------


class ApiError(Exception):
    """A non-2xx answer: its code and the Status (or text) it carried."""

    def __init__(self, code: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{code}: {message}")
        self.code = code
        self.body = body


class Api:
    """A blocking JSON client of the apiserver (or of the gatekeeper) for one identity."""

    def __init__(
        self,
        url: str,
        ca_file: Path,
        *,
        cert: _Pair | None = None,
        token: str | None = None,
        unix_socket: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.context = ssl.create_default_context(cafile=str(ca_file))
        if cert is not None:
            self.context.load_cert_chain(str(cert.cert), str(cert.key))
        self.token = token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout: float = 30,
    ) -> Any:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=timeout) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            payload = error.read()
            try:
                parsed: Any = json.loads(payload)
            except ValueError:
                parsed = payload.decode(errors="replace")
            raise ApiError(error.code, parsed) from None
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def create(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as error:
            if error.code == 404:
                return False
            raise
        return True


# --- the cluster --------------------------------------------------------------------------------


@dataclass
class RealCluster:
    """etcd and kube-apiserver processes, their files, and an admin client."""

    binaries: Binaries
    workdir: Path
    url: str = ""
    pki: _PKI = field(init=False)
    admin: Api = field(init=False)
    audit_log: Path = field(init=False)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _apiserver_args: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, binaries: Binaries) -> RealCluster:
        cluster = cls(binaries, Path(tempfile.mkdtemp(prefix="gk-realcluster-")))
        try:
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def ca_file(self) -> Path:
        return self.pki.ca_file

    def _start(self) -> None:
        self.pki = _PKI(self.workdir)
        self.audit_log = self.workdir / "kube-audit.log"
        etcd_url = self._start_etcd()
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            hosts=("127.0.0.1", "localhost", "10.0.0.1", "kubernetes.default.svc"),
        )
        sa_key = _key()
        sa_key_file = _write(self.workdir / "sa.key", _pem_key(sa_key))
        sa_pub_file = _write(
            self.workdir / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(_AUDIT_POLICY))
        args = [
            self.binaries["kube-apiserver"],
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca_file}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--authorization-mode=Node,RBAC",
            # DRA kubelet plugins run privileged, as dra-example-driver does.
            "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,"
            "resource.k8s.io/v1beta2/devicetaintrules=true",
            # DeviceTaintRules (Intel's Gaudi plugin writes them): beta in 1.36, off by default.
            "--feature-gates=DRADeviceTaintRules=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub_file}",
            f"--service-account-signing-key-file={sa_key_file}",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--profiling=false",
            "--v=0",
        ]
        self._spawn("kube-apiserver", args)
        self._apiserver_args = args
        admin = self.pki.issue("admin", "admin", organizations=("system:masters",))
        self.admin = Api(self.url, self.pki.ca_file, cert=admin)
        poll("kube-apiserver /readyz", self._ready, timeout=120, every=0.25)

    def another_apiserver(self, name: str, audit_policy: dict[str, Any]) -> tuple[str, Path]:
        """One more kube-apiserver on this cluster's etcd, as in an HA control plane, with an
        audit policy and log of its own: its URL and that log. It stops with the cluster."""
        directory = self.workdir / name
        directory.mkdir()
        policy = directory / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(audit_policy))
        port = free_port()
        own = {
            "--secure-port": str(port),
            "--audit-policy-file": str(policy),
            "--audit-log-path": str(directory / "audit.log"),
            "--cert-dir": str(directory / "certs"),
        }
        args = [
            f"{flag}={own[flag]}" if (flag := arg.split("=", 1)[0]) in own else arg
            for arg in self._apiserver_args
        ]
        self._spawn(name, args)
        url = f"https://127.0.0.1:{port}"
        poll(f"{name} /readyz", lambda: self._ready(url), timeout=120, every=0.25)
        return url, directory / "audit.log"

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                self.binaries["etcd"],
                "--name=realcluster",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=realcluster={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(client_url + "/health", timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")

        poll("etcd /health", healthy, timeout=60)
        return client_url

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as it
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self._processes.append(process)

    def _ready(self, url: str = "") -> bool:
        for process in self._processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{process.args[0]} exited with {process.returncode}; "
                    f"log: {self.log_tail(Path(str(process.args[0])).name)}"
                )
        try:
            context = self.admin.context
            readyz = (url or self.url) + "/readyz"
            with urllib.request.urlopen(readyz, context=context, timeout=5) as ok:
                return ok.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._processes.clear()
        remove_workdir(self.workdir)

    # --- reading the apiserver's own journal ---------------------------------------------------

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """The apiserver's audit events so far (ResponseComplete and Panic stages)."""
        if not self.audit_log.exists():
            return
        with self.audit_log.open() as log:
            for line in log:
                if line.strip():
                    # deep: the differential run's bodies nest 2,000 levels (recording 191).
                    event = parse(line)
                    if event.get("stage") in ("ResponseComplete", "Panic"):
                        yield event

    def audit_ids(self) -> set[str]:
        return {e["auditID"] for e in self.audit_events()}

    # --- identities -------------------------------------------------------------------------------

    def client_cert(self, stem: str, user: str, *groups: str) -> _Pair:
        return self.pki.issue(stem, user, organizations=groups)

    def user(self, stem: str, user: str, *groups: str) -> Api:
        """A client of the apiserver as ``user`` (a client certificate)."""
        return Api(self.url, self.pki.ca_file, cert=self.client_cert(stem, user, *groups))

    def kubeconfig(
        self, path: Path, *, cert: _Pair | None = None, token_file: Path | None = None
    ) -> Path:
        """A kubeconfig for this apiserver with a client certificate or a token file."""
        user: dict[str, str] = {}
        if cert is not None:
            user = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
        if token_file is not None:
            user = {"tokenFile": str(token_file)}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "real", "user": "u"}}],
            "current-context": "c",
        }
        path.write_text(yaml.safe_dump(config))
        return path
