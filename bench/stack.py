"""The processes of one benchmark run, started side by side and always stopped.

- the throughput upstream: nginx serving fixed answers when installed, else
  :mod:`bench.upstream_app` (both HTTPS on loopback);
- ``dra-gatekeeper serve`` (a real subprocess: mTLS listener and the driver's Unix socket), also
  with a policy holding CEL validations (``bench/cel-policy.yaml``);
- nginx as a plain reverse proxy (when installed); kube-rbac-proxy (when Go can build it:
  :mod:`bench.rbacproxy`); the naive aiohttp pass-through.

Every process's resident memory can be read (:meth:`Stack.memory`): now and its peak.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from bench.fixtures import (
    DRIVER,
    NODE,
    ROOT,
    TOKEN,
    Pki,
    free_port,
    make_pki,
    python_process,
    stop_process,
    wait_ready,
    write_kubeconfig,
)
from bench.loadgen import Target
from bench.nginx import find_nginx, start_fixed_upstream, start_reverse_proxy
from bench.rbacproxy import Unavailable, build_kube_rbac_proxy, kube_rbac_proxy_args

_TICKS = os.sysconf("SC_CLK_TCK")
CEL_POLICY = ROOT / "bench" / "cel-policy.yaml"
"""The default policy with a few CEL validations on ResourceSlice v1 (target gatekeeper-cel)."""

__all__ = ["Gatekeeper", "Stack", "checkout", "start_gatekeeper", "start_python_upstream"]


@dataclass
class Gatekeeper:
    proc: subprocess.Popen
    port: int
    socket: str
    log: Path


@dataclass
class Stack:
    """A run's working directory, PKI, and every started process (stopped by ``close``)."""

    workdir: Path
    pki: Pki
    list_count: int
    upstream_kind: str = ""
    upstream_url: str = ""
    targets: dict[str, Target] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)
    """target → the process (in ``procs``) that serves it, whose CPU time is measured."""
    _exit: ExitStack = field(default_factory=ExitStack)

    @classmethod
    def create(cls, list_count: int) -> Stack:
        workdir = Path(tempfile.mkdtemp(prefix="gk-bench-"))
        return cls(workdir, make_pki(workdir), list_count)

    def client_target(self, name: str, port: int) -> Target:
        p = self.pki
        return Target(name, port=port, ca=p.ca, cert=p.client_cert, key=p.client_key)

    def add(self, name: str, proc: subprocess.Popen) -> subprocess.Popen:
        self.procs[name] = proc
        return proc

    def start_all(
        self,
        *,
        use_nginx: bool = True,
        audit: bool = True,
        compare: tuple[str, ...] = (),
        cel: bool = True,
        kube_rbac_proxy: bool = True,
    ) -> None:
        nginx = find_nginx() if use_nginx else None
        self._start_upstream(nginx)
        port = free_port()
        gk = start_gatekeeper(self, "gatekeeper", self.upstream_url, port)
        self.targets["gatekeeper"] = self.client_target("gatekeeper", gk.port)
        self.targets["gatekeeper-unix"] = Target("gatekeeper-unix", path=gk.socket)
        self.serving["gatekeeper"] = self.serving["gatekeeper-unix"] = "gatekeeper"
        if cel:
            gk = start_gatekeeper(
                self, "gatekeeper-cel", self.upstream_url, free_port(), policy=CEL_POLICY
            )
            self.targets["gatekeeper-cel"] = self.client_target("gatekeeper-cel", gk.port)
            self.serving["gatekeeper-cel"] = "gatekeeper-cel"
        if kube_rbac_proxy:
            self._start_kube_rbac_proxy()
        if audit:
            gk = start_gatekeeper(
                self,
                "gatekeeper-audit",
                self.upstream_url,
                free_port(),
                audit_log=self.workdir / "audit.log",
            )
            self.targets["gatekeeper-audit"] = self.client_target("gatekeeper-audit", gk.port)
            self.serving["gatekeeper-audit"] = "gatekeeper-audit"
        for ref in compare:
            name = f"gatekeeper@{ref}"
            gk = start_gatekeeper(
                self, name, self.upstream_url, free_port(), source=checkout(self, ref)
            )
            self.targets[name] = self.client_target(name, gk.port)
            self.serving[name] = name
        if nginx:
            port = free_port()
            upstream_port = int(self.upstream_url.rsplit(":", 1)[1])
            self.add(
                "nginx-proxy",
                start_reverse_proxy(
                    nginx, self.workdir / "nginx-proxy", port, upstream_port, self.pki
                ),
            )
            wait_ready(self.procs["nginx-proxy"], port=port, what="nginx proxy")
            self.targets["nginx"] = self.client_target("nginx", port)
            self.serving["nginx"] = "nginx-proxy"
        else:
            self.skipped["nginx"] = "nginx is not installed"
        port = free_port()
        log = self.workdir / "naive.log"
        self.add(
            "naive",
            python_process(
                [
                    "-m",
                    "bench.naive_proxy",
                    "--upstream",
                    self.upstream_url,
                    "--ca",
                    self.pki.ca,
                    "--token",
                    TOKEN,
                    "--port",
                    str(port),
                    "--cert",
                    self.pki.server_cert,
                    "--key",
                    self.pki.server_key,
                    "--client-ca",
                    self.pki.ca,
                ],
                log,
            ),
        )
        wait_ready(self.procs["naive"], port=port, what="naive proxy", log=log)
        self.targets["naive"] = self.client_target("naive", port)
        self.serving["naive"] = "naive"

    def _start_kube_rbac_proxy(self) -> None:
        try:
            binary = build_kube_rbac_proxy()
        except Unavailable as exc:
            self.skipped["kube-rbac-proxy"] = str(exc)
            return
        work = self.workdir / "kube-rbac-proxy"
        work.mkdir()
        port = free_port()
        args = kube_rbac_proxy_args(
            binary,
            port=port,
            upstream=self.upstream_url,
            pki=self.pki,
            kubeconfig=write_kubeconfig(work / "kubeconfig", self.upstream_url, self.pki),
        )
        log = work / "out.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.add("kube-rbac-proxy", proc)
        wait_ready(proc, port=port, what="kube-rbac-proxy", log=log)
        self.targets["kube-rbac-proxy"] = self.client_target("kube-rbac-proxy", port)
        self.serving["kube-rbac-proxy"] = "kube-rbac-proxy"

    def _start_upstream(self, nginx: str | None) -> None:
        port = free_port()
        if nginx:
            self.add(
                "upstream",
                start_fixed_upstream(
                    nginx, self.workdir / "nginx-upstream", port, self.pki, self.list_count
                ),
            )
            self.upstream_kind = "nginx serving fixed JSON (HTTPS, 1 worker)"
        else:
            self.add("upstream", start_python_upstream(self, port, self.list_count))
            self.upstream_kind = "bench.upstream_app: aiohttp fixed answers (HTTPS, 1 process)"
        wait_ready(self.procs["upstream"], port=port, what="upstream")
        self.upstream_url = f"https://127.0.0.1:{port}"
        self.serving["direct"] = "upstream"
        self.targets["direct"] = Target(
            "direct", port=port, ca=self.pki.ca, headers=(("Authorization", f"Bearer {TOKEN}"),)
        )

    def cpu_seconds(self, target: str) -> float:
        """User + system CPU seconds of the process serving ``target`` and its children
        (nginx's worker); 0 when unknown."""
        proc = self.procs.get(self.serving.get(target, ""))
        if proc is None:
            return 0.0
        total = 0.0
        for pid in _with_children(proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / _TICKS
        return total

    def memory(self) -> dict[str, tuple[float, float]]:
        """Every started process (with its children: nginx's worker) → (RSS now, peak RSS),
        in MB (``VmRSS`` and ``VmHWM`` of ``/proc/PID/status``, summed)."""
        out: dict[str, tuple[float, float]] = {}
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            now = peak = 0.0
            for pid in _with_children(proc.pid):
                status = _status(pid)
                now += status.get("VmRSS", 0) / 1024
                peak += status.get("VmHWM", 0) / 1024
            out[name] = (round(now, 1), round(peak, 1))
        return out

    def close(self) -> None:
        for proc in reversed(list(self.procs.values())):
            stop_process(proc)
        self.procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [pid, *(int(p) for p in children.read_text().split())]
    except OSError:
        return [pid]


def _status(pid: int) -> dict[str, int]:
    """The kB fields of ``/proc/PID/status`` (empty once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            fields[key] = int(value.split()[0])
    return fields


def start_python_upstream(
    stack: Stack, port: int, list_count: int, big_mb: int = 0
) -> subprocess.Popen:
    log = stack.workdir / f"upstream-{port}.log"
    proc = python_process(
        [
            "-m",
            "bench.upstream_app",
            "--port",
            str(port),
            "--cert",
            stack.pki.server_cert,
            "--key",
            stack.pki.server_key,
            "--workdir",
            str(stack.workdir),
            "--list-count",
            str(list_count),
            "--big-mb",
            str(big_mb),
        ],
        log,
    )
    wait_ready(proc, port=port, what="python upstream", log=log, timeout=60)
    return proc


# The benchmark drives one driver far past what a real driver does (64 connections, 1,000
# watches): where `serve` has per-driver budgets, they are raised for the run.
_LIMIT_FLAGS = {
    "--max-requests-per-driver": "4096",
    "--max-watches-per-driver": "4096",
    "--max-connections-per-driver": "8192",
    "--max-connections": "8192",
    "--upstream-watch-connections": "4096",
}


@lru_cache(maxsize=8)
def _limit_flags(source: str) -> tuple[str, ...]:
    """The budget flags this gatekeeper's ``serve`` knows, with the benchmark's values."""
    env = {**os.environ, "PYTHONPATH": source}
    text = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "serve", "--help"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    flags: list[str] = []
    for flag, value in _LIMIT_FLAGS.items():
        if flag in text:
            flags += [flag, value]
    return tuple(flags)


def checkout(stack: Stack, ref: str) -> Path:
    """``gatekeeper/`` as of git ``ref``, unpacked in the run's directory (for ``--compare``);
    a directory holding a ``gatekeeper/`` package is used as it is (a variant being tried)."""
    if (Path(ref) / "gatekeeper" / "__init__.py").exists():
        return Path(ref).resolve()
    out = stack.workdir / f"ref-{ref.replace('/', '_')}"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "gatekeeper"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def start_gatekeeper(
    stack: Stack,
    name: str,
    upstream_url: str,
    port: int,
    *,
    audit_log: Path | None = None,
    source: Path | None = None,
    policy: Path | None = None,
) -> Gatekeeper:
    """``dra-gatekeeper serve`` with the mTLS listener on ``port`` and the driver's socket;
    the packaged default policy unless ``policy`` is given."""
    work = stack.workdir / name.replace("/", "_")
    work.mkdir()
    kubeconfig = write_kubeconfig(work / "kubeconfig", upstream_url, stack.pki)
    sockets = work / "sockets"
    args = [
        "-m",
        "gatekeeper",
        "serve",
        "--node-name",
        NODE,
        "--driver",
        DRIVER,
        "--kubeconfig",
        str(kubeconfig),
        "--listen",
        f"127.0.0.1:{port}",
        "--tls-cert-file",
        stack.pki.server_cert,
        "--tls-key-file",
        stack.pki.server_key,
        "--client-ca-file",
        stack.pki.ca,
        "--socket-dir",
        str(sockets),
    ]
    if audit_log is not None:
        args += ["--audit-log", str(audit_log)]
    if policy is not None:
        args += ["--policy", str(policy)]
    args += _limit_flags(str(source or ROOT))
    log = work / "serve.log"
    env = {"PYTHONPATH": str(source)} if source is not None else None
    proc = stack.add(name, python_process(args, log, env, cwd=source or ROOT))
    socket = str(sockets / DRIVER / "api.sock")
    wait_ready(proc, port=port, what=name, log=log)
    wait_ready(proc, path=socket, what=name, log=log)
    return Gatekeeper(proc, port, socket, log)
