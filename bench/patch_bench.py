"""What a JSON patch costs the gatekeeper's engine (issue 39, item 0): the patch of doubling
copies against an ordinary patch, in one run; and the same copies applied without the
apiserver's bounds, as the gatekeeper applied them before (the ``jsonpatch`` library), for the
ratio. Time and peak memory (``tracemalloc``) per decision.

python -m bench.patch_bench [--rounds N]
"""

from __future__ import annotations

import argparse
import copy
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import jsonpatch

from bench.fixtures import DRIVER, NODE, SLICES, item_slice
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine
from gatekeeper.policy.decision import Decision
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.types import Identity

__all__ = ["doubling", "measure"]

_JSON_PATCH = "application/json-patch+json"


def doubling(copies: int, under: str = "/spec/pool") -> list[dict[str, Any]]:
    """Issue 39's patch: 300 bytes added to the object at ``under``, then ``copies`` copies of
    that object into itself, each doubling it (2 KB of patch for 30)."""
    ops: list[dict[str, Any]] = [{"op": "add", "path": f"{under}/blob", "value": "x" * 300}]
    return ops + [{"op": "copy", "from": under, "path": f"{under}/c{i}"} for i in range(copies)]


def _timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """Best milliseconds of ``rounds`` runs, and the peak MiB traced during one."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best * 1e3, peak / 2**20


def measure(rounds: int = 5) -> list[tuple[str, float, float, str]]:
    """(case, ms, peak MiB, outcome) for each case, all in this run."""
    engine = Engine(load_policy(None).with_drivers(frozenset({DRIVER})), NODE)
    who = Identity(DRIVER, ListenerKind.UNIX)
    stored = item_slice(f"{NODE}-gpu-0")
    stored["metadata"]["resourceVersion"] = "7"
    path = f"{SLICES}/{NODE}-gpu-0"

    def decide(patch: Any) -> Decision:
        plan = engine.plan(who, parse_request("PATCH", path), _JSON_PATCH)
        assert not isinstance(plan, Decision), plan
        return engine.decide(plan, patch, stored)

    ordinary = [
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
        {"op": "replace", "path": "/spec/pool/generation", "value": 2},
        {"op": "add", "path": "/spec/devices/-", "value": {"name": "gpu-9"}},
    ]
    rows: list[tuple[str, float, float, str]] = []
    for name, patch in [("3 ordinary operations", ordinary), ("30 doubling copies", doubling(30))]:
        ms, mib = _timed(lambda patch=patch: decide(patch), rounds)
        decision = decide(patch)
        rows.append((f"engine: {name}", ms, mib, f"{decision.code or 'allowed'}"))
    for copies in (10, 12, 14, 16):
        ms, mib = _timed(lambda copies=copies: decide(doubling(copies)), rounds)
        rows.append(
            (
                f"engine: {copies} doubling copies",
                ms,
                mib,
                f"{decide(doubling(copies)).code or 'allowed'}",
            )
        )
        ms, mib = _timed(
            lambda copies=copies: jsonpatch.apply_patch(copy.deepcopy(stored), doubling(copies)),
            rounds,
        )
        rows.append((f"unbounded (before): {copies} doubling copies", ms, mib, "applied"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| case | ms | peak MiB | outcome |\n|---|---:|---:|---|")
    for case, ms, mib, outcome in measure(args.rounds):
        print(f"| {case} | {ms:.2f} | {mib:.1f} | {outcome} |")


if __name__ == "__main__":
    main()
