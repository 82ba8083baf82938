"""kube-rbac-proxy as a benchmark target: the Go authorizing reverse proxy operators know.

v0.19.1 (what the Go module proxy serves), built in the real tier's Go module against the same
k8s.io modules as its kube-apiserver (``tests/realcluster/go.mod``, a ``tool`` line), by that
tier's build script, only when the benchmark asks: ``python tests/realcluster/build.py
kube-rbac-proxy``. It runs with the flags and the static authorization in ``bench/krp/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.fixtures import ROOT, Pki

__all__ = ["FLAGS", "KRP_DIR", "Unavailable", "build_kube_rbac_proxy", "kube_rbac_proxy_args"]

KRP_DIR = Path(__file__).resolve().parent / "krp"
FLAGS = KRP_DIR / "flags"
AUTHORIZATION = KRP_DIR / "authorization.yaml"
_BUILD = ROOT / "tests" / "realcluster" / "build.py"


class Unavailable(RuntimeError):
    """kube-rbac-proxy cannot be built here (no Go); the message says why."""


def build_kube_rbac_proxy(timeout: float = 1800) -> str:
    """The binary's path, built first if the real tier's cache does not hold it (warm: seconds;
    cold: minutes). The build script runs as a program: the benchmark imports no test module."""
    done = subprocess.run(
        [sys.executable, str(_BUILD), "kube-rbac-proxy"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise Unavailable(f"kube-rbac-proxy not built: {lines[-1]}")
    return str(Path(done.stdout.strip().splitlines()[-1]) / "kube-rbac-proxy")


def kube_rbac_proxy_args(
    binary: str, *, port: int, upstream: str, pki: Pki, kubeconfig: Path
) -> list[str]:
    """The command line: ``bench/krp/flags`` (one flag a line, ``#`` comments) filled in."""
    values = {
        "port": port,
        "server_cert": pki.server_cert,
        "server_key": pki.server_key,
        "ca": pki.ca,
        "authorization": AUTHORIZATION,
        "upstream": upstream,
        "kubeconfig": kubeconfig,
    }
    lines = FLAGS.read_text().splitlines()
    flags = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return [binary, *(flag.format(**values) for flag in flags)]
