"""Added latency against a real kube-apiserver 1.36: the same requests straight to it (with the
gatekeeper's own credentials) and through ``dra-gatekeeper serve`` (a driver over mTLS), in one
run, interleaved, keep-alive connections, one request in flight.

    python bench/realcluster_latency.py [--duration 5] [--reps 3] [--compare DIR] [--json FILE]

Needs Go (it starts the real tier of the test suite: tests/realcluster). Workloads: a small GET
(answered from the gatekeeper's checked read: one upstream call), creates as dry runs in JSON
and in protobuf (client-go's bytes, recording 206: the gatekeeper's dry run, then the driver's),
updates as dry runs in JSON and protobuf, carrying the stored resourceVersion as client-go's
typed ``Update`` does (decided without a read: docs/security.md, "Updates without a read"), and
a list pinned by field selector. ``--compare DIR`` also runs the gatekeeper of another source
tree (a directory holding ``gatekeeper/``, e.g. ``git archive REF gatekeeper | tar -x -C DIR``),
interleaved in the same run: a before/after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fixtures import slice_protobuf
from bench.loadgen import Target, Workload, generator_pool, run_load
from tests.realcluster.build import build
from tests.realcluster.cluster import RealCluster
from tests.realcluster.conftest import DRIVERS, SERVICE_ACCOUNTS
from tests.realcluster.objects import GATEKEEPER_NS, GATEKEEPER_SA, bootstrap, bound_token
from tests.realcluster.processes import GatekeeperProcess

__all__ = ["main"]

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = "fieldSelector=spec.driver%3Dgpu.example.com%2Cspec.nodeName%3Dnode-a"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# client-go 1.36's protobuf bytes of a slice of gpu.example.com on node-a (recording 206).
RECORDING = Path(__file__).resolve().parent.parent / "tests" / "recordings"


def _slice(name: str, rv: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if rv:
        meta["resourceVersion"] = rv
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(8)],
        },
    }


def _protobuf_body() -> bytes:
    import base64

    (path,) = RECORDING.glob("206-*.json")
    return base64.b64decode(json.loads(path.read_text())["request_body"])


def workloads(stored_rv: str) -> dict[str, Workload]:
    return {
        "get": Workload("GET one slice", "GET", f"{SLICES}/bench-slice"),
        "create-json": Workload(
            "create (dry run), JSON",
            "POST",
            f"{SLICES}?dryRun=All",
            json.dumps(_slice("bench-new-{n}")).encode(),
        ),
        "create-protobuf": Workload(
            "create (dry run), protobuf",
            "POST",
            f"{SLICES}?dryRun=All",
            _protobuf_body(),
            content_type=PROTOBUF,
        ),
        "update-json": Workload(
            "update (dry run), JSON",
            "PUT",
            f"{SLICES}/bench-slice?dryRun=All",
            json.dumps(_slice("bench-slice", stored_rv)).encode(),
        ),
        "update-protobuf": Workload(
            "update (dry run), protobuf",
            "PUT",
            f"{SLICES}/bench-slice?dryRun=All",
            slice_protobuf(_slice("bench-slice", stored_rv)),
            content_type=PROTOBUF,
        ),
        "list": Workload("pinned list, 10 slices", "GET", f"{SLICES}?{PINNED}"),
    }


def _prepare(cluster: RealCluster) -> str:
    admin = cluster.admin
    stored = admin.create(SLICES, _slice("bench-slice"))
    for i in range(9):
        admin.create(SLICES, _slice(f"bench-more-{i}"))
    return str(stored["metadata"]["resourceVersion"])


@contextlib.contextmanager
def _serving_from(source: Path | None) -> Iterator[None]:
    """Processes started inside run ``python -m gatekeeper`` from ``source`` (``python -m`` puts
    the working directory first on the path)."""
    if source is None:
        yield
        return
    before, path = Path.cwd(), os.environ.get("PYTHONPATH")
    os.chdir(source)
    os.environ["PYTHONPATH"] = str(source)
    try:
        yield
    finally:
        os.chdir(before)
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path


def _through(gatekeeper: GatekeeperProcess, name: str) -> Target:
    cert, key = gatekeeper.pki.client_files("gpu.example.com")
    return Target(
        name,
        "127.0.0.1",
        gatekeeper.tls_port,
        ca=gatekeeper.pki.path("ca.crt"),
        cert=cert,
        key=key,
    )


def _measure(
    pool: Any, targets: list[Target], workload: Workload, duration: float, reps: int
) -> dict[str, tuple[float, float]]:
    """target → (p50, p99) ms, medians over ``reps`` interleaved repetitions (order rotated)."""
    p50: dict[str, list[float]] = {t.name: [] for t in targets}
    p99: dict[str, list[float]] = {t.name: [] for t in targets}
    for rep in range(reps):
        for target in targets[rep % len(targets) :] + targets[: rep % len(targets)]:
            try:
                result = run_load(pool, target, workload, concurrency=1, duration=duration)
            except Exception as exc:
                raise RuntimeError(f"{workload.name} via {target.name}: {exc!r}") from exc
            bad = {s: c for s, c in result.statuses.items() if s >= 400}
            if bad or result.errors:
                raise RuntimeError(f"{workload.name} via {target.name}: {bad} {result.errors=}")
            p50[target.name].append(result.percentile(0.5))
            p99[target.name].append(result.percentile(0.99))
    return {n: (statistics.median(p50[n]), statistics.median(p99[n])) for n in p50}


def run(
    duration: float, reps: int, log: Any = print, compare: tuple[Path, ...] = ()
) -> dict[str, Any]:
    binaries = build()
    cluster = RealCluster.start(binaries)
    results: dict[str, Any] = {"duration": duration, "reps": reps, "workloads": {}}
    gatekeepers: list[tuple[str, GatekeeperProcess]] = []
    pool = generator_pool(1)
    try:
        policy = cluster.workdir / "policy.yaml"
        default = Path(__import__("gatekeeper").__file__).parent / "policies" / "default.yaml"
        mapping = "".join(f"  {d}: [{a}]\n" for d, a in SERVICE_ACCOUNTS.items())
        policy.write_text(default.read_text() + "\nserviceAccounts:\n" + mapping)
        bootstrap(cluster, policy, DRIVERS)
        token, _ = bound_token(cluster, GATEKEEPER_NS, GATEKEEPER_SA, "node-a")
        token_file = cluster.workdir / "gatekeeper.token"
        token_file.write_text(token)
        for source in (None, *compare):
            name = "gatekeeper" if source is None else f"gatekeeper@{source.name}"
            with _serving_from(source):
                started = GatekeeperProcess(cluster, policy, DRIVERS, token_file).start()
            gatekeepers.append((name, started))
        stored_rv = _prepare(cluster)
        host, port = cluster.url.removeprefix("https://").rsplit(":", 1)
        direct = Target(
            "direct",
            host,
            int(port),
            ca=str(cluster.ca_file),
            headers=(("Authorization", f"Bearer {token}"),),
        )
        targets = [direct, *(_through(g, name) for name, g in gatekeepers)]
        results["targets"] = [t.name for t in targets]
        for key, workload in workloads(stored_rv).items():
            measured = _measure(pool, targets, workload, duration, reps)
            entry: dict[str, Any] = {"name": workload.name, "p50_ms": {}, "p99_ms": {}}
            for name, (p50, p99) in measured.items():
                entry["p50_ms"][name], entry["p99_ms"][name] = p50, p99
            entry["added_p50_ms"] = {
                name: entry["p50_ms"][name] - entry["p50_ms"]["direct"] for name, _ in gatekeepers
            }
            results["workloads"][key] = entry
            log(
                f"{workload.name:32s} direct p50 {entry['p50_ms']['direct']:.2f} ms; added "
                + ", ".join(f"{n} {v:+.2f} ms" for n, v in entry["added_p50_ms"].items())
            )
    finally:
        pool.shutdown()
        for _, gatekeeper in gatekeepers:
            gatekeeper.stop()
        cluster.stop()
    return results


def render(results: dict[str, Any]) -> str:
    names = results["targets"]
    added = [n for n in names if n != "direct"]
    lines = [
        "| workload (c=1) | "
        + " | ".join(f"{n} p50 / p99 ms" for n in names)
        + " | "
        + " | ".join(f"added p50, {n}" for n in added)
        + " |",
        "|---" * (1 + len(names) + len(added)) + "|",
    ]
    for entry in results["workloads"].values():
        cells = [f"{entry['p50_ms'][n]:.2f} / {entry['p99_ms'][n]:.2f}" for n in names]
        cells += [f"{entry['added_p50_ms'][n]:+.2f} ms" for n in added]
        lines.append(f"| {entry['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another source tree's gatekeeper"
    )
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args(argv)
    started = time.time()
    results = run(ns.duration, ns.reps, compare=tuple(p.resolve() for p in ns.compare))
    results["seconds"] = round(time.time() - started, 1)
    print(render(results))
    if ns.json is not None:
        ns.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
