"""The cap on every message the gatekeeper writes about a request (a Status message, an audit
annotation, a log line): Kubernetes caps an evaluated admission message the same way, so that a
body can never make the answer or the audit event grow with it."""

from __future__ import annotations

__all__ = ["MAX_MESSAGE", "capped"]

MAX_MESSAGE = 5 * 1024
"""Characters of one message; longer ones are cut, saying how much was cut."""


def capped(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    cut = f"… ({len(text) - limit} more characters)"
    if len(cut) >= limit:
        return text[:limit]
    return text[: limit - len(cut)] + cut
