"""The descriptor budget: every listener kind configured counts with its own caps, and the caps
are fitted so that all of them together fit the descriptor limit."""

from __future__ import annotations

import resource
from dataclasses import fields
from pathlib import Path

import pytest

from gatekeeper.limits import DEFAULT_LIMITS, Limits, descriptor_budget, fit_to_descriptors
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.server.config import build_serve_config
from gatekeeper.testing.harness import GPU, PKI

EVERY_KIND = frozenset(ListenerKind)
DRIVER_KINDS = [kind for kind in ListenerKind if kind.serves_drivers]


def test_each_configured_listener_kind_counts_with_its_own_caps() -> None:
    """Three kinds of drivers' listener (the budget once counted two), and the health
    listener: each added kind adds exactly its caps."""
    limits = Limits(connections_total=100, connections_unauthenticated=10, health_connections=7)
    alone = descriptor_budget(limits, [])
    reviews = limits.upstream_reviews  # the token listener's TokenReviews have their own pool
    for kind in DRIVER_KINDS:
        pool = reviews if kind is ListenerKind.TOKEN else 0
        assert descriptor_budget(limits, [kind]) - alone == 100 + 10 + pool
    assert descriptor_budget(limits, [ListenerKind.HEALTH]) - alone == 2 * 7
    assert descriptor_budget(limits, EVERY_KIND) - alone == 3 * (100 + 10) + reviews + 2 * 7
    # A kind is counted once, however many listeners of it (one Unix socket per driver).
    doubled = [*EVERY_KIND, ListenerKind.UNIX, ListenerKind.UNIX]
    assert descriptor_budget(limits, doubled) == descriptor_budget(limits, EVERY_KIND)


@pytest.mark.parametrize("soft_limit", [256, 1024, 2048])
@pytest.mark.parametrize(
    "kinds",
    [EVERY_KIND, frozenset(DRIVER_KINDS), frozenset({ListenerKind.UNIX, ListenerKind.HEALTH})],
    ids=["every-listener", "drivers-listeners", "sockets-and-health"],
)
def test_a_config_with_these_listeners_fits(
    soft_limit: int, kinds: frozenset[ListenerKind]
) -> None:
    fitted = fit_to_descriptors(DEFAULT_LIMITS, kinds, soft_limit=soft_limit)
    assert descriptor_budget(fitted, kinds) <= soft_limit
    assert fitted.check() is fitted  # every bound still positive
    # Only the connection caps and the upstream pools give way (the health listener's only
    # below 1,024); the per-driver bounds and the timeouts are the operator's.
    lowered = {
        field.name
        for field in fields(Limits)
        if getattr(fitted, field.name) != getattr(DEFAULT_LIMITS, field.name)
    }
    assert lowered <= {
        "connections_total",
        "connections_unauthenticated",
        "upstream_requests",
        "upstream_watches",
        *(["health_connections"] if soft_limit < 1024 else []),
    }
    assert lowered  # the defaults need more than 2,048 with any of these
    # The drivers keep most of what is left after the reserve and the gatekeeper's own pool.
    drivers = [kind for kind in kinds if kind.serves_drivers]
    theirs = len(drivers) * (fitted.connections_total + fitted.connections_unauthenticated)
    health = 2 * fitted.health_connections if ListenerKind.HEALTH in kinds else 0
    assert health <= soft_limit // 8 < theirs


def test_limits_that_fit_are_kept() -> None:
    needed = descriptor_budget(DEFAULT_LIMITS, EVERY_KIND)
    assert fit_to_descriptors(DEFAULT_LIMITS, EVERY_KIND, soft_limit=needed) is DEFAULT_LIMITS
    assert fit_to_descriptors(DEFAULT_LIMITS, EVERY_KIND, soft_limit=needed - 1) != DEFAULT_LIMITS


def test_each_drivers_listener_gets_the_same_share() -> None:
    """One more kind of drivers' listener lowers every kind's cap, so that all still fit."""
    two = fit_to_descriptors(DEFAULT_LIMITS, {ListenerKind.UNIX, ListenerKind.MTLS}, 1024)
    three = fit_to_descriptors(DEFAULT_LIMITS, DRIVER_KINDS, 1024)
    assert three.connections_total < two.connections_total
    assert 3 * three.connections_total <= 1024


def test_serve_fits_its_limits_to_the_listeners_it_has(tmp_path: Path, pki: PKI) -> None:
    """Built from ``serve``'s flags with every listener, the limits fit the process's own
    descriptor limit, counted over the listener kinds the configuration has."""
    default = Path(__file__).parents[1] / "gatekeeper" / "policies" / "default.yaml"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        default.read_text().replace("drivers: []", f"drivers: [{GPU}]")
        + f"serviceAccounts:\n  {GPU}: [gpu-system/plugin]\n"
    )
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    config = build_serve_config(
        {
            "node_name": "node-a",
            "policy": str(policy),
            "kubeconfig": str(kubeconfig),
            "socket_dir": str(tmp_path / "sockets"),
            "listen": "127.0.0.1:0",
            "listen_token": "127.0.0.1:0",
            "tls_cert_file": pki.path("server.crt"),
            "tls_key_file": pki.path("server.key"),
            "client_ca_file": pki.path("ca.crt"),
            "health_listen": "127.0.0.1:0",
        },
        environ={},
    )
    assert config.listener_kinds == EVERY_KIND
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert descriptor_budget(config.limits, config.listener_kinds) <= soft
