"""The policy: its model, its loader, and the pure decision engine."""

from gatekeeper.policy.decision import Decision
from gatekeeper.policy.engine import Engine
from gatekeeper.policy.loader import load_policy, parse_policy
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
    "load_policy",
    "parse_policy",
]
