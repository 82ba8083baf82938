"""Strict pool names: ``<node>`` and ``<node>/<rest>`` by default; ``<node>-<rest>``
only where a kind's ``poolSeparators`` says so; deletecollection pins the pool where a field
selector can name it."""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import quote

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Engine
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline

NODE = "node-a"
GPU = Identity(driver="gpu.example.com", transport="unix")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
DEFAULT = load_policy(None).with_drivers(frozenset({GPU.driver}))
_TEXT = resources.files("gatekeeper").joinpath("policies/default.yaml").read_text()
DASH = parse_policy(
    _TEXT.replace("poolSeparators: [/]", "poolSeparators: [/, '-']"),
    "dash.yaml",
).with_drivers(frozenset({GPU.driver}))


def a_slice(pool: str) -> dict[str, Any]:
    spec = {"driver": GPU.driver, "nodeName": NODE, "pool": {"name": pool, "generation": 1}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s"}, "spec": spec}  # fmt: skip


def a_pool(name: str | None, generate: str | None = None) -> dict[str, Any]:
    meta = {"name": name} if name else {"generateName": generate}
    return {"apiVersion": "devmgmtproto.k8s.io/v1alpha1", "kind": "DevicePool",
            "metadata": meta, "spec": {"driver": GPU.driver, "nodeName": NODE}}  # fmt: skip


CREATES = [
    # (id, collection, body, allowed by default, allowed with poolSeparators [/, -])
    ("slice-pool-is-node", SLICES, a_slice("node-a"), True, True),
    ("slice-pool-slash", SLICES, a_slice("node-a/gpus"), True, True),
    # The issue's collision: "node-a-b" is node "node-a-b"'s own pool name.
    ("slice-pool-dash", SLICES, a_slice("node-a-b"), False, True),
    ("slice-pool-dot", SLICES, a_slice("node-a.b"), False, False),
    ("slice-pool-no-separator", SLICES, a_slice("node-ab"), False, False),
    ("slice-pool-separator-only", SLICES, a_slice("node-a/"), False, False),
    ("devicepool-named-node", POOLS, a_pool("node-a"), True, True),
    ("devicepool-dash", POOLS, a_pool("node-a-b"), False, True),
    ("devicepool-generate-dash", POOLS, a_pool(None, "node-a-"), False, True),
]


@pytest.mark.parametrize(
    ("collection", "body", "strict_ok", "dash_ok"), [c[1:] for c in CREATES],
    ids=[c[0] for c in CREATES],
)  # fmt: skip
def test_pool_rule_per_kind(collection: str, body: Any, strict_ok: bool, dash_ok: bool) -> None:
    info = parse_request("POST", collection)
    strict = decide_offline(Engine(DEFAULT, NODE), GPU, info, body)
    dashed = decide_offline(Engine(DASH, NODE), GPU, info, body)
    assert (strict.allowed, dashed.allowed) == (strict_ok, dash_ok), (strict.reason, dashed.reason)
    if not strict_ok:
        assert strict.code == 403
        assert "not prefixed by node name" in strict.message or (
            "must start with node name" in strict.message
        )


def test_refusal_names_the_separators() -> None:
    info = parse_request("POST", SLICES)
    decision = decide_offline(Engine(DEFAULT, NODE), GPU, info, a_slice("node-a-b"))
    assert 'spec.pool.name "node-a-b" is not prefixed by node name "node-a" followed by "/"' in (
        decision.message
    )


def test_stored_object_with_a_dash_pool_is_not_the_drivers() -> None:
    current = a_slice("node-a-b") | {}
    current["metadata"] = {"name": "s", "uid": "u", "resourceVersion": "3"}
    decision = decide_offline(
        Engine(DEFAULT, NODE), GPU, parse_request("DELETE", f"{SLICES}/s"), None, current
    )
    assert not decision.allowed and "node-a-b" in decision.message


def _selector(terms: str) -> str:
    return f"fieldSelector={quote(terms, safe='')}"


PINNED = f"spec.driver={GPU.driver},spec.nodeName={NODE}"
COLLECTIONS = [
    ("devicepools-no-pool-term", POOLS, PINNED, False, "requires fieldSelector metadata.name="),
    ("devicepools-own-pool", POOLS, f"{PINNED},metadata.name=node-a", True, ""),
    ("devicepools-dash-pool", POOLS, f"{PINNED},metadata.name=node-a-b", False,
     'pins metadata.name="node-a-b"'),
    ("devicepools-not-equal-is-no-pin", POOLS, f"{PINNED},metadata.name!=x", False,
     "requires fieldSelector metadata.name="),
    # spec.pool.name is not a ResourceSlice field selector: docs/policy.md#pool-names.
    ("slices-pool-not-selectable", SLICES, PINNED, True, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("collection", "terms", "allowed", "message"), [c[1:] for c in COLLECTIONS],
    ids=[c[0] for c in COLLECTIONS],
)  # fmt: skip
def test_deletecollection_pins_the_pool(
    collection: str, terms: str, allowed: bool, message: str
) -> None:
    info = parse_request("DELETE", f"{collection}?{_selector(terms)}")
    decision = decide_offline(Engine(DEFAULT, NODE), GPU, info)
    assert decision.allowed is allowed, decision.message
    assert message in decision.message


def test_list_does_not_need_a_pool_term() -> None:
    info = parse_request("GET", f"{POOLS}?{_selector(PINNED)}")
    assert decide_offline(Engine(DEFAULT, NODE), GPU, info).allowed


def test_named_pool_selector_is_pinned() -> None:
    text = _TEXT.replace(
        "        pool: spec.pool.name\n",
        "        pool: spec.pool.name\n        fieldSelectors: {pool: spec.pool.name}\n",
    )
    engine = Engine(parse_policy(text).with_drivers(frozenset({GPU.driver})), NODE)
    refused = decide_offline(engine, GPU, parse_request("DELETE", f"{SLICES}?{_selector(PINNED)}"))
    assert not refused.allowed and "spec.pool.name=<pool>" in refused.message
    pinned = f"{PINNED},spec.pool.name=node-a/gpus"
    assert decide_offline(
        engine, GPU, parse_request("DELETE", f"{SLICES}?{_selector(pinned)}")
    ).allowed


BAD = [
    ("unknown-separator", "poolSeparators: [_]", "'_' is not one of /, -, ."),
    ("empty", "poolSeparators: []", "at least one separator"),
    ("twice", "poolSeparators: [/, /]", "twice"),
    ("not-a-list", "poolSeparators: /", "must be a list"),
]


@pytest.mark.parametrize(("line", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_loader_checks_pool_separators(line: str, message: str) -> None:
    text = _TEXT.replace("poolSeparators: [/]", line, 1)
    with pytest.raises(ConfigError, match="poolSeparators") as caught:
        parse_policy(text, "p.yaml")
    assert message in str(caught.value)


def test_allocated_kinds_take_no_pool_separators() -> None:
    text = _TEXT.replace(
        "    rule: AllocatedToDriver\n", "    rule: AllocatedToDriver\n    poolSeparators: [/]\n"
    )
    with pytest.raises(ConfigError, match=r"poolSeparators: is not allowed \(rule Allocated"):
        parse_policy(text, "p.yaml")
