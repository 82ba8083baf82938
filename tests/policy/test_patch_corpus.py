"""The corpus of patches whose result the gatekeeper once read otherwise than the apiserver
stores it (tests/corpus/patches/divergences.yaml), replayed against the engine: each is refused,
decided on the apiserver's dry run, or decided on a result computed here that is what the
apiserver stores. The real tier replays the same entries against kube-apiserver 1.36.3
(tests/realcluster/test_patch_oracle.py), which checks the ``apiserver`` half of each."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.errors import Refusal
from gatekeeper.policy.changes import MAINTAINED
from gatekeeper.policy.patching import pin_patch
from gatekeeper.policy.stored import patched_object
from gatekeeper.request.body import decode_json
from tests.policy.stored_cases import CORPUS_ENTRIES, TARGETS, corpus_raw, decide, value_at

ENTRIES = CORPUS_ENTRIES


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_each_divergence_is_refused_or_decided_on_what_the_apiserver_stores(
    entry: dict[str, Any],
) -> None:
    path, stored = TARGETS[entry["target"]]
    expected = entry["gatekeeper"]
    try:
        patch = decode_json(corpus_raw(entry))
    except Refusal as refusal:
        assert expected == {"refused": refusal.rule.value}, refusal.message
        return
    outcome = decide(path, patch, copy.deepcopy(stored), entry["media_type"])
    decision = outcome.decision
    if "refused" in expected:
        assert not decision.allowed, decision.reason
        assert decision.rule is not None and decision.rule.value == expected["refused"], (
            decision.message
        )
        assert not outcome.asked, "refused before any dry run"
    elif expected.get("dry-run"):
        assert outcome.asked, decision.message
    else:
        assert expected == {"local": True}
        assert decision.allowed and not outcome.asked, decision.message
        served = entry["apiserver"]
        assert served["code"] == 200
        # The result decided on holds what the apiserver stores where the entry says.
        pinned = pin_patch(entry["media_type"], patch, stored["metadata"]["resourceVersion"])
        local = patched_object(entry["media_type"], stored, pinned)
        if tuple(served["at"][:2]) in MAINTAINED:
            return  # the apiserver's own field, which no rule reads (the comparison skips it)
        assert value_at(local, served["at"]) == served["stores"]


def test_the_corpus_covers_the_attacks_and_every_outcome() -> None:
    ids = {entry["id"] for entry in ENTRIES}
    assert {"json-patch-null-adds-a-control-plane-label", "managed-fields-forged-by-a-merge-patch",
            "set-element-order-taints", "doubling-copies"} <= ids  # fmt: skip
    outcomes = {next(iter(entry["gatekeeper"])) for entry in ENTRIES}
    assert outcomes == {"refused", "dry-run", "local"}
    assert len(ids) == len(ENTRIES)
