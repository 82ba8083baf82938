"""Every message about a request is capped (gatekeeper/messages.py): what a refusal says, and so
the Status answer and the audit annotation, stays small whatever the body made it say."""

from __future__ import annotations

from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.messages import MAX_MESSAGE, capped
from gatekeeper.policy.decision import deny


def test_a_long_text_is_cut_saying_how_much() -> None:
    assert capped("short") == "short"
    text = "x" * (3 * MAX_MESSAGE)
    cut = capped(text)
    assert len(cut) == MAX_MESSAGE
    assert cut.endswith(f"… ({2 * MAX_MESSAGE} more characters)")
    assert capped("abcdef", 4) == "abcd"


def test_refusals_and_decisions_are_capped() -> None:
    huge = "y" * 1_000_000
    refusal = Refusal(400, huge, huge)
    assert len(refusal.reason) == len(refusal.message) == len(str(refusal)) == MAX_MESSAGE
    decision = deny(403, huge)
    assert len(decision.reason) == len(decision.message) == MAX_MESSAGE
    upstream = UpstreamError(502, huge)  # it may quote what the upstream answered
    assert len(upstream.message) == len(str(upstream)) == MAX_MESSAGE
