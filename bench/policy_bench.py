"""The engine's cost per request under each shipped policy: every case of every policy test file
(policies/*_test.yaml, tests/policy/rules) decided offline, as the proxy's engine conversation
decides it, CEL included; µs per decision, and the RSS the CEL runtime adds.

python -m bench.policy_bench [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import Refusal
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine
from gatekeeper.policytest import TestCase, TestFile, load_test_file
from gatekeeper.request.requestinfo import RequestInfo, parse_request
from gatekeeper.testing.harness import decide_offline
from gatekeeper.types import Identity, UserInfo

__all__ = ["PolicyCost", "measure_policy"]

ROOT = Path(__file__).resolve().parents[1]
TARGET_US = 40.0
"""The per-request engine cost the shipped policies must stay under (issue target)."""


@dataclass(frozen=True, slots=True)
class PolicyCost:
    policy: str
    cases: int
    cel: bool
    median_us: float
    p95_us: float
    max_us: float
    worst_case: str


def _identity(case: TestCase, node: str) -> Identity:
    token = case.token
    if token is None:
        return Identity(case.driver, ListenerKind.UNIX)
    extra = {"authentication.kubernetes.io/node-name": (token.node or node,)}
    if token.pod:
        extra["authentication.kubernetes.io/pod-name"] = (token.pod,)
        extra["authentication.kubernetes.io/pod-uid"] = ("uid-" + token.pod,)
    user = UserInfo(token.user, "uid-sa", ("system:serviceaccounts", "system:authenticated"), extra)
    return Identity(case.driver, ListenerKind.TOKEN, user=user)


def _stored(case: TestCase, info: RequestInfo) -> dict[str, Any] | None:
    for obj, _ in case.existing:
        meta = obj.get("metadata") or {}
        if meta.get("name") == info.name and meta.get("namespace", "") == info.namespace:
            stored = json.loads(json.dumps(obj))
            stored["metadata"].setdefault("resourceVersion", "7")
            stored["metadata"].setdefault("uid", "uid-" + str(info.name))
            return stored
    return None


def _inputs(test_file: TestFile, case: TestCase) -> tuple[Identity, RequestInfo, Any, Any, str]:
    request = case.request
    info = parse_request(request.method, request.target)
    headers = {k.lower(): v for k, v in request.headers}
    media = headers.get("content-type", "application/json")
    body = json.loads(request.body) if request.body else None
    return _identity(case, test_file.node), info, body, _stored(case, info), media


def measure_policy(path: Path, rounds: int) -> PolicyCost:
    """Decide every case of the test file at ``path`` ``rounds`` times; the cost per decision."""
    test_file = load_test_file(str(path))
    engine = Engine(test_file.policy, test_file.node, node_labels=dict(test_file.node_labels))
    timings: list[tuple[float, str]] = []
    for case in test_file.cases:
        try:
            identity, info, body, current, media = _inputs(test_file, case)
        except (Refusal, ValueError):
            continue  # refused before the engine (the path or the body): no engine cost
        decide_offline(engine, identity, info, body, current, media_type=media)  # warm up
        started = time.perf_counter()
        for _ in range(rounds):
            decide_offline(engine, identity, info, body, current, media_type=media)
        timings.append(((time.perf_counter() - started) / rounds * 1e6, case.name))
    values = sorted(us for us, _ in timings)
    worst = max(timings)
    cel = any(
        entry_version.cel
        for kind in test_file.policy.kinds.values()
        for entry in kind.entries
        for entry_version in entry.versions.values()
    )
    return PolicyCost(
        str(path.relative_to(ROOT)),
        len(values),
        cel,
        statistics.median(values),
        values[int(0.95 * (len(values) - 1))],
        worst[0],
        worst[1],
    )


def _rss_mb(code: str) -> float:
    """Peak RSS of a fresh interpreter running ``code`` (MB): its own VmHWM (ru_maxrss would
    count the forking parent's pages, which a child inherits until it execs)."""
    probe = "import re;print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    out = subprocess.run(
        [sys.executable, "-c", code + "\n" + probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return int(out.stdout.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", help="also write the results here")
    ns = parser.parse_args(argv)
    files = sorted((ROOT / "policies").glob("*_test.yaml")) + sorted(
        (ROOT / "tests" / "policy" / "rules").glob("*_test.yaml")
    )
    results = [measure_policy(path, ns.rounds) for path in files]
    print(
        f"{'policy test file':48} {'cases':>5} {'CEL':>4} {'p50 µs':>8} {'p95 µs':>8} {'max µs':>8}"
    )
    for r in results:
        print(f"{r.policy:48} {r.cases:5} {'yes' if r.cel else 'no':>4} {r.median_us:8.1f} "
              f"{r.p95_us:8.1f} {r.max_us:8.1f}  ({r.worst_case})")  # fmt: skip
    over = [r for r in results if r.median_us > TARGET_US]
    load = "from gatekeeper.policyfile import load_policy\n"
    without = _rss_mb(load + "load_policy(None)")
    with_cel = _rss_mb(load + f"load_policy({str(ROOT / 'tests/policy/rules/rules.yaml')!r})")
    print(f"RSS after loading a policy: without CEL {without:.1f} MB, with CEL {with_cel:.1f} MB "
          f"(+{with_cel - without:.1f} MB)")  # fmt: skip
    if ns.json:
        Path(ns.json).write_text(json.dumps(
            {"results": [_as_dict(r) for r in results],
             "rss_mb": {"without_cel": without, "with_cel": with_cel}}, indent=2))  # fmt: skip
    print(f"median over {TARGET_US:g} µs: {', '.join(r.policy for r in over) or 'none'}")
    return 1 if over else 0


def _as_dict(result: PolicyCost) -> dict[str, Any]:
    return {name: getattr(result, name) for name in PolicyCost.__dataclass_fields__}


if __name__ == "__main__":
    sys.exit(main())
