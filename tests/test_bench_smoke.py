"""The benchmark's smoke profile runs end to end and produces numbers (no thresholds: speed is
measured by ``bench/run.py``, never asserted in a test)."""

from __future__ import annotations

from bench.report import render
from bench.run import Profile, run


def test_smoke_profile_runs_and_produces_numbers() -> None:
    report = run(Profile.smoke(), log=lambda _line: None)

    throughput = report["throughput"]
    assert set(throughput) == {"get", "create", "update", "list"}
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
