"""Differential fuzz of the gatekeeper's protobuf reader against the kube-apiserver's own
decoding (``cmd/protodiff``: runtime.Unknown, metav1.ObjectMeta, the DRA kinds through
legacyscheme.Codecs, DeleteOptions through the delete handler's codecs).

Each run draws a seed (printed; ``DRA_GATEKEEPER_PROTODIFF_SEED`` reruns one,
``DRA_GATEKEEPER_PROTODIFF_CASES`` sets how many cases) and checks 100,000 random and mutated
envelopes: wherever Go sees a value the gatekeeper sees the same or refuses the body, and every
body it accepts, pinned, is read by Go with exactly the pinned resourceVersion. The corpus of
bodies that once differed (tests/corpus/protobuf) is replayed against Go too.
"""

from __future__ import annotations

import os
import random
import secrets
from typing import Any

import pytest
import yaml

from tests.codec.test_kubeproto import CORPUS
from tests.realcluster.build import Binaries
from tests.realcluster.protodiff import DELETE, Check, decode, generate

SEED_ENV = "DRA_GATEKEEPER_PROTODIFF_SEED"
CASES_ENV = "DRA_GATEKEEPER_PROTODIFF_CASES"
CASES = 100_000
_PIN_BATCH = 20_000


@pytest.fixture(scope="module")
def protodiff(binaries: Binaries) -> str:
    return binaries["protodiff"]


def _pin_to(rng: random.Random) -> str:
    return rng.choice(["", "1", str(rng.randrange(1, 10**12))])


def _report(seed: int, check: Check) -> str:
    shown = "\n".join(check.failures[:10])
    return f"seed {seed} ({SEED_ENV}={seed}): {len(check.failures)} divergences:\n{shown}"


def test_the_gatekeeper_reads_what_the_apiserver_reads_or_refuses(protodiff: str) -> None:
    seed = int(os.environ.get(SEED_ENV) or secrets.randbelow(1 << 63))
    count = int(os.environ.get(CASES_ENV) or CASES)
    print(f"protodiff: seed {seed}, {count} cases (rerun: {SEED_ENV}={seed})")
    pins, check = random.Random(seed), Check()
    for case in generate(protodiff, seed, count):
        check.case(f"{seed}:{case['i']}", case["t"], bytes.fromhex(case["b"]), case, _pin_to(pins))
        if len(check.pins) >= _PIN_BATCH:
            check.pinned(decode(protodiff, [(p.target, p.body) for p in check.pins]))
    check.pinned(decode(protodiff, [(p.target, p.body) for p in check.pins]))
    print(dict(check.counts))
    assert not check.failures, _report(seed, check)
    # Not vacuous: the tricks reach values Go reads, and accepted bodies were pinned and checked.
    counts = check.counts
    assert counts["refused (ambiguous) where go sees values: True"] >= count // 10, counts
    assert counts["pins checked"] >= count // 20, counts
    assert counts["DeleteOptions read"] >= count // 50, counts


def _corpus() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text())
    return entries


def _apiserver_reads(entry: dict[str, Any], go: dict[str, Any]) -> None:
    """What the corpus entry says Go reads is what Go reads (the divergence is real)."""
    for view, values in entry["apiserver"].items():
        seen = go[view]
        assert "err" not in seen, (entry["id"], view, seen)
        if view == "d":
            assert {key: seen["options"].get(key) for key in values} == values, entry["id"]
            continue
        read = {key: bytes.fromhex(seen.get(key, "")).decode() for key in values}
        assert read == values, (entry["id"], view)


def test_the_corpus_is_read_by_the_apiserver_as_recorded_and_refused_or_read_alike(
    protodiff: str,
) -> None:
    entries = _corpus()
    bodies = [(entry["target"], bytes.fromhex(entry["hex"])) for entry in entries]
    check = Check()
    for entry, go, (target, body) in zip(entries, decode(protodiff, bodies), bodies, strict=True):
        _apiserver_reads(entry, go)
        check.case(entry["id"], target, body, go, "1234")
    check.pinned(decode(protodiff, [(p.target, p.body) for p in check.pins]))
    assert not check.failures, "\n".join(check.failures)
    assert check.counts["pins checked"] == sum("reads" in e["gatekeeper"] for e in entries)
    assert any(e["target"] == DELETE for e in entries)
