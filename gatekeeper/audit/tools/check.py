"""``audit check``: re-decide every recorded request under a policy, with the proxy's engine
conversation (:mod:`gatekeeper.policy.conversation`), the log as its readers.

Prints each request whose decision (allow/forbid) changes; newly refused requests fail the check.
How each request could be decided is counted by basis (see :mod:`gatekeeper.audit.tools.replay`).
Each write the gatekeeper forwards is also judged by the policy's exported admission policy, the
apiserver's second layer (:mod:`gatekeeper.audit.tools.admission`); a write it would refuse fails
the check too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.audit.event import VALIDATION_ANNOTATION
from gatekeeper.audit.tools.admission import (
    WRITE_VERBS,
    AdmissionLayer,
    AdmissionVerdict,
    AdmissionView,
)
from gatekeeper.audit.tools.reader import Record
from gatekeeper.audit.tools.replay import (
    BASES,
    BODY_VERBS,
    ObjectMemory,
    method_of,
    patch_type,
    worst,
)
from gatekeeper.errors import Refusal
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Decision, Engine, KindRule, Policy
from gatekeeper.policy.conversation import conversation, converse
from gatekeeper.policy.decision import deny
from gatekeeper.policy.plan import Preview
from gatekeeper.request.requestinfo import RequestInfo, parse_request
from gatekeeper.types import Identity, KubeObject

__all__ = ["AdmissionRefused", "Change", "CheckReport", "check_records", "format_report"]

# Refusals made before the engine, for reasons the log does not carry (body size and media
# type, rate limits, identity): the replay cannot re-decide them.
_NOT_REPLAYABLE_CODES = frozenset({401, 413, 415, 429})
# Outcomes that are about the stored object, not authorization: the same on both sides.
_STATE_CODES = frozenset({404, 409})
_JSON = "application/json"
_PREVIEWED = frozenset({"application/apply-patch+yaml", "application/strategic-merge-patch+json"})
_UNDETERMINED = "refused before, allowed now only if the object is the caller's (not in the log)"
_FAILED_UPSTREAM = (
    "allowed before, then refused by the apiserver (a 4xx) before the object it would store was "
    "known: refused now only on the request's body, which the apiserver never stored"
)
# Refusals for what the log does not record (the gatekeeper's own reasons, DESIGN §4.5):
# re-deciding without it would allow them, a change that is not one.
_UNRECORDED = (
    (
        re.compile(r"^header \S+ is not allowed"),
        "refused for a request header (Impersonate-*, X-Remote-*, method override), "
        "which the log does not record",
    ),
    (re.compile(r"^connection upgrades"), "refused for a connection upgrade (not in the log)"),
)
_CEL_WITHOUT_OBJECT = "decided by CEL on an object the log does not carry"
_CEL_SCOPED = "cel-scoped"
_NOT_ON_NODE = "is not allowed on node"
_IMPERSONATION = deny(403, "header Impersonate-User is not allowed")


@dataclass(frozen=True, slots=True)
class Change:
    """One request whose decision differs under the new policy."""

    record: Record
    before: str
    after: str
    code: int
    reason: str
    basis: str
    admission: AdmissionView | None = None
    """The exported admission policy's verdict on a write allowed now (None otherwise)."""


@dataclass(frozen=True, slots=True)
class AdmissionRefused:
    """A request the gatekeeper allows and its exported admission policy would refuse."""

    record: Record
    view: AdmissionView


@dataclass(slots=True)
class CheckReport:
    decided: Counter[str] = field(default_factory=Counter)
    """Requests re-decided, by basis."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Requests not re-decided, by why."""
    changes: list[Change] = field(default_factory=list)
    admission: Counter[AdmissionVerdict] = field(default_factory=Counter)
    """Requests allowed now, by the exported admission policy's verdict."""
    admission_unknown: Counter[str] = field(default_factory=Counter)
    """Writes whose admission verdict is not known, by what the log lacks."""
    admission_refused: list[AdmissionRefused] = field(default_factory=list)
    admission_views: list[AdmissionRefused] = field(default_factory=list)
    """Every write judged (kept only when asked for: ``check_records(..., every=True)``)."""

    @property
    def newly_refused(self) -> list[Change]:
        return [c for c in self.changes if c.before == "allow" and c.after == "forbid"]

    @property
    def newly_allowed(self) -> list[Change]:
        return [c for c in self.changes if c.before == "forbid" and c.after == "allow"]


def check_records(
    records: Iterable[Record],
    policy: Policy,
    *,
    default_node: str | None = None,
    every: bool = False,
) -> CheckReport:
    """Re-decide ``records`` in log order under ``policy``, and judge each write allowed now by
    its exported admission policy (``every``: keep each write's verdict in the report)."""
    report = CheckReport()
    engines: dict[tuple[str, str], Engine] = {}
    memory = ObjectMemory(policy)
    layer = AdmissionLayer()
    for record in records:
        why = _skip_reason(record, default_node)
        if why:
            report.skipped[why] += 1
            continue
        assert record.driver is not None
        node = record.node or default_node or ""
        engine = _engine_for(engines, policy, record, record.driver, node)
        # Only writes reach admission: reads are not parsed twice.
        info = _info(record) if record.verb in WRITE_VERBS else None
        before = layer.before(memory, record, info, record.driver, node) if info else None
        if record.impersonated:
            # SECURITY: DESIGN §4.5 — the gatekeeper refuses Impersonate-* headers.
            decision, basis = _IMPERSONATION, "request"
        else:
            decision, basis = _decide(engine, memory, record, record.driver, node)
        after = "allow" if decision.allowed else "forbid"
        undecidable = _undecidable(record, decision, basis)
        if undecidable:
            report.skipped[undecidable] += 1
            continue
        report.decided[basis] += 1
        view = None
        if decision.allowed and info is not None and before is not None:
            view = layer.judge(engine.policy, record, info, node, before)
            _count(report, record, view, every)
        if after != record.decision and not _same_state_outcome(record, decision):
            report.changes.append(
                Change(record, record.decision, after, decision.code, decision.reason, basis, view)
            )
    return report


def _engine_for(
    engines: dict[tuple[str, str], Engine], policy: Policy, record: Record, driver: str, node: str
) -> Engine:
    """The engine that decides ``record``'s request, one per node and driver seen."""
    # The gatekeeper served this driver on its node (the policy or serve --driver), unless
    # the event itself is the refusal of a driver not allowed there.
    seen = record.source == "gatekeeper" and not (
        record.decision == "forbid" and _NOT_ON_NODE in record.reason
    )
    key = (node, driver if seen else "")
    engine = engines.get(key)
    if engine is None:
        allowed = policy.with_drivers(frozenset({driver})) if seen else policy
        engine = engines[key] = Engine(allowed, node)
    return engine


def _undecidable(record: Record, decision: Decision, basis: str) -> str | None:
    """Why the replay's ``decision`` says nothing about ``record`` (a skip reason), or None."""
    after = "allow" if decision.allowed else "forbid"
    cel = decision.validation or record.annotations.get(VALIDATION_ANNOTATION)
    if basis == _CEL_SCOPED or (basis == "metadata" and cel):
        # CEL decides on the object, and a Metadata-level log has none: an assumed object
        # says nothing about what the validation would have found.
        return _CEL_WITHOUT_OBJECT
    if basis == "metadata" and after == "allow" and record.decision == "forbid":
        # Allowed only under the assumption that the object is the caller's: unknown.
        return _UNDETERMINED
    failed_upstream = record.decision == "allow" and 400 <= record.code < 500
    if after == "forbid" and failed_upstream and (basis == "metadata" or _previewed(record)):
        # E.g. an apply whose dry-run preview the apiserver refused (422 immutable, 409
        # conflict): the gatekeeper never saw a result to decide on, and the replay cannot
        # compute the one the apiserver would have stored.
        return _FAILED_UPSTREAM
    return None


def _info(record: Record) -> RequestInfo | None:
    try:
        return parse_request(method_of(record.verb), record.request_uri)
    except Refusal:
        return None


def _count(report: CheckReport, record: Record, view: AdmissionView, every: bool) -> None:
    report.admission[view.verdict] += 1
    if view.verdict is AdmissionVerdict.NOT_KNOWN:
        report.admission_unknown[view.detail] += 1
    if view.verdict is AdmissionVerdict.REFUSES:
        report.admission_refused.append(AdmissionRefused(record, view))
    if every and view.verdict is not AdmissionVerdict.NOT_MATCHED:
        report.admission_views.append(AdmissionRefused(record, view))


def _skip_reason(record: Record, default_node: str | None) -> str:
    if record.driver is None:
        if record.username in ("system:anonymous", ""):
            return "unauthenticated"
        return "user not mapped to a driver (--driver-user USER=DRIVER)"
    if not (record.node or default_node):
        return "no node name (user.extra or --node-name)"
    if record.decision == "forbid" and record.code in _NOT_REPLAYABLE_CODES:
        return f"refused with {record.code} for reasons the log does not carry"
    if record.decision == "forbid" and record.source == "gatekeeper":
        for pattern, why in _UNRECORDED:
            if pattern.search(record.reason):
                return why
    if record.decision == "forbid" and record.code >= 500:
        return "failed before a decision (upstream or gatekeeper error)"
    return ""


def _decide(
    engine: Engine, memory: ObjectMemory, record: Record, driver: str, node: str
) -> tuple[Decision, str]:
    """The proxy's conversation with the engine, the log as its readers: the recorded body, the
    object as the log last showed it, the apiserver's recorded answer as a preview's."""
    transport = ListenerKind.of_label(record.transport, ListenerKind.UNIX)
    identity = Identity(driver=driver, transport=transport, user=record.token_user)
    try:
        info = parse_request(method_of(record.verb), record.request_uri)
    except Refusal as refusal:
        return deny(refusal.code, refusal.reason, refusal.message), "request"
    media_type = _JSON
    if info.verb == "patch":
        media_type = patch_type(record, record.request_object, info)
    # A request the engine settles on what it names reads nothing from the log: "request".
    basis = ["request"]

    def body() -> tuple[str, Any]:
        inputs = memory.inputs(record, info, None, driver, node)
        if info.verb in BODY_VERBS:
            basis[0] = worst(basis[0], inputs.basis)
        return media_type, inputs.body

    def fetch(path: str) -> KubeObject | None:
        inputs = memory.inputs(record, info, path, driver, node)
        basis[0] = worst(basis[0], inputs.basis)
        return inputs.current

    def preview(asked: Preview) -> Preview:
        # What the apiserver stored: the result the proxy's preview saw.
        proposed = memory.inputs(record, info, None, driver, node).proposed
        return asked if proposed is None else asked.answered(record.code, proposed)

    # The log keeps no Accept header: a get answered from the gatekeeper's read and one read
    # again are allowed or refused alike.
    talk = conversation(engine, identity, info, plain_json=True)
    decision = converse(talk, body=body, fetch=fetch, preview=preview)
    memory.remember(record, info)
    kind = engine.policy.kind_for(info.api_group, info.resource, info.verb)
    if basis[0] == "metadata" and kind is not None and kind.rule is KindRule.CEL:
        # Whose the object is, only the object shows (its CEL scope): nothing is assumed.
        return decision, _CEL_SCOPED
    return decision, basis[0]


def _previewed(record: Record) -> bool:
    """A patch the apiserver computes (apply, strategic merge): its result is not in the log
    when the apiserver refused it."""
    if record.verb != "patch":
        return False
    try:
        info = parse_request(method_of(record.verb), record.request_uri)
    except Refusal:
        return False
    return patch_type(record, record.request_object, info) in _PREVIEWED


def _same_state_outcome(record: Record, decision: Decision) -> bool:
    """A recorded 404/409 and a replayed 404/409 are the same answer, not a policy change."""
    return not decision.allowed and decision.code in _STATE_CODES and record.code == decision.code


def format_report(report: CheckReport) -> str:
    """One line per changed decision (with the admission policy's verdict on a write allowed
    now), one per write the admission policy refuses (or per write judged, when kept), then the
    counts."""
    lines = [
        f"{c.before.upper()} -> {c.after.upper()}  {c.record.received}  "
        f"{c.record.driver}  {c.record.verb} {c.record.request_uri}  "
        f"({c.code if c.after == 'forbid' else 'allowed'}: {c.reason}) [{c.basis}] "
        f"[admission: {c.admission.verdict.value if c.admission else '-'}] "
        f"auditID={c.record.audit_id}"
        for c in report.changes
    ]
    shown = report.admission_views or report.admission_refused
    lines += [
        f"ADMISSION {a.view.verdict.value.upper()}  {a.record.received}  {a.record.driver}  "
        f"{a.record.verb} {a.record.request_uri}"
        + (f"  ({a.view.detail})" if a.view.detail else "")
        + f" auditID={a.record.audit_id}"
        for a in shown
    ]
    total = sum(report.decided.values())
    bases = ", ".join(f"{report.decided[b]} {b}" for b in BASES)
    lines.append(
        f"{total} requests re-decided ({bases}); {len(report.changes)} changed: "
        f"{len(report.newly_refused)} newly refused, {len(report.newly_allowed)} newly allowed"
    )
    if report.decided["metadata"]:
        lines.append(
            f"{report.decided['metadata']} decided on metadata only (body or stored object not in "
            "the log; assumed to belong to the caller): record at --audit-level Request or "
            "RequestResponse to check objects"
        )
    for why, count in sorted(report.skipped.items()):
        lines.append(f"{count} skipped: {why}")
    lines += _admission_counts(report)
    return "\n".join(lines) + "\n"


def _admission_counts(report: CheckReport) -> list[str]:
    counts = report.admission
    judged = sum(counts[v] for v in AdmissionVerdict if v is not AdmissionVerdict.NOT_MATCHED)
    lines = [
        f"admission policy (the apiserver's second layer): {judged} writes allowed now judged: "
        f"{counts[AdmissionVerdict.ALLOWS]} allowed, {counts[AdmissionVerdict.REFUSES]} refused, "
        f"{counts[AdmissionVerdict.NOT_KNOWN]} not known; "
        f"{counts[AdmissionVerdict.NOT_MATCHED]} writes it does not match"
    ]
    lines += [
        f"{count} admission not known: {why}"
        for why, count in sorted(report.admission_unknown.items())
    ]
    return lines
