"""The audit events of every case of tests/policy/rules/rules_test.yaml (every rule of the policy
language, allowed and refused, token callers included), as the real pipeline logs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatekeeper.audit import AuditLevel
from gatekeeper.policytest import Harness, load_test_file
from tests.paths import REPO

__all__ = ["RULES_POLICY", "rules_events"]

RULES_POLICY = REPO / "tests" / "policy" / "rules" / "rules.yaml"


async def rules_events(level: AuditLevel) -> list[dict[str, Any]]:
    """Every event the rules test file's requests leave at ``level``, in order."""
    test_file = load_test_file(str(Path(RULES_POLICY).with_name("rules_test.yaml")))
    events: list[dict[str, Any]] = []
    async with Harness(test_file, level) as harness:
        for case in test_file.cases:
            outcome = await harness.run(case)
            assert not outcome.error, case.name
            events += harness.events
    return events
