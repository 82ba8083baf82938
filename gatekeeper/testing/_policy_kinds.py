"""The kinds a policy names, as the embedded API server serves them."""

from __future__ import annotations

from gatekeeper.testing.apiserver import ServedKind

from gatekeeper.policy.model import Field, Policy, Scope

__all__ = ["served_kinds"]


def served_kinds(policy: Policy) -> list[ServedKind]:
    """One ServedKind per policy kind: its versions, driver/node field selectors and immutables.

    The driver and node fields are immutable in the real API (recordings 52/53), so they are here.
    """
    kinds = []
    for spec in policy.kinds.values():
        versions = tuple(sorted(spec.versions, key=_version_rank))
        kinds.append(
            ServedKind(
                group=spec.group,
                resource=spec.resource,
                kind=spec.kind,
                namespaced=spec.scope is Scope.NAMESPACED,
                versions=versions,
                selectable_fields={
                    name: {
                        version.selectors[fld]: ".".join(version.paths[fld])
                        for fld in (Field.DRIVER, Field.NODE)
                    }
                    for name, version in spec.versions.items()
                },
                immutable_fields={
                    name: tuple(".".join(version.paths[fld]) for fld in (Field.DRIVER, Field.NODE))
                    for name, version in spec.versions.items()
                },
                subresources=tuple(sorted(spec.subresources)),
            )
        )
    return kinds


def _version_rank(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA before beta before alpha, higher numbers first."""
    major, _, rest = (
        version[1:].partition("alpha")
        if "alpha" in version
        else (version[1:].partition("beta") if "beta" in version else (version[1:], "", ""))
    )
    stability = 0 if "alpha" in version else 1 if "beta" in version else 2
    return (-stability, -int(major), -int(rest or 0))
