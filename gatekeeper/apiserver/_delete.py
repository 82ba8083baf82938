"""DeleteOptions as the apiserver reads them, and what delete and deletecollection store.

With a request body the options come from the body only and the query's delete options are
ignored (recordings 149, 154); without one they come from the query (157, 165). An object with
finalizers, or deleted with ``propagationPolicy=Orphan``, is only marked (``deletionTimestamp``,
``deletionGracePeriodSeconds: 0``, generation + 1; the ``orphan`` finalizer added), as no
garbage collector runs here (157, 158). The answer is 200 unless ``orphanDependents: false``
left the object in place (202), as the apiserver's delete handler decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gatekeeper.apiserver._errors import APIError, bad_request, conflict
from gatekeeper.apiserver._json import loads
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._objects import mark_deleting
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import ResourceKey, Store, object_key

__all__ = ["DeleteOptions", "check_delete_preconditions", "delete_object", "parse_delete_options"]

_KNOWN_FIELDS: Final = frozenset(
    {
        "kind",
        "apiVersion",
        "gracePeriodSeconds",
        "preconditions",
        "orphanDependents",
        "propagationPolicy",
        "dryRun",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
    }
)
_API_VERSIONS: Final = ("v1", "meta.k8s.io/v1")
_POLICIES: Final = ("Orphan", "Background", "Foreground")
_ORPHAN: Final = "orphan"


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    """The options one delete acts on, from the body or (without a body) the query."""

    dry_run: bool = False
    preconditions: Mapping[str, Any] = field(default_factory=dict)
    propagation_policy: str = ""
    orphan_dependents: bool | None = None
    grace_period_seconds: int | None = None

    @property
    def orphan(self) -> bool:
        """Dependents are orphaned: the ``orphan`` finalizer holds the object."""
        if self.propagation_policy:
            return self.propagation_policy == "Orphan"
        return bool(self.orphan_dependents)


def _bad(message: str) -> APIError:
    return bad_request(f"error decoding DeleteOptions: {message}")


def _dry_run(values: Any) -> bool:
    values = [] if values is None else values
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _bad("dryRun must be a list of strings")
    for value in values:
        if value != "All":
            raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return bool(values)


def _from_body(body: bytes) -> DeleteOptions:
    try:
        doc = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(str(exc)) from None
    if not isinstance(doc, dict):
        raise _bad("the body must be a JSON object")
    unknown = sorted(set(doc) - _KNOWN_FIELDS)
    if unknown:
        raise _bad(f'json: unknown field "{unknown[0]}"')
    if doc.get("kind", "DeleteOptions") != "DeleteOptions":
        raise _bad(f"kind {doc.get('kind')!r} is not DeleteOptions")
    if doc.get("apiVersion", "v1") not in _API_VERSIONS:
        raise _bad(f"apiVersion {doc.get('apiVersion')!r} is not meta.k8s.io/v1")
    preconditions = doc.get("preconditions")
    preconditions = {} if preconditions is None else preconditions
    grace = doc.get("gracePeriodSeconds")
    orphan = doc.get("orphanDependents")
    policy = doc.get("propagationPolicy")
    policy = "" if policy is None else policy
    if (
        not isinstance(preconditions, dict)
        or not (grace is None or (isinstance(grace, int) and not isinstance(grace, bool)))
        or not (orphan is None or isinstance(orphan, bool))
        or not isinstance(policy, str)
    ):
        raise _bad("a field has the wrong type")
    return _checked(
        DeleteOptions(_dry_run(doc.get("dryRun", [])), preconditions, policy, orphan, grace)
    )


def _from_query(query: Any) -> DeleteOptions:
    grace_text = query.get("gracePeriodSeconds")
    try:
        grace = int(grace_text) if grace_text not in (None, "") else None
    except ValueError:
        raise bad_request(
            f'invalid value for gracePeriodSeconds: "{grace_text}" is not an integer'
        ) from None
    orphan_text = query.get("orphanDependents")
    orphan = None if orphan_text in (None, "") else orphan_text.lower() in ("true", "1")
    return _checked(
        DeleteOptions(
            _dry_run(query.getall("dryRun", [])),
            {},
            query.get("propagationPolicy", ""),
            orphan,
            grace,
        )
    )


def _checked(options: DeleteOptions) -> DeleteOptions:
    policy = options.propagation_policy
    if policy and policy not in _POLICIES:
        raise bad_request(
            f'propagationPolicy: Unsupported value: "{policy}": supported values: '
            '"Foreground", "Background", "Orphan"'
        )
    if policy and options.orphan_dependents is not None:
        raise bad_request(
            "orphanDependents: Invalid value: "
            f"{'true' if options.orphan_dependents else 'false'}: "
            "OrphanDependents and PropagationPolicy cannot be both set"
        )
    return options


def parse_delete_options(body: bytes, query: Any) -> DeleteOptions:
    """The options from ``body`` if there is one (the query ignored), else from ``query``."""
    return _from_body(body) if body.strip() else _from_query(query)


def check_delete_preconditions(
    kind: ServedKind, stored: KubeObject, options: DeleteOptions
) -> None:
    """DeleteOptions ``preconditions``: 409 naming the kind (recording 78)."""
    pre = options.preconditions
    name = str(stored["metadata"]["name"])
    uid, rv = pre.get("uid"), pre.get("resourceVersion")
    if uid and uid != stored["metadata"].get("uid"):
        raise conflict(
            kind,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in "
            f"object meta: {stored['metadata'].get('uid')}",
            by_kind=True,
        )
    if rv and rv != stored["metadata"].get("resourceVersion"):
        raise conflict(
            kind,
            name,
            f"the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion "
            f"in record ({stored['metadata'].get('resourceVersion')}). The object might have "
            "been modified",
            by_kind=True,
        )


def delete_object(
    store: Store, resource: ResourceKey, stored: KubeObject, options: DeleteOptions
) -> tuple[KubeObject, int]:
    """Delete (or mark for deletion) one object: ``(the answer's object, HTTP status)``."""
    meta = stored["metadata"]
    finalizers = list(meta.get("finalizers") or [])
    if options.orphan and _ORPHAN not in finalizers:
        finalizers.append(_ORPHAN)
    if not finalizers:
        if options.dry_run:
            return stored, 200
        return store.delete(resource, object_key(stored)), 200
    marked = mark_deleting({**stored, "metadata": {**meta, "finalizers": finalizers}})
    if marked != stored and not options.dry_run:
        marked = store.replace(resource, marked)
    status = 202 if options.orphan_dependents is False else 200
    return (stored if options.dry_run else marked), status
