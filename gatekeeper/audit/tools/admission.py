"""The second layer in ``audit check``: whether the exported admission policy
(docs/admission-policy.md) would have refused a write the gatekeeper forwards, judged on the
objects the log holds: the stored object after the write (its response) and the one before it
(the replay's :class:`~gatekeeper.audit.tools.replay.ObjectMemory`). Where the log holds neither
exactly, the verdict is "not known", never a guess."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gatekeeper.audit.tools.reader import Record
from gatekeeper.audit.tools.replay import ObjectMemory
from gatekeeper.policy import Policy
from gatekeeper.policy.admissioncheck import ExportedPolicy, Write
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import KubeObject

__all__ = [
    "NO_AFTER",
    "NO_BEFORE",
    "NO_ITEMS",
    "OTHER_UID",
    "WRITE_VERBS",
    "AdmissionLayer",
    "AdmissionVerdict",
    "AdmissionView",
]

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
"""The verbs admission sees; reads never reach a validating admission policy."""
_AFTER_VERBS = frozenset({"create", "update", "patch"})
_NOT_OBJECTS = (None, "Status", "Table", "PartialObjectMetadata", "PartialObjectMetadataList")
NO_AFTER = "the stored object after the write is not in the log (no RequestResponse response)"
NO_BEFORE = "the stored object before the write is not in the log"
OTHER_UID = (
    "the stored object before the write the log shows is another object (another uid): it was "
    "re-created where the log does not show it"
)
NO_ITEMS = "the deleted objects are not in the log (no RequestResponse response)"


class AdmissionVerdict(enum.Enum):
    """What the exported admission policy says about one recorded request."""

    ALLOWS = "allows"
    REFUSES = "refuses"
    NOT_KNOWN = "not known"
    """A write it matches, but the log lacks an object it reads."""
    NOT_MATCHED = "not matched"
    """A write it does not match (a kind written with the driver's own credentials)."""


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """The verdict and its detail: the refusing validation's message, or what is not known."""

    verdict: AdmissionVerdict
    detail: str = ""


_NOT_MATCHED = AdmissionView(AdmissionVerdict.NOT_MATCHED)


class AdmissionLayer:
    """The export of a policy (one per set of drivers served on the node, as ``--driver``
    adds them), judging the gatekeeper's writes as the apiserver would."""

    def __init__(self) -> None:
        self._exports: dict[frozenset[str], ExportedPolicy | str] = {}

    def _exported(self, policy: Policy) -> ExportedPolicy | str:
        found = self._exports.get(policy.drivers)
        if found is None:
            try:
                found = ExportedPolicy(policy)
            except ValueError as exc:  # drivers: ["*"]: nothing to bind the driver fields to
                found = f"the policy cannot be exported: {exc}"
            self._exports[policy.drivers] = found
        return found

    def before(
        self, memory: ObjectMemory, record: Record, info: RequestInfo, driver: str, node: str
    ) -> tuple[bool, KubeObject | None]:
        """The stored object before ``record`` and whether the log knows it exactly; read from
        ``memory`` before the replay remembers ``record``."""
        if info.verb == "create" or not info.name:
            return True, None
        if info.verb in _AFTER_VERBS and not (
            record.code < 300 and _is_object(record.response_object)
        ):
            return False, None  # judged "not known" on the missing object after: no look-up
        path = info.path[: -(len(info.subresource) + 1)] if info.subresource else info.path
        inputs = memory.inputs(record, info, path, driver, node)
        return inputs.basis != "metadata", inputs.current

    def judge(
        self,
        policy: Policy,
        record: Record,
        info: RequestInfo,
        node: str,
        before: tuple[bool, KubeObject | None],
    ) -> AdmissionView:
        """The verdict on ``record``, a request the gatekeeper forwards."""
        if info.verb not in WRITE_VERBS or not info.is_resource_request:
            return _NOT_MATCHED
        exported = self._exported(policy)
        if isinstance(exported, str):
            return AdmissionView(AdmissionVerdict.NOT_KNOWN, exported)
        probe = _write(info, None, None, info.name)
        if not exported.matches(probe):
            return _NOT_MATCHED
        if info.verb == "deletecollection":
            return _collection(exported, info, record, node)
        after: KubeObject | None = None
        if info.verb in _AFTER_VERBS:
            if record.code >= 300 or not _is_object(record.response_object):
                return AdmissionView(AdmissionVerdict.NOT_KNOWN, NO_AFTER)
            after = record.response_object
        known, old = before
        if not known:
            return AdmissionView(AdmissionVerdict.NOT_KNOWN, NO_BEFORE)
        if after is not None and old is not None and _uid(after) != _uid(old):
            return AdmissionView(AdmissionVerdict.NOT_KNOWN, OTHER_UID)
        name = info.name or _name(after)
        return _verdict(exported, _write(info, after, old, name), node)


def _collection(
    exported: ExportedPolicy, info: RequestInfo, record: Record, node: str
) -> AdmissionView:
    """A collection delete is admitted object by object: each deleted object as ``oldObject``."""
    items = (
        record.response_object.get("items") if isinstance(record.response_object, dict) else None
    )
    if record.code >= 300 or not isinstance(items, list):
        return AdmissionView(AdmissionVerdict.NOT_KNOWN, NO_ITEMS)
    # A list's items carry no kind of their own: an object is a mapping with metadata.
    if not all(isinstance(i, dict) and isinstance(i.get("metadata"), dict) for i in items):
        return AdmissionView(AdmissionVerdict.NOT_KNOWN, NO_ITEMS)
    for item in items:
        view = _verdict(exported, _write(info, None, item, _name(item)), node)
        if view.verdict is AdmissionVerdict.REFUSES:
            return view
    return AdmissionView(AdmissionVerdict.ALLOWS)


def _verdict(exported: ExportedPolicy, write: Write, node: str) -> AdmissionView:
    refusal = exported.refusal(write, node)
    if refusal is None:
        return AdmissionView(AdmissionVerdict.ALLOWS)
    detail = refusal.validation.message
    if refusal.error:
        detail = f"{detail} (evaluation error: {refusal.error})"
    return AdmissionView(AdmissionVerdict.REFUSES, detail)


def _write(
    info: RequestInfo, after: KubeObject | None, before: KubeObject | None, name: str
) -> Write:
    verb = "delete" if info.verb == "deletecollection" else info.verb
    return Write(verb, info.api_group, info.api_version, info.resource, info.subresource,
                 info.namespace, name, after, before)  # fmt: skip


def _is_object(value: object) -> bool:
    return (
        isinstance(value, dict)
        and value.get("kind") not in _NOT_OBJECTS
        and isinstance(value.get("metadata"), dict)
    )


def _uid(obj: KubeObject) -> object:
    metadata = obj.get("metadata")
    return metadata.get("uid") if isinstance(metadata, dict) else None


def _name(obj: KubeObject | None) -> str:
    metadata = (obj or {}).get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""
