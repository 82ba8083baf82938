"""The policy: its model, its pure build from a draft, and the pure decision engine (files are
read by ``gatekeeper.policyfile``)."""

from gatekeeper.policy.build import build_policy
from gatekeeper.policy.decision import Decision
from gatekeeper.policy.engine import Engine
from gatekeeper.policy.model import (
    AllocationPaths,
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Policy,
    Scope,
    VersionSpec,
)

__all__ = [
    "AllocationPaths",
    "Decision",
    "Engine",
    "Field",
    "KindRule",
    "KindSpec",
    "ListSelectorMode",
    "Policy",
    "Scope",
    "VersionSpec",
    "build_policy",
]
