"""``audit generate``: the least-privilege policy that allows exactly the observed traffic, and
the policy-test file written with it."""

from gatekeeper.audit.tools.generate._cases import generate_tests
from gatekeeper.audit.tools.generate._examples import Examples
from gatekeeper.audit.tools.generate._policy import generate_policy

__all__ = ["Examples", "generate_policy", "generate_tests"]
