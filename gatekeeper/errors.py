"""The gatekeeper's few errors.

Exception
 ├── Refusal        a request refused before the engine (identity, headers, path, body: 4xx);
 │                  the proxy records it as the request's one Decision
 ├── UpstreamError  the apiserver could not be reached or answered badly (502/503/504)
 └── ConfigError    bad flags, policy or kubeconfig; the command exits 2

The engine's verdicts are not exceptions: they are :class:`~gatekeeper.policy.Decision` values.
"""

from __future__ import annotations

from collections.abc import Mapping

from gatekeeper.messages import capped
from gatekeeper.rule import Rule

__all__ = ["ConfigError", "Refusal", "UpstreamError"]


class Refusal(Exception):
    """A request refused before the engine, answered with a Kubernetes Status.

    ``code`` is the HTTP status; ``reason`` is the short rule that failed (it reaches the
    audit annotation ``authorization.k8s.io/reason``); ``message`` is the full Status message
    (apiserver phrasing) and defaults to ``reason``; ``rule`` is which rule it is (metrics),
    by default the one its code stands for.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str | None = None,
        *,
        rule: Rule | None = None,
        retry_after: int | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        # Both reach the Status and the audit event: capped, whatever a body made them say.
        reason, message = capped(reason), capped(message or reason)
        super().__init__(message)
        self.rule = rule if rule is not None else Rule.for_code(code)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.details: dict[str, str] = dict(details or {})


class UpstreamError(Exception):
    """The upstream failed: 502 bad answer (e.g. a redirect), 503 unreachable, 504 timeout."""

    def __init__(self, code: int, message: str) -> None:
        message = capped(message)  # it may quote the upstream; it reaches a Status and a log line
        super().__init__(message)
        self.code = code
        self.message = message


class ConfigError(Exception):
    """Configuration that cannot be used; the command prints it on one line and exits 2."""
