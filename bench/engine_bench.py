"""The decision engine alone (plan + decide): µs per decision, per kind and verb (no I/O).

python -m bench.engine_bench [--rounds N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.fixtures import DRIVER, NODE, PINNED_QUERY, SLICES, item_slice, slice_body
from gatekeeper.listen.identity import Identity
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine
from gatekeeper.policy.decision import Decision
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request

__all__ = ["CASES", "EngineResult", "measure_engine"]

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"


def _claim(status_devices: bool = False) -> dict[str, Any]:
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
                    ]
                },
                "nodeSelector": selector,
            }
        },
    }
    if status_devices:
        obj["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": NODE,
                "device": "gpu-0",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        ]
    return obj


def _pool(name: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
        "kind": "DevicePool",
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": NODE},
    }


@dataclass(frozen=True, slots=True)
class _Case:
    name: str
    method: str
    path: str
    body: Any = None
    current: Any = None
    media_type: str = "application/json"
    allowed: bool = True


def _cases() -> list[_Case]:
    item = f"{SLICES}/{NODE}-bench"
    wrong_pool = slice_body(f"{NODE}-x")
    wrong_pool["spec"]["pool"]["name"] = "other-gpus"
    return [
        _Case("slice get (stored object checked)", "GET", item, current=item_slice()),
        _Case("slice create (2 KB)", "POST", SLICES, body=slice_body(f"{NODE}-new")),
        _Case("slice update (old + new)", "PUT", item, body=item_slice(), current=item_slice()),
        _Case(
            "slice merge patch",
            "PATCH",
            item,
            body={"spec": {"devices": []}},
            current=item_slice(),
            media_type="application/merge-patch+json",
        ),
        _Case("slice delete", "DELETE", item, current=item_slice()),
        _Case("slice list (pinned selector)", "GET", f"{SLICES}?{PINNED_QUERY}"),
        _Case("slice watch (pinned selector)", "GET", f"{SLICES}?watch=true&{PINNED_QUERY}"),
        _Case("slice create refused (pool)", "POST", SLICES, body=wrong_pool, allowed=False),
        _Case("claim get (allocation scope)", "GET", f"{CLAIMS}/c1", current=_claim()),
        _Case(
            "claim status update",
            "PUT",
            f"{CLAIMS}/c1/status",
            body=_claim(status_devices=True),
            current=_claim(),
        ),
        _Case("devicepool create", "POST", POOLS, body=_pool()),
    ]


CASES = _cases()


@dataclass(frozen=True, slots=True)
class EngineResult:
    name: str
    decide_us: float
    parse_us: float
    allowed: bool


def _time(fn: Callable[[], Any], rounds: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def measure_engine(rounds: int = 20_000, repeats: int = 3) -> list[EngineResult]:
    """Best of ``repeats`` timings of ``rounds`` decisions per case (parse timed apart)."""
    engine = Engine(load_policy(None).with_drivers(frozenset({DRIVER})), NODE)
    who = Identity(DRIVER, ListenerKind.UNIX)
    results = []
    for case in CASES:
        info = parse_request(case.method, case.path)

        def decide(case: _Case = case, info: Any = info) -> Any:
            plan = engine.plan(who, info, case.media_type)
            if isinstance(plan, Decision):
                return plan
            return engine.decide(plan, case.body, case.current)

        def parse(case: _Case = case) -> Any:
            return parse_request(case.method, case.path)

        decision = decide()
        if decision.allowed != case.allowed:
            raise AssertionError(f"{case.name}: engine says {decision.reason}")
        results.append(
            EngineResult(
                case.name,
                min(_time(decide, rounds) for _ in range(repeats)),
                min(_time(parse, rounds) for _ in range(repeats)),
                decision.allowed,
            )
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    for result in measure_engine(args.rounds):
        print(
            f"{result.name:36s} decide {result.decide_us:6.1f} µs  parse {result.parse_us:5.1f} µs"
        )


if __name__ == "__main__":
    main()
