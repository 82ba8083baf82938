"""``audit summarize``: allowed/refused counts per (driver, verb, resource), top refusal reasons."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.audit.tools.reader import FINAL_STAGES, ReadStats, decision_of, resource_key
from gatekeeper.policy.decision import NOT_FOUND
from gatekeeper.types import DRIVERS_GROUP

__all__ = ["Row", "Summary", "format_table", "summarize", "summary_json"]

_TOP_REASONS = 10


@dataclass(slots=True)
class Row:
    """Counts for one (driver, verb, resource)."""

    allowed: int = 0
    refused: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Summary:
    rows: dict[tuple[str, str, str], Row] = field(default_factory=dict)
    requests: int = 0
    started: str = ""
    ended: str = ""
    skipped_users: int = 0
    """Requests of users that ``--driver-user`` did not map (apiserver logs, when mapping)."""

    @property
    def reasons(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for row in self.rows.values():
            total.update(row.reasons)
        return total


def summarize(events: Iterable[Mapping[str, Any]], driver_users: Mapping[str, str]) -> Summary:
    """Count finished requests. With ``driver_users``, apiserver users outside it are skipped;
    without, an apiserver event's username stands for the driver."""
    summary = Summary()
    rows = summary.rows
    started, ended = "~", ""
    for event in events:
        if event.get("stage") not in FINAL_STAGES:
            continue
        user = event.get("user") or {}
        driver = user.get("username", "")
        if DRIVERS_GROUP not in (user.get("groups") or ()) and driver_users:
            driver = driver_users.get(driver)
            if driver is None:
                summary.skipped_users += 1
                continue
        key = (
            driver,
            event.get("verb", ""),
            resource_key(event.get("objectRef"), event.get("requestURI", "")),
        )
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row()
        decision, reason = decision_of(event)
        if decision == "allow" or _absent(event, reason):
            row.allowed += 1
        else:
            row.refused += 1
            row.reasons[reason or "(no reason recorded)"] += 1
        summary.requests += 1
        received = event.get("requestReceivedTimestamp", "")
        if received and received < started:
            started = received
        stage_time = event.get("stageTimestamp", "")
        if stage_time > ended:
            ended = stage_time
    summary.started = "" if started == "~" else started
    summary.ended = ended
    return summary


def _absent(event: Mapping[str, Any], reason: str) -> bool:
    """A 404 for an object that does not exist: the apiserver's answer, not a refusal."""
    return reason == NOT_FOUND and (event.get("responseStatus") or {}).get("code") == 404


def summary_json(summary: Summary, stats: ReadStats) -> dict[str, Any]:
    """The ``--output json`` document."""
    return {
        "requests": summary.requests,
        "events": stats.events,
        "malformedLines": stats.malformed,
        "skippedUsers": summary.skipped_users,
        "from": summary.started,
        "to": summary.ended,
        "rows": [
            {
                "driver": driver,
                "verb": verb,
                "resource": resource,
                "allowed": row.allowed,
                "refused": row.refused,
                "reasons": dict(row.reasons.most_common()),
            }
            for (driver, verb, resource), row in sorted(summary.rows.items())
        ],
        "topReasons": [
            {"reason": reason, "count": count}
            for reason, count in summary.reasons.most_common(_TOP_REASONS)
        ],
    }


def format_table(summary: Summary, stats: ReadStats) -> str:
    """The ``--output table`` text."""
    header = ("DRIVER", "VERB", "RESOURCE", "ALLOWED", "REFUSED", "TOP REFUSAL REASON")
    lines: list[tuple[str, ...]] = [header]
    for (driver, verb, resource), row in sorted(summary.rows.items()):
        top = row.reasons.most_common(1)
        lines.append(
            (driver, verb, resource, str(row.allowed), str(row.refused), top[0][0] if top else "")
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in lines
    ]
    out = [line.rstrip() for line in out]
    allowed = sum(row.allowed for row in summary.rows.values())
    out.append("")
    out.append(
        f"{summary.requests} requests ({allowed} allowed, {summary.requests - allowed} refused) "
        f"from {summary.started or '-'} to {summary.ended or '-'}"
    )
    if stats.malformed:
        out.append(f"{stats.malformed} unparseable lines skipped (first: {stats.first_malformed})")
    if summary.skipped_users:
        out.append(f"{summary.skipped_users} requests of users not named by --driver-user skipped")
    top = summary.reasons.most_common(_TOP_REASONS)
    if top:
        out.append("")
        out.append("Top refusal reasons:")
        out.extend(f"{count:>8}  {reason}" for reason, count in top)
    return "\n".join(out) + "\n"
