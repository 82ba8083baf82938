"""The side-by-side benchmark, one command (DESIGN §5):

    python bench/run.py [--smoke] [--duration S] [--reps N] [--concurrency 1,16,64]
                        [--workloads get,create,create-pb,update,update-pb,list] [--json FILE]

Direct vs ``dra-gatekeeper serve`` (mTLS listener and Unix socket, audit off and on, a policy
with CEL) vs kube-rbac-proxy (built with Go when it is installed) vs nginx as a plain reverse
proxy (when installed) vs a naive aiohttp pass-through, against one fast fixed-answer HTTPS
upstream; small GET, 2 KB create, update (carrying its resourceVersion: no read unless the
policy's CEL names ``oldObject``), each write also
in protobuf as client-go sends it (the gatekeeper adds a ``dryRun=All`` round trip to decode
it), pinned list of 500 slices (~1 MB), at each concurrency; interleaved repetitions (median
of ``--reps``);
every process's RSS idle, after the load and at its peak; then the engine alone, memory and
watches, audit writer. Loopback only, every loop bounded.
``--smoke`` runs a seconds-long version (CI: it only has to run and produce numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fixtures import (
    COUNTER_WIDTH,
    PINNED_QUERY,
    PROTOBUF,
    PROTOBUF_ACCEPT,
    SLICES,
    counted_slice_protobuf,
    item_slice,
    slice_body,
    slice_protobuf,
)
from bench.loadgen import LoadResult, Target, Workload, generator_pool, run_load
from bench.report import render
from bench.stack import Stack

__all__ = ["Profile", "main", "run"]

WORKLOADS = {
    "get": Workload("small GET", "GET", f"{SLICES}/node-a-bench"),
    "create": Workload(
        "2 KB create", "POST", SLICES, json.dumps(slice_body("node-a-w-{n}")).encode()
    ),
    "create-pb": Workload(
        "2 KB create, protobuf",
        "POST",
        SLICES,
        counted_slice_protobuf("node-a-w-"),
        content_type=PROTOBUF,
        accept=PROTOBUF_ACCEPT,
        counter_width=COUNTER_WIDTH,
    ),
    "update": Workload(
        "update (with its resourceVersion)",
        "PUT",
        f"{SLICES}/node-a-bench",
        json.dumps(item_slice()).encode(),
    ),
    "update-pb": Workload(
        "update (with its resourceVersion), protobuf",
        "PUT",
        f"{SLICES}/node-a-bench",
        slice_protobuf(item_slice()),
        content_type=PROTOBUF,
        accept=PROTOBUF_ACCEPT,
    ),
    "list": Workload("pinned list, 500 slices", "GET", f"{SLICES}?{PINNED_QUERY}"),
}


@dataclass
class Profile:
    duration: float = 2.0
    reps: int = 3
    concurrency: tuple[int, ...] = (1, 16, 64)
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    targets: tuple[str, ...] = ()
    """Empty: every target that could be started."""
    settle: float = 0.3
    list_count: int = 500
    engine_rounds: int = 20_000
    watches: int = 1000
    idle_seconds: float = 30.0
    big_mb: int = 50
    delay_rounds: int = 10
    audit_events: int = 100_000
    wrk: bool = True
    nginx: bool = True
    compare: tuple[str, ...] = ()
    """Git refs whose gatekeeper runs beside this one, interleaved (target gatekeeper@REF)."""
    cel: bool = True
    """Also the gatekeeper with CEL validations on ResourceSlices (target gatekeeper-cel)."""
    kube_rbac_proxy: bool = True
    """Also kube-rbac-proxy, built with Go first if needed (skipped, and said so, without Go)."""
    idle_wait: float = 2.0
    """Seconds between the last process started and the idle RSS read."""
    extras: bool = True
    """Engine, memory/watches and audit writer after the throughput matrix."""

    @classmethod
    def smoke(cls) -> Profile:
        return cls(
            duration=0.1,
            reps=1,
            concurrency=(2,),
            settle=0.05,
            list_count=50,
            engine_rounds=200,
            watches=20,
            idle_seconds=0.3,
            big_mb=2,
            delay_rounds=2,
            audit_events=2000,
            wrk=False,
            kube_rbac_proxy=False,
            idle_wait=0.1,
        )


@dataclass
class Cell:
    """Median over the repetitions of one (workload, concurrency, target)."""

    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float
    """CPU time of the serving process per request (user + system, µs): steady under load
    from other processes, unlike req/s."""
    errors: int
    statuses: dict[str, int]
    runs: list[float] = field(default_factory=list)


def machine() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for name in ("aiohttp", "uvloop", "orjson"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "absent"
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3] if cpuinfo.exists() else [],
        "python": platform.python_version(),
        "kernel": platform.release(),
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _cell(results: list[LoadResult], cpu: list[float]) -> Cell:
    statuses: dict[str, int] = {}
    for result in results:
        for code, count in result.statuses.items():
            statuses[str(code)] = statuses.get(str(code), 0) + count
    return Cell(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.percentile(0.5) for r in results),
        p99_ms=statistics.median(r.percentile(0.99) for r in results),
        cpu_us=statistics.median(
            c / r.requests * 1e6 if r.requests else 0.0 for r, c in zip(results, cpu, strict=True)
        ),
        errors=sum(r.errors for r in results),
        statuses=statuses,
        runs=[round(r.rps, 1) for r in results],
    )


def throughput(stack: Stack, profile: Profile, log: Any) -> dict[str, dict[str, dict[str, Cell]]]:
    """workload → "c=N" → target → Cell; targets interleaved, order rotated each repetition."""
    names = [n for n in (profile.targets or stack.targets) if n in stack.targets]
    names += [f"gatekeeper@{ref}" for ref in profile.compare if f"gatekeeper@{ref}" not in names]
    table: dict[str, dict[str, dict[str, Cell]]] = {}
    pool = generator_pool(os.cpu_count() or 1)
    try:
        for key in profile.workloads:
            workload = WORKLOADS[key]
            table[key] = {}
            for concurrency in profile.concurrency:
                runs: dict[str, list[LoadResult]] = {n: [] for n in names}
                cpu: dict[str, list[float]] = {n: [] for n in names}
                for rep in range(profile.reps):
                    order = names[rep % len(names) :] + names[: rep % len(names)]
                    for name in order:
                        before = stack.cpu_seconds(name)
                        runs[name].append(
                            run_load(
                                pool,
                                stack.targets[name],
                                workload,
                                concurrency=concurrency,
                                duration=profile.duration,
                                settle=profile.settle,
                            )
                        )
                        cpu[name].append(stack.cpu_seconds(name) - before)
                table[key][f"c={concurrency}"] = {n: _cell(r, cpu[n]) for n, r in runs.items()}
                log(
                    f"  {workload.name} c={concurrency}: "
                    + ", ".join(
                        f"{n} {c.rps:,.0f}/s {c.cpu_us:.0f}µs"
                        for n, c in table[key][f"c={concurrency}"].items()
                    )
                )
    finally:
        pool.shutdown()
    return table


def wrk_check(target: Target, profile: Profile) -> dict[str, Any]:
    """wrk against the direct upstream: is our generator the bottleneck? (wrk has no client
    certificate option, so it can only measure targets that do not ask for one.)"""
    binary = shutil.which("wrk")
    if binary is None or not profile.wrk:
        return {"skipped": "wrk is not installed" if binary is None else "off"}
    out: dict[str, Any] = {}
    for key in ("get", "list"):
        for concurrency in profile.concurrency:
            url = f"https://localhost:{target.port}{WORKLOADS[key].path}"
            threads = min(concurrency, os.cpu_count() or 1)
            args = [
                binary,
                f"-t{threads}",
                f"-c{concurrency}",
                f"-d{max(1, round(profile.duration))}s",
                "--latency",
                url,
            ]
            text = subprocess.run(args, capture_output=True, text=True, timeout=120).stdout
            out[f"{key} c={concurrency}"] = _parse_wrk(text)
    return out


def _parse_wrk(text: str) -> dict[str, float]:
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    result: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            result["rps"] = float(parts[1])
        elif parts[:1] in (["50%"], ["99%"]):
            value = parts[1]
            unit = next(u for u in ("us", "ms", "s") if value.endswith(u))
            result[f"p{parts[0][:-1]}_ms"] = float(value[: -len(unit)]) * units[unit]
    return result


def _memory(
    idle: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    serving: dict[str, str],
) -> dict[str, dict[str, Any]]:
    """process → its RSS idle, after the load and at its peak (MB), and the targets it serves."""
    return {
        name: {
            "targets": sorted(t for t, p in serving.items() if p == name),
            "idle_mb": idle[name][0],
            "after_load_mb": now,
            "peak_mb": peak,
        }
        for name, (now, peak) in after.items()
        if name in idle
    }


def run(profile: Profile, log: Any = print, partial: Path | None = None) -> dict[str, Any]:
    """Everything, in one run; the results as plain data (also what ``--json`` writes)."""
    from bench.audit_bench import bench_writer
    from bench.engine_bench import measure_engine
    from bench.resources import measure_resources

    report: dict[str, Any] = {"machine_before": machine(), "profile": asdict(profile)}
    with Stack.create(profile.list_count) as stack:
        stack.start_all(
            use_nginx=profile.nginx,
            compare=profile.compare,
            cel=profile.cel,
            kube_rbac_proxy=profile.kube_rbac_proxy,
        )
        report["upstream"] = stack.upstream_kind
        report["skipped"] = dict(stack.skipped)
        log(f"upstream: {stack.upstream_kind}; targets: {', '.join(stack.targets)}")
        time.sleep(profile.idle_wait)
        idle = stack.memory()
        report["throughput"] = {
            w: {c: {t: asdict(cell) for t, cell in row.items()} for c, row in by_c.items()}
            for w, by_c in throughput(stack, profile, log).items()
        }
        report["memory"] = _memory(idle, stack.memory(), stack.serving)
        if partial is not None:  # the matrix is the long part: keep it whatever follows
            partial.write_text(json.dumps(report, indent=1))
        report["wrk_direct"] = wrk_check(stack.targets["direct"], profile)
        if not profile.extras:
            report["machine_after"] = machine()
            return report
        log("engine, resources, audit ...")
        report["engine"] = [asdict(r) for r in measure_engine(profile.engine_rounds)]
        report["resources"] = asdict(
            measure_resources(
                stack,
                watches=profile.watches,
                idle_seconds=profile.idle_seconds,
                big_mb=profile.big_mb,
                rounds=profile.delay_rounds,
            )
        )
        import asyncio

        report["audit_writer_events_per_s"] = asyncio.run(
            bench_writer(stack.workdir, profile.audit_events)
        )
    report["machine_after"] = machine()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="seconds-long CI version")
    parser.add_argument("--duration", type=float, help="seconds per measurement (default 2)")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default 3)")
    parser.add_argument("--concurrency", help="comma list (default 1,16,64)")
    parser.add_argument("--workloads", help=f"comma list of {','.join(WORKLOADS)}")
    parser.add_argument("--targets", help="comma list (default: all that started)")
    parser.add_argument("--watches", type=int, help="open watches (default 1000)")
    parser.add_argument("--idle-seconds", type=float, help="idle CPU window (default 30)")
    parser.add_argument("--big-mb", type=int, help="big list size in MB (default 50)")
    parser.add_argument("--no-nginx", action="store_true", help="do not use nginx even if present")
    parser.add_argument(
        "--compare", help="comma list of git refs: their gatekeeper too (A/B in one run)"
    )
    parser.add_argument("--no-wrk", action="store_true", help="skip the wrk generator check")
    parser.add_argument(
        "--no-kube-rbac-proxy", action="store_true", help="no kube-rbac-proxy (else built with Go)"
    )
    parser.add_argument("--no-cel", action="store_true", help="no gatekeeper-cel target")
    parser.add_argument(
        "--throughput-only", action="store_true", help="skip engine, memory/watches and audit"
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    profile = Profile.smoke() if args.smoke else Profile()
    for name in ("duration", "reps", "watches", "idle_seconds", "big_mb"):
        if getattr(args, name) is not None:
            setattr(profile, name, getattr(args, name))
    if args.concurrency:
        profile.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    if args.workloads:
        profile.workloads = tuple(args.workloads.split(","))
    if args.targets:
        profile.targets = tuple(args.targets.split(","))
    profile.nginx = not args.no_nginx
    if args.compare:
        profile.compare = tuple(args.compare.split(","))
    profile.wrk = profile.wrk and not args.no_wrk
    profile.kube_rbac_proxy = profile.kube_rbac_proxy and not args.no_kube_rbac_proxy
    profile.cel = profile.cel and not args.no_cel
    profile.extras = not args.throughput_only
    report = run(
        profile,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        partial=Path(args.json) if args.json else None,
    )
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
