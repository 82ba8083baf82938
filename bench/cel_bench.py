"""CEL bounded by construction, measured (issue 40):

    python bench/cel_bench.py [--seconds S] [--only NAME,...] [--json FILE]

1. The bound holds: for expressions of every kind the cost model counts (nodes, loops, lists
   built by map and filter, strings, comparisons, regular expressions, the objects' conversion)
   on inputs of growing size, the bound computed before evaluating (units of about a
   nanosecond) against the time the evaluation took; ``bound / time`` must stay above 1.
2. No driver stalls another: for the packaged default, every policy of ``policies/`` and a policy
   with ``map``/``filter`` over a list of the request (it is refused at load, its cost being
   quadratic; loaded here with the load-time limit lifted, to show the per-request budget
   alone), another driver's GET latency (pinned slice list, 4 workers) quiet, then while one
   driver sends the worst bodies for that policy's CEL, 4 at a time: a 1 MB body with a
   100-bit integer 90 levels deep beside what the CEL reads, a body whose lists the CEL loops
   over hold 9,999 elements, a body whose strings the CEL reads are 1 MiB long. The gatekeeper
   and the embedded API server each run as a process of their own; loopback and Unix sockets
   only, every loop bounded by ``--seconds``.

Besides the GET percentiles: what the attacker got (codes, p50), and the gatekeeper's CPU per
attack request beside the time its body takes to parse alone (the part no CEL bound governs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest.mock import patch

import aiohttp
import yaml

if __package__ in (None, ""):  # python bench/cel_bench.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.isolation_bench import steady
from gatekeeper.policy.cel import CelRules, Validation, compile_program, cost_bound, run_validations
from gatekeeper.policy.cel._env import BUILT_INS
from gatekeeper.policy.cel._reads import EACH
from gatekeeper.policyfile import load_policy
from gatekeeper.request.body import decode_body
from gatekeeper.testing.harness import free_port, token_kubeconfig, wait_ready

__all__ = ["calibrate", "isolation", "main"]

ROOT = Path(__file__).resolve().parent.parent
NODE, NIC, TOKEN = "node-a", "nic.example.com", "bench-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MAP_FILTER = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
include: [packaged:default]
drivers: [gpu.example.com]
overrides:
  - group: resource.k8s.io
    resource: resourceslices
    verbs: [get, list, watch, create, update, patch, delete]
    versions:
      - names: [v1]
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
        forbidden: [spec.nodeSelector, spec.allNodes, spec.perDeviceNodeSelection]
        validations:
          - name: names
            expression: object.spec.devices.map(d, d.name).size() <= 128
          - name: gpus
            expression: >-
              object.spec.devices.filter(d, d.name.startsWith('gpu-')).size() ==
              object.spec.devices.size()
"""

# --- 1. the bound against the time ---------------------------------------------------------------

CALIBRATION = [
    ("nodes", "object.a == 1 && object.b == 'x' && object.c != null && size(object.d) >= 0",
     lambda n: {"a": 1, "b": "x", "c": [], "d": "y" * n}),
    ("loop", "object.items.all(i, i.name.startsWith('gpu-'))",
     lambda n: {"items": [{"name": f"gpu-{i}"} for i in range(n)]}),
    ("map", "object.items.map(i, i.name).size() >= 0",
     lambda n: {"items": [{"name": f"gpu-{i}"} for i in range(n)]}),
    ("filter", "object.items.filter(i, i > 0).size() >= 0", lambda n: {"items": list(range(n))}),
    ("concat", "(object.s + object.s + object.s).size() > 0", lambda n: {"s": "a" * (100 * n)}),
    ("contains", "object.s.contains('b')", lambda n: {"s": "a" * (100 * n)}),
    ("matches", "object.s.matches('^(a|b)*c$')", lambda n: {"s": "a" * (100 * n)}),
    ("split", "object.s.split(',').size() > 0", lambda n: {"s": "a," * (10 * n)}),
    ("equal", "object.items == object.other",
     lambda n: {"items": [{"n": i} for i in range(n)], "other": [{"n": i} for i in range(n)]}),
    ("in", "'zzz' in object.items", lambda n: {"items": [f"item-{i}" for i in range(n)]}),
    ("convert", "object.items.size() > 0",
     lambda n: {"items": [{"name": f"d-{i}", "attributes": {"x": {"int": i}}} for i in range(n)]}),
    ("nested", "object.items.all(i, i.attrs.all(k, k.size() < 64))",
     lambda n: {"items": [{"attrs": {f"k{j}": j for j in range(10)}} for _ in range(n)]}),
]  # fmt: skip
SIZES = (10, 100, 1000)


def _timed(rules: CelRules, obj: Any, rounds: int) -> float:
    """The fastest of ``rounds`` evaluations, in ns (the objects cut and converted included)."""
    best = float("inf")
    builtins = {name: None for name in BUILT_INS}
    for _ in range(rounds):
        started = time.perf_counter_ns()
        run_validations(rules, obj, None, {}, builtins)
        best = min(best, time.perf_counter_ns() - started)
    return best


def calibrate(rounds: int = 15) -> list[dict[str, Any]]:
    """Per expression and input size: the bound (units), the time (ns) and their ratio."""
    out = []
    with (
        patch("gatekeeper.policy.cel._analysis.COST_LIMIT", float("inf")),
        patch("gatekeeper.policy.cel._run.REQUEST_BUDGET", float("inf")),
    ):
        for name, source, make in CALIBRATION:
            program = compile_program(source, name, variables=BUILT_INS)
            rules = CelRules(validations=(Validation(name, program),))
            for size in SIZES:
                obj = make(size)
                bound = cost_bound(rules, obj)
                took = _timed(rules, obj, rounds if size < 1000 else max(3, rounds // 3))
                out.append({"expression": name, "size": size, "bound": round(bound),
                            "ns": round(took), "ratio": round(bound / took, 2)})  # fmt: skip
    return out


# --- 2. another driver's GETs under the worst bodies ---------------------------------------------


def _policies(only: set[str]) -> list[tuple[str, str, bool]]:
    """(name, policy file or packaged name, whether the load-time limit is lifted)."""
    found = [("default", "packaged:default", False)]
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        if not path.stem.endswith("_test"):
            found.append((path.stem, str(path), False))
    found.append(("map-filter", "MAP_FILTER", True))
    return [entry for entry in found if not only or entry[0] in only]


def _cases(policy_file: str) -> list[dict[str, Any]]:
    test = Path(policy_file.replace(".yaml", "_test.yaml"))
    if policy_file.startswith("packaged:"):
        test = ROOT / "policies" / "default_test.yaml"
    if not test.exists():
        return []
    return list(yaml.safe_load(test.read_text()).get("cases", ()))


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"n": 2**100}
    for _ in range(levels):
        value = {"x": value}
    return value


def _set(obj: Any, steps: tuple[str, ...], make: Any) -> None:
    """Set the value at ``steps`` (creating mappings on the way; through lists, in each
    element) to ``make(current)``."""
    if not steps:
        return
    step, rest = steps[0], steps[1:]
    if step == EACH:
        if isinstance(obj, list):
            for item in obj:
                _set(item, rest, make)
        return
    if not isinstance(obj, dict):
        return
    if not rest:
        obj[step] = make(obj.get(step))
        return
    if rest[0] == EACH and not isinstance(obj.get(step), list):
        obj[step] = [{}]
    elif rest[0] != EACH and not isinstance(obj.get(step), dict):
        obj[step] = {}
    _set(obj[step], rest, make)


def _attacks(policy: Any, policy_file: str) -> list[tuple[str, str, str, bytes]]:
    """(label, driver, path, body) of the worst bodies for ``policy``'s CEL: for each kind, a
    create its own tests allow makes the template (one of a version with CEL, if any)."""
    templates: dict[str, tuple[bool, str, str, dict[str, Any], Any]] = {}
    for case in _cases(policy_file):
        request, expect = case.get("request", {}), case.get("expect", {})
        body = request.get("body")
        if request.get("method") != "POST" or not expect.get("allowed"):
            continue
        if not isinstance(body, dict):
            continue
        group, _, version = body.get("apiVersion", "v1").rpartition("/")
        resource = request["path"].rstrip("/").split("/")[-1]
        spec = policy.kinds.get((group, resource))
        cel = None
        for entry in spec.entries if spec is not None else ():
            if version in entry.versions and entry.versions[version].cel:
                cel = entry.versions[version].cel
        driver = case.get("driver") or min(policy.drivers, default=None)
        if driver is None:  # a policy that names no driver (one for any, or included)
            continue
        if resource not in templates or (cel is not None and not templates[resource][0]):
            templates[resource] = (cel is not None, driver, request["path"], body, cel)
    out = []
    for resource, (_, driver, path, body, cel) in sorted(templates.items()):
        paths = frozenset().union(*cel.analysis.paths.values()) if cel else frozenset()
        for kind, make in (("deep", _deep_body), ("wide", _wide_body), ("long", _long_body)):
            made = make(json.loads(json.dumps(body)), paths)
            made.setdefault("metadata", {}).pop("name", None)
            made["metadata"]["generateName"] = "bench-"
            out.append((f"{resource} {kind}", driver, path, json.dumps(made).encode()))
    return out


def _deep_body(body: dict[str, Any], paths: frozenset[Any]) -> dict[str, Any]:
    spec = body.setdefault("spec", {})
    spec["benchDeep"] = _deep(90)
    for _root, steps in paths:  # beside each mapping the CEL reads
        if steps and EACH not in steps:
            _set(body, (*steps[:-1], "benchDeep"), lambda _: _deep(90))
    body.setdefault("metadata", {})["annotations"] = {"bench/pad": "p" * 1_000_000}
    return body


def _wide_body(body: dict[str, Any], paths: frozenset[Any]) -> dict[str, Any]:
    for _root, steps in sorted(paths, key=lambda p: len(p[1])):
        if EACH in steps:
            cut = steps[: steps.index(EACH)]
            _set(body, cut, lambda v: [v[0] if isinstance(v, list) and v else {}] * 9_999)
    return body


def _long_body(body: dict[str, Any], paths: frozenset[Any]) -> dict[str, Any]:
    for _root, steps in paths:
        if steps and EACH not in steps:
            _set(body, steps, lambda v: v + "x" * (1 << 20) if isinstance(v, str) else v)
    return body


async def _gets(work: Path, seconds: float, workers: int) -> dict[str, Any]:
    """The quiet driver's pinned list, as ``bench/isolation_bench.py`` measures it."""
    connector = aiohttp.UnixConnector(path=str(work / "sockets" / NIC / "api.sock"), limit=0)
    async with aiohttp.ClientSession(base_url="http://localhost", connector=connector) as nic:
        return await steady(nic, seconds, workers)


async def _attack(work: str, attacks: list[Any], seconds: float, out: Any) -> None:
    codes: Counter[str] = Counter()
    took: list[float] = []
    deadline = time.monotonic() + seconds
    sessions: dict[str, aiohttp.ClientSession] = {}
    for _, driver, _, _ in attacks:
        if driver not in sessions:
            path = Path(work) / "sockets" / driver / "api.sock"
            connector = aiohttp.UnixConnector(path=str(path), limit=0)
            sessions[driver] = aiohttp.ClientSession(
                base_url="http://localhost", connector=connector
            )

    async def worker(offset: int) -> None:
        index = offset
        while time.monotonic() < deadline:
            label, driver, path, body = attacks[index % len(attacks)]
            index += 1
            began = time.perf_counter()
            headers = {"Content-Type": "application/json"}
            async with sessions[driver].post(path, data=body, headers=headers) as response:
                await response.read()
                codes[f"{label}: {response.status}"] += 1
            took.append(time.perf_counter() - began)

    await asyncio.gather(*(worker(i) for i in range(4)))
    for session in sessions.values():
        await session.close()
    took.sort()
    out.put({"codes": dict(codes), "requests": len(took),
             "p50_ms": round(took[len(took) // 2] * 1000, 1) if took else None})  # fmt: skip


def _attack_process(work: str, attacks: list[Any], seconds: float, out: Any) -> None:
    asyncio.run(_attack(work, attacks, seconds, out))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(policy_file: Path, lifted: bool, work: Path, drivers: list[str]) -> tuple[Any, Any, int]:
    """The embedded API server and the gatekeeper, each in a process of its own."""
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-c", _UPSTREAM, str(policy_file), str(upstream_port)],
        stderr=subprocess.DEVNULL,
    )
    kubeconfig = token_kubeconfig(work / "kubeconfig", f"http://127.0.0.1:{upstream_port}", TOKEN)
    health = free_port()
    lift = (
        "import gatekeeper.policy.cel._analysis as r; r.COST_LIMIT = float('inf'); "
        if lifted
        else ""
    )
    extra = [arg for driver in drivers for arg in ("--driver", driver)]
    gatekeeper = subprocess.Popen(
        [sys.executable, "-c", lift + "from gatekeeper.cli.main import main; main()", "serve",
         "--node-name", NODE, "--policy", str(policy_file), "--driver", NIC, *extra,
         "--socket-dir", str(work / "sockets"), "--kubeconfig", kubeconfig,
         "--health-listen", f"127.0.0.1:{health}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return upstream, gatekeeper, health


_UPSTREAM = """
import asyncio, sys
from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
import gatekeeper.policy.cel._analysis as r
r.COST_LIMIT = float('inf')
async def run():
    server = APIServer(served_kinds(load_policy(sys.argv[1])), token="bench-token")
    await server.start(port=int(sys.argv[2]))
    for n in range(5):
        nic = resource_slice(f"nic-{n}", driver="nic.example.com", node="node-a", pool="node-a")
        server.add(nic)
    await asyncio.Event().wait()
asyncio.run(run())
"""


async def _one_policy(name: str, source: str, lifted: bool, seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gk-celbench-"))
    policy_file = work / "policy.yaml"
    if source == "MAP_FILTER":
        policy_file.write_text(MAP_FILTER)
        template_file = str(ROOT / "policies" / "default.yaml")
    elif source.startswith("packaged:"):
        policy_file.write_text(
            f"apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ninclude: [{source}]\n"
        )
        template_file = source
    else:
        policy_file = Path(source)
        template_file = source
    with patch("gatekeeper.policy.cel._analysis.COST_LIMIT", float("inf")):
        policy = load_policy(str(policy_file))
    attacks = _attacks(policy, template_file)
    if not attacks:  # no CEL and no test case: the slices of the default policy's tests
        attacks = _attacks(policy, str(ROOT / "policies" / "default.yaml"))
    drivers = sorted({driver for _, driver, _, _ in attacks} - policy.drivers)
    upstream, gatekeeper, health = _start(policy_file, lifted, work, drivers)
    result: dict[str, Any] = {"policy": name, "attacks": [a[0] for a in attacks]}
    try:
        await wait_ready(health, tries=600)
        result["quiet"] = await _gets(work, seconds, 4)
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        attacker = context.Process(
            target=_attack_process, args=(str(work), attacks, seconds + 2, out)
        )
        cpu_before = _cpu_seconds(gatekeeper.pid)
        attacker.start()
        await asyncio.sleep(1.0)
        result["under_attack"] = await _gets(work, seconds, 4)
        result["attacker"] = await asyncio.to_thread(out.get, True, 120)
        attacker.join(30)
        spent = _cpu_seconds(gatekeeper.pid) - cpu_before
        result["gatekeeper_cpu_ms_per_attack"] = round(
            1000 * spent / max(1, result["attacker"]["requests"]), 1
        )
        result["parse_ms"] = {label: round(_parse_ms(body), 1) for label, _, _, body in attacks}
        quiet, loud = result["quiet"]["p99_ms"], result["under_attack"]["p99_ms"]
        result["p99_ratio"] = round(loud / quiet, 2) if quiet else None
    finally:
        gatekeeper.terminate()
        upstream.terminate()
        gatekeeper.wait(30)
        upstream.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return result


def _parse_ms(body: bytes) -> float:
    started = time.perf_counter()
    decode_body(body, "application/json", patch=False)
    return (time.perf_counter() - started) * 1000


async def isolation(seconds: float, only: set[str]) -> list[dict[str, Any]]:
    results = []
    for name, source, lifted in _policies(only):
        result = await _one_policy(name, source, lifted, seconds)
        print(json.dumps(result), file=sys.stderr, flush=True)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", default="", help="comma list of policy names (isolation)")
    parser.add_argument("--skip-calibration", action="store_true")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    report: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    if not args.skip_calibration:
        report["calibration"] = calibrate()
        for row in report["calibration"]:
            print(json.dumps(row), file=sys.stderr)
    only = {name for name in args.only.split(",") if name}
    report["isolation"] = asyncio.run(isolation(args.seconds, only))
    report["loadavg_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
