"""``audit check`` decides CEL rules and every rule of the language as ``serve`` did: the events
the rules test file's requests left (token callers included) are re-decided with no change, and
a tightened validation shows as a change that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatekeeper.audit import AuditLevel
from gatekeeper.audit.tools.check import check_records
from gatekeeper.audit.tools.reader import FINAL_STAGES, to_record
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.policytest import Harness, load_test_file

RULES = Path(__file__).resolve().parents[2] / "policy" / "rules"


async def _events(level: AuditLevel = AuditLevel.REQUEST_RESPONSE) -> list[dict[str, Any]]:
    test_file = load_test_file(str(RULES / "rules_test.yaml"))
    events: list[dict[str, Any]] = []
    async with Harness(test_file, level) as harness:
        for case in test_file.cases:
            outcome = await harness.run(case)
            assert not outcome.error, case.name
            events += harness.events
    return events


async def test_the_rules_events_are_re_decided_without_a_change() -> None:
    records = [to_record(e, {}) for e in await _events() if e["stage"] in FINAL_STAGES]
    assert any(r.token_user is not None for r in records)  # token callers are in the log
    report = check_records(records, load_policy(str(RULES / "rules.yaml")))
    assert report.changes == []
    assert sum(report.decided.values()) >= 30


async def test_a_metadata_level_log_changes_nothing_it_cannot_know() -> None:
    """Without bodies and objects, a write is decided on metadata (the object assumed the
    caller's, the caller's own pod its token's), and a CEL-scoped object is never assumed."""
    events = await _events(AuditLevel.METADATA)
    records = [to_record(e, {}) for e in events if e["stage"] in FINAL_STAGES]
    report = check_records(records, load_policy(str(RULES / "rules.yaml")))
    assert report.changes == []
    assert report.decided["metadata"] > 0


async def test_a_tightened_validation_is_a_change_naming_it() -> None:
    records = [to_record(e, {}) for e in await _events() if e["stage"] in FINAL_STAGES]
    text = (
        (RULES / "rules.yaml")
        .read_text()
        .replace(
            "expression: object.?reportingComponent.orValue('') == variables.driver",
            "expression: object.?reportingComponent.orValue('') == 'nobody'",
        )
    )
    stricter = parse_policy(text, "stricter.yaml", directory=str(RULES))
    report = check_records(records, stricter)
    changed = [(c.record.request_uri, c.after, c.reason) for c in report.changes]
    assert changed == [
        (
            "/api/v1/namespaces/gpu-system/events",
            "forbid",
            "events v1 reports-itself: an event names the driver as its reportingComponent",
        )
    ]
