"""The benchmark's smoke profile runs end to end and produces numbers (no thresholds: speed is
measured by ``bench/run.py``, never asserted in a test)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

from bench.fixtures import (
    COUNTER_WIDTH,
    ROOT,
    SLICES,
    counted_slice_protobuf,
    slice_body,
    slice_protobuf,
)
from bench.loadgen import Target, Workload, _request_bytes
from bench.report import render
from bench.run import Profile, run
from gatekeeper.codec.kubeproto import read_envelope


def test_smoke_profile_runs_and_produces_numbers() -> None:
    report = run(Profile.smoke(), log=lambda _line: None)

    throughput = report["throughput"]
    assert set(throughput) == {"get", "create", "create-pb", "update", "update-pb", "list"}
    for by_concurrency in throughput.values():
        for row in by_concurrency.values():
            assert {"direct", "gatekeeper", "gatekeeper-unix", "naive"} <= set(row)
            for target, cell in row.items():
                assert cell["rps"] > 0, target
                # Every answer was a success: a refusal would make the numbers meaningless.
                assert cell["errors"] == 0, (target, cell["statuses"])
    assert all(row["decide_us"] > 0 for row in report["engine"])
    resources = report["resources"]
    assert resources["rss_idle_mb"] > 0
    assert resources["big_list_mb"] > 1
    assert resources["watches_open"] > 0
    assert resources["delay_ms"]["gatekeeper"][0] > 0
    assert report["audit_writer_events_per_s"] > 0
    assert "| c |" in render(report)
    assert "JSON vs protobuf" in render(report)


def test_protobuf_bodies_are_client_gos_bytes() -> None:
    """The protobuf workloads send what client-go 1.36 sends: the bench's encoder writes the
    recorded bytes of the same object (recording 207), and an update's name and version where
    client-go put them (recording 209, whose managedFields it does not encode)."""
    recorded = _recording("207-")
    assert slice_protobuf(recorded["request_object"]) == _body(recorded)
    update = _recording("209-")
    obj = update["request_object"]
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    mine = read_envelope(slice_protobuf({**obj, "metadata": meta}))
    theirs = read_envelope(_body(update))
    assert (mine.name, mine.resource_version) == (theirs.name, theirs.resource_version)


def test_numbered_protobuf_create_keeps_its_length_prefixes() -> None:
    template = counted_slice_protobuf("node-a-w-")
    workload = Workload("x", "POST", SLICES, template, counter_width=COUNTER_WIDTH)
    sent = _request_bytes(Target("t"), workload, 1_234).split(b"\r\n\r\n", 1)[1]
    assert read_envelope(sent).name == "node-a-w-000000001234"
    assert sent == slice_protobuf(slice_body("node-a-w-000000001234"))


def _recording(prefix: str) -> dict[str, Any]:
    (path,) = (ROOT / "tests" / "recordings").glob(f"{prefix}*.json")
    return json.loads(path.read_text())


def _body(recording: dict[str, Any]) -> bytes:
    return base64.b64decode(recording["request_body"])


REAL_TIER = {"realcluster_latency", "token_flood_bench"}
"""Benchmarks of the real tier: they drive its harness (tests/realcluster), a test tier."""

_BLOCKED = """
import importlib, sys
class _NoTests:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tests", "pytest", "hypothesis"):
            raise ImportError(f"{name}: the benchmark imports no test module")
sys.meta_path.insert(0, _NoTests())
sys.path.insert(0, sys.argv[1])
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def test_the_benchmark_imports_no_test_module() -> None:
    """bench/ runs from the package and its own fixtures: with tests/, pytest and hypothesis
    not importable, every benchmark module (the real tier's aside) still imports."""
    modules = sorted(
        f"bench.{path.stem}" for path in (ROOT / "bench").glob("*.py") if path.stem not in REAL_TIER
    )
    assert "bench.fixtures" in modules and "bench.run" in modules
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED, str(ROOT), *modules],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
