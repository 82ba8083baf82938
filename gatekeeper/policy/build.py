"""The policy built from its draft, checking what the schema cannot say; pure (no file is read
here: ``gatekeeper.policyfile`` reads, validates and composes the files)."""

from __future__ import annotations

from dataclasses import replace

from gatekeeper.errors import ConfigError
from gatekeeper.policy._kinds import build_kind
from gatekeeper.policy._versions import ALLOCATION_KEYS
from gatekeeper.policy.draft import PolicyDraft, RawKind
from gatekeeper.policy.model import KindSpec, Policy, UnboundTokens

__all__ = ["ALLOCATION_KEYS", "build_policy"]


def build_policy(draft: PolicyDraft) -> Policy:
    """The immutable policy the engine reads; ConfigError naming the file, line and key of the
    first fault."""
    if not draft.kinds:
        raise ConfigError(
            f"{draft.source}: kinds: no kind is defined (here or in an included file): an empty "
            "policy would allow nothing"
        )
    kinds = _combined([(raw, build_kind(raw)) for raw in draft.kinds])
    unbound = draft.unbound_tokens
    return Policy(
        kinds=kinds,
        drivers=draft.drivers,
        source=draft.source,
        files=draft.files,
        # The core group ("", e.g. an OwnNode kind) has no /apis/<group> discovery path.
        groups=frozenset(spec.group for spec in kinds.values() if spec.group),
        service_accounts=dict(draft.service_accounts),
        unbound_tokens=UnboundTokens.REFUSE if unbound is None else UnboundTokens(unbound.value),
    )


def _combined(built: list[tuple[RawKind, KindSpec]]) -> dict[tuple[str, str], KindSpec]:
    """The policy's kinds by (group, resource): a resource listed under several rules is one
    KindSpec with the others as its ``alternatives``, each deciding its own verbs."""
    kinds: dict[tuple[str, str], KindSpec] = {}
    firsts: dict[tuple[str, str], RawKind] = {}
    for raw, spec in built:
        key = (spec.group, spec.resource)
        first = kinds.get(key)
        if first is None:
            kinds[key], firsts[key] = spec, raw
            continue
        if (spec.kind, spec.scope) != (first.kind, first.scope):
            raw.origin.fail(
                f"is {spec.kind} ({spec.scope.value}), but {firsts[key].origin.where} lists "
                f"{spec.qualified} as {first.kind} ({first.scope.value}): one resource is one kind"
            )
        for other in (first, *first.alternatives):
            if shared := other.verbs & spec.verbs:
                raw.keys["verbs"].fail(
                    f"{', '.join(sorted(shared))} of {spec.qualified} is decided by rule "
                    f"{other.rule.value} already: each verb of a resource has one rule"
                )
        kinds[key] = replace(first, alternatives=(*first.alternatives, spec))
    return kinds
