"""Added latency against a real kube-apiserver 1.36: the same requests straight to it (with the
gatekeeper's own credentials) and through ``dra-gatekeeper serve`` (a driver over mTLS), in one
run, interleaved, keep-alive connections, one request in flight.

    python bench/realcluster_latency.py [--duration 5] [--reps 3] [--json FILE]

Needs Go (it starts the real tier of the test suite: tests/realcluster). Workloads: a small GET
(answered from the gatekeeper's checked read: one upstream call), creates as dry runs in JSON
and in protobuf (client-go's bytes, recording 206: the gatekeeper's dry run, then the driver's),
a JSON update as a dry run (fetch, then write), and a list pinned by field selector.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
        "list": Workload("pinned list, 10 slices", "GET", f"{SLICES}?{PINNED}"),
    }


def _prepare(cluster: RealCluster) -> str:
    admin = cluster.admin
    stored = admin.create(SLICES, _slice("bench-slice"))
    for i in range(9):
        admin.create(SLICES, _slice(f"bench-more-{i}"))
    return str(stored["metadata"]["resourceVersion"])


def run(duration: float, reps: int, log: Any = print) -> dict[str, Any]:
    binaries = build()
    cluster = RealCluster.start(binaries)
    results: dict[str, Any] = {"duration": duration, "reps": reps, "workloads": {}}
    gatekeeper = None
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
        gatekeeper = GatekeeperProcess(cluster, policy, DRIVERS, token_file).start()
        stored_rv = _prepare(cluster)
        host, port = cluster.url.removeprefix("https://").rsplit(":", 1)
        direct = Target(
            "direct",
            host,
            int(port),
            ca=str(cluster.ca_file),
            headers=(("Authorization", f"Bearer {token}"),),
        )
        cert, key = gatekeeper.pki.client_files("gpu.example.com")
        through = Target(
            "gatekeeper",
            "127.0.0.1",
            gatekeeper.tls_port,
            ca=gatekeeper.pki.path("ca.crt"),
            cert=cert,
            key=key,
        )
        for name, workload in workloads(stored_rv).items():
            rows: dict[str, list[float]] = {"direct": [], "gatekeeper": []}
            p99: dict[str, list[float]] = {"direct": [], "gatekeeper": []}
            for rep in range(reps):
                order = (direct, through) if rep % 2 == 0 else (through, direct)
                for target in order:
                    try:
                        result = run_load(pool, target, workload, concurrency=1, duration=duration)
                    except Exception as exc:
                        raise RuntimeError(f"{name} via {target.name}: {exc!r}") from exc
                    bad = {s: c for s, c in result.statuses.items() if s >= 400}
                    if bad or result.errors:
                        raise RuntimeError(
                            f"{name} via {target.name}: {bad} errors={result.errors}"
                        )
                    rows[target.name].append(result.percentile(0.5))
                    p99[target.name].append(result.percentile(0.99))
            entry = {
                "name": workload.name,
                "direct_p50_ms": statistics.median(rows["direct"]),
                "gatekeeper_p50_ms": statistics.median(rows["gatekeeper"]),
                "direct_p99_ms": statistics.median(p99["direct"]),
                "gatekeeper_p99_ms": statistics.median(p99["gatekeeper"]),
            }
            entry["added_p50_ms"] = entry["gatekeeper_p50_ms"] - entry["direct_p50_ms"]
            results["workloads"][name] = entry
            log(
                f"{workload.name:32s} direct p50 {entry['direct_p50_ms']:.2f} ms  gatekeeper "
                f"p50 {entry['gatekeeper_p50_ms']:.2f} ms  added {entry['added_p50_ms']:+.2f} ms"
            )
    finally:
        pool.shutdown()
        if gatekeeper is not None:
            gatekeeper.stop()
        cluster.stop()
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "| workload (c=1) | direct p50 / p99 ms | gatekeeper p50 / p99 ms | added p50 |",
        "|---|---|---|---|",
    ]
    for entry in results["workloads"].values():
        lines.append(
            f"| {entry['name']} | {entry['direct_p50_ms']:.2f} / {entry['direct_p99_ms']:.2f} | "
            f"{entry['gatekeeper_p50_ms']:.2f} / {entry['gatekeeper_p99_ms']:.2f} | "
            f"{entry['added_p50_ms']:+.2f} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args(argv)
    started = time.time()
    results = run(ns.duration, ns.reps)
    results["seconds"] = round(time.time() - started, 1)
    print(render(results))
    if ns.json is not None:
        ns.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
