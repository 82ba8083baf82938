"""Build the real tier's Go programs (kube-apiserver, etcd, the DRA driver, the protobuf
differential decoder, the kubelet's side of a DRA plugin, and the reference driver's kubelet
plugin, dra-example-driver's own ``cmd/dra-example-kubeletplugin``) once per source; and, only
when asked, the optional ones (the benchmark's kube-rbac-proxy). Programs of other modules are
``tool`` lines of this module, so they build against the same k8s.io modules.

The binaries go to a cache directory outside the checkout, named by a hash of this Go module's
sources and the Go version, so a warm rebuild is a directory lookup and a changed source gets
its own build. ``python tests/realcluster/build.py`` builds them ahead of the tests (CI does).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import TextIO

__all__ = [
    "BINARIES",
    "MODULE",
    "OPTIONAL",
    "UPSTREAM",
    "Binaries",
    "GoMissing",
    "build",
    "cache_root",
]

MODULE = Path(__file__).resolve().parent
"""The Go module (go.mod, go.sum and cmd/ checked in)."""
UPSTREAM = {
    "dra-example-kubeletplugin": "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin",
}
"""Programs of other modules the tests need, built by package with the core, unchanged and
without the kube-apiserver's version stamp (go.mod's ``tool`` lines pin their versions)."""
BINARIES = (
    "kube-apiserver",
    "etcd",
    "dradriver",
    "protodiff",
    "helm",
    "kubeletdra",
    *UPSTREAM,
)
OPTIONAL = {"kube-rbac-proxy": "github.com/brancz/kube-rbac-proxy/cmd/kube-rbac-proxy"}
"""Programs built only when asked for (``build(optional=...)``), by package: go.mod's ``tool``
lines, so that they need no source here and the tests' build does not wait for them."""
_CACHE_ENV = "DRA_GATEKEEPER_CACHE"


class GoMissing(RuntimeError):
    """No ``go`` on PATH: the real tier cannot be built on this machine."""


class Binaries:
    """Paths of the built programs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


def cache_root() -> Path:
    """``$DRA_GATEKEEPER_CACHE/realcluster``, else ``~/.cache/dra-gatekeeper/realcluster``."""
    base = os.environ.get(_CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dra-gatekeeper"
    )
    return Path(base) / "realcluster"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoMissing("the real-cluster tier needs Go 1.26+ on PATH (go not found)")
    return go


def _ldflags() -> str:
    """The kube-apiserver's version (``/version``), from the k8s.io/kubernetes it is built of:
    a module build has no git tree to stamp it from, and kubectl refuses ``v0.0.0-master``."""
    match = re.search(
        r"^\s*k8s\.io/kubernetes v(\d+)\.(\d+)\.(\d+)\b", (MODULE / "go.mod").read_text(), re.M
    )
    if match is None:
        raise RuntimeError(f"{MODULE / 'go.mod'} does not require k8s.io/kubernetes")
    major, minor, patch = match.groups()
    stamp = "k8s.io/component-base/version"
    return " ".join(
        f"-X {stamp}.{name}={value}"
        for name, value in (
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitVersion", f"v{major}.{minor}.{patch}"),
            ("gitTreeState", "clean"),
        )
    )


def _source_hash(go: str) -> str:
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    digest.update(version.encode() + _ldflags().encode())
    files = [MODULE / "go.mod", MODULE / "go.sum", *sorted(MODULE.glob("cmd/**/*.go"))]
    for path in files:
        digest.update(str(path.relative_to(MODULE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build(log: TextIO = sys.stderr, *, optional: Collection[str] = ()) -> Binaries:
    """The built binaries: from the cache when this source was built before, else built now
    (``go build``, module downloads from the Go module proxy); raises :class:`GoMissing`.

    ``optional`` names programs of :data:`OPTIONAL` to build as well, into the same directory,
    if they are not there yet."""
    if unknown := sorted(set(optional) - set(OPTIONAL)):
        raise ValueError(f"no optional program {', '.join(unknown)} (known: {', '.join(OPTIONAL)})")
    go = _go()
    root = cache_root()
    target = root / _source_hash(go)
    if not all((target / name).is_file() for name in BINARIES):
        _build_core(go, root, target, log)
    return _with_optional(go, root, Binaries(target), optional, log)


def _build_core(go: str, root: Path, target: Path, log: TextIO) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (pytest and a CI pre-build)
        if all((target / name).is_file() for name in BINARIES):
            return
        started = time.monotonic()
        print(f"building the real-cluster tier into {target} (cold: minutes)", file=log)
        scratch = Path(tempfile.mkdtemp(prefix="build-", dir=root))
        try:
            _go_build(go, f"{scratch}/", "./cmd/...", _ldflags())
            for package in UPSTREAM.values():
                _go_build(go, f"{scratch}/", package, "")
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"built in {time.monotonic() - started:.0f} s", file=log)
        _prune(root, keep=target)


def _with_optional(
    go: str, root: Path, binaries: Binaries, names: Collection[str], log: TextIO
) -> Binaries:
    """``binaries`` once each of ``names`` (:data:`OPTIONAL`) is built beside them."""
    missing = [name for name in names if not (binaries.directory / name).is_file()]
    if not missing:
        return binaries
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in missing:
            final = binaries.directory / name
            if final.is_file():
                continue
            started = time.monotonic()
            scratch = binaries.directory / f".{name}.build"
            try:
                _go_build(go, str(scratch), OPTIONAL[name], "")
                scratch.rename(final)
            finally:
                scratch.unlink(missing_ok=True)
            print(f"built {name} in {time.monotonic() - started:.0f} s", file=log)
    return binaries


def _go_build(go: str, output: str, package: str, ldflags: str) -> None:
    subprocess.run(
        [go, "build", "-trimpath", "-ldflags", ldflags, "-o", output, package],
        cwd=MODULE,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=readonly"},
    )


def _prune(root: Path, keep: Path, builds: int = 3) -> None:
    """Keep the newest ``builds`` builds (each is ~200 MB; checkouts of other branches may
    still use the older ones) and drop the rest."""
    done = [e for e in root.iterdir() if e.is_dir() and not e.name.startswith("build-")]
    done.sort(key=lambda entry: entry.stat().st_mtime, reverse=True)
    for entry in done[builds:]:
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)


if __name__ == "__main__":
    # python tests/realcluster/build.py [kube-rbac-proxy ...]: the tier, and optional programs.
    try:
        print(build(optional=sys.argv[1:]).directory)
    except (GoMissing, ValueError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
