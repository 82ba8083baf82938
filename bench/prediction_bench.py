"""What one write costs the engine's whole conversation, offline (plan, read the body, the
prediction of what the apiserver will store, decide): a merge and a JSON patch of a 2 KB
ResourceSlice, a 2 KB create and update. ``--gatekeeper-src DIR`` runs the same measurement on
another tree too (e.g. ``git archive main gatekeeper | tar -x -C DIR``), each side in its own
process, interleaved, for a before/after ratio in one run.

python -m bench.prediction_bench [--rounds N] [--repeats N] [--gatekeeper-src DIR] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.fixtures import DRIVER, NODE, ROOT, SLICES, item_slice, slice_body
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine
from gatekeeper.policy.conversation import conversation, converse
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.types import Identity

__all__ = ["measure"]

_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_JSON = "application/json"


def _cases() -> dict[str, tuple[str, str, str, Any, Any]]:
    """name → (method, path, media type, body, stored object)."""
    name = f"{NODE}-gpu-0"
    stored = item_slice(name, rv=7)
    path = f"{SLICES}/{name}"
    updated = copy.deepcopy(stored)
    updated["metadata"]["labels"] = {"example.com/bench": "1"}
    return {
        "merge patch, 2 KB slice": (
            "PATCH", path, _MERGE, {"metadata": {"labels": {"example.com/bench": "1"}}}, stored,
        ),
        "JSON patch, 2 KB slice": (
            "PATCH", path, _JSON_PATCH,
            [{"op": "add", "path": "/metadata/labels", "value": {"example.com/bench": "1"}}],
            stored,
        ),
        "create, 2 KB slice": ("POST", SLICES, _JSON, slice_body(name), None),
        "update, 2 KB slice": ("PUT", path, _JSON, updated, stored),
    }  # fmt: skip


def _best_us(fn: Callable[[], Any], rounds: int, chunks: int = 5) -> float:
    """Microseconds per call: the best of ``chunks`` runs of ``rounds / chunks`` calls (the
    neighbours' load only ever adds time)."""
    fn()
    each = max(rounds // chunks, 1)
    best = float("inf")
    for _ in range(chunks):
        start = time.perf_counter()
        for _ in range(each):
            fn()
        best = min(best, (time.perf_counter() - start) / each)
    return best * 1e6


def measure(rounds: int = 5_000) -> dict[str, float]:
    """Microseconds per decision of each case, by this process's ``gatekeeper``."""
    engine = Engine(load_policy(None).with_drivers(frozenset({DRIVER})), NODE)
    who = Identity(DRIVER, ListenerKind.UNIX)
    results = {}
    for name, (method, path, media_type, body, stored) in _cases().items():
        info = parse_request(method, path)

        def decide(info: Any = info, media_type: str = media_type, body: Any = body,
                   stored: Any = stored) -> Any:  # fmt: skip
            return converse(
                conversation(engine, who, info),
                body=lambda: (media_type, body),
                fetch=lambda _path: stored,
                preview=lambda asked: asked,
            )

        decision = decide()
        if not decision.allowed:
            raise AssertionError(f"{name}: {decision.reason}")
        results[name] = _best_us(decide, rounds)
    return results


def _in_process(source: str | None, rounds: int) -> dict[str, float]:
    """:func:`measure` in a fresh process, with ``gatekeeper`` from ``source`` (this tree's
    bench either way)."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as shim:
        path = [str(ROOT)]
        if source:
            Path(shim, "gatekeeper").symlink_to(Path(source, "gatekeeper").resolve())
            path.insert(0, shim)
        env["PYTHONPATH"] = os.pathsep.join(path)
        out = subprocess.run(
            [sys.executable, "-m", "bench.prediction_bench", "--inner", "--rounds", str(rounds)],
            env=env, cwd=shim, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        measured: dict[str, Any] = json.loads(out)
        where = Path(source or ROOT, "gatekeeper").resolve()
        if Path(measured.pop("gatekeeper")).resolve() != where:
            raise AssertionError(f"measured another gatekeeper than {where}")
    return measured


def compare(source: str | None, rounds: int, repeats: int) -> dict[str, Any]:
    """Medians of ``repeats`` interleaved runs of this tree and of ``source`` (when given)."""
    sides: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for _ in range(repeats):
        sides["this"].append(_in_process(None, rounds))
        if source:
            sides["other"].append(_in_process(source, rounds))
    report: dict[str, Any] = {"load_before": os.getloadavg()[0], "rounds": rounds, "cases": {}}
    for case in sides["this"][0]:
        this = statistics.median(run[case] for run in sides["this"])
        row = {"this_us": round(this, 1)}
        if source:
            other = statistics.median(run[case] for run in sides["other"])
            row |= {"other_us": round(other, 1), "this_over_other": round(this / other, 3)}
        report["cases"][case] = row
    report["load_after"] = os.getloadavg()[0]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gatekeeper-src", help="also measure this source tree's gatekeeper")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        import gatekeeper

        where = str(Path(gatekeeper.__file__).parent)
        print(json.dumps({**measure(args.rounds), "gatekeeper": where}))
        return
    report = compare(args.gatekeeper_src, args.rounds, args.repeats)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print("| case | this µs | other µs | this ÷ other |\n|---|---:|---:|---:|")
    for case, row in report["cases"].items():
        print(
            f"| {case} | {row['this_us']} | {row.get('other_us', '-')} | "
            f"{row.get('this_over_other', '-')} |"
        )
    print(f"\nload average {report['load_before']:.1f} → {report['load_after']:.1f}")


if __name__ == "__main__":
    main()
