"""The kinds a policy names, as the embedded API server serves them (for ``test`` and ``demo``).

The bridge between the two: the embedded API server knows nothing of the gatekeeper's policy.
"""

from __future__ import annotations

from gatekeeper.apiserver import ServedKind, sort_versions
from gatekeeper.policy.model import BUILT_IN_GROUPS, Field, Policy, Scope

__all__ = ["served_kinds"]


def served_kinds(policy: Policy) -> tuple[ServedKind, ...]:
    """One :class:`ServedKind` per policy kind, in every version the policy lists.

    Each version's ownership fields (driver, node, pool) become field-selector keys (under
    the selector names the policy gives) and immutable fields, as they are for ResourceSlices
    on a real apiserver; ``metadata.*`` paths are left to the built-in handling.
    """
    served = []
    for spec in policy.kinds.values():
        # A resource listed under several rules is one served kind: every entry's versions, and
        # each version's fields from every entry that lists it.
        selectable: dict[str, dict[str, str]] = {}
        immutable: dict[str, set[str]] = {}
        for entry in spec.entries:
            for version, vspec in entry.versions.items():
                paths = {fld: ".".join(path) for fld, path in vspec.paths.items()}
                selectable.setdefault(version, {}).update(
                    {
                        key: paths[fld]
                        for fld, key in vspec.selectors.items()
                        if fld in paths
                        and not key.startswith("metadata.")
                        and not paths[fld].startswith("metadata.")
                    }
                )
                # Driver and node are immutable, as on a real 1.36 apiserver (recordings 52,
                # 53). So is a ResourceSlice's pool name there (recordings 171-173,
                # RESOURCE_SLICES here), but it stays mutable in served kinds: the policy tests
                # and the kubectl tests change a pool to reach the gatekeeper's own check of the
                # result, which a real apiserver's 422 would pre-empt (a known difference of the
                # differential run).
                immutable.setdefault(version, set()).update(
                    path
                    for fld, path in paths.items()
                    if fld is not Field.POOL and not path.startswith("metadata.")
                )
        served.append(
            ServedKind(
                group=spec.group,
                resource=spec.resource,
                kind=spec.kind,
                namespaced=spec.scope is Scope.NAMESPACED,
                versions=tuple(sort_versions(list(selectable))),
                selectable_fields=selectable,
                immutable_fields={version: tuple(sorted(p)) for version, p in immutable.items()},
                subresources=tuple(sorted(set().union(*(e.subresources for e in spec.entries)))),
                custom=spec.group not in BUILT_IN_GROUPS,
            )
        )
    return tuple(served)
