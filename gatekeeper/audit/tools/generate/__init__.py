"""``audit generate``: the least-privilege policy that allows exactly the observed traffic."""

from gatekeeper.audit.tools.generate._policy import generate_policy

__all__ = ["generate_policy"]
