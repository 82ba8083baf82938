"""The token listener's review bounds are ``serve`` flags like every limit, and the review pool's
connections count in the descriptor budget."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.limits import DEFAULT_LIMITS, Limits, fit_to_descriptors
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.server.flags import add_serve_flags, limits_from, read_flags

TOKEN_LISTENER = {ListenerKind.TOKEN, ListenerKind.HEALTH}


def parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return parser.parse_args(args)


def from_flags(namespace: argparse.Namespace) -> Limits:
    return limits_from(read_flags(vars(namespace)))


def test_review_bounds_are_flags_with_their_defaults() -> None:
    limits = from_flags(parse())
    assert limits == DEFAULT_LIMITS
    limits = from_flags(
        parse(
            "--max-token-reviews=50",
            "--max-token-reviews-per-source=0.5",
            "--max-token-reviews-per-connection=3",
            "--max-token-reviews-per-driver=8",
            "--upstream-review-connections=6",
        )
    )
    assert (
        limits.token_reviews,
        limits.token_reviews_per_source,
        limits.token_reviews_per_connection,
        limits.token_reviews_per_driver,
        limits.upstream_reviews,
    ) == (50, 0.5, 3, 8, 6)


@pytest.mark.parametrize("flag", ["--max-token-reviews=0", "--upstream-review-connections=0"])
def test_review_bounds_must_be_positive(flag: str) -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        from_flags(parse(flag))


def test_the_review_pool_counts_in_the_descriptor_budget() -> None:
    """The smallest descriptor limit the defaults fit in unchanged with the token listener: one
    review connection more no longer fits it."""
    low, high = 1, 1 << 20  # fit_to_descriptors(DEFAULT_LIMITS, …, high) leaves them as they are
    while low < high:
        middle = (low + high) // 2
        if fit_to_descriptors(DEFAULT_LIMITS, TOKEN_LISTENER, middle) is DEFAULT_LIMITS:
            high = middle
        else:
            low = middle + 1
    fits = low
    more = replace(DEFAULT_LIMITS, upstream_reviews=DEFAULT_LIMITS.upstream_reviews + 1)
    assert fit_to_descriptors(more, TOKEN_LISTENER, fits) != more
    assert fit_to_descriptors(more, TOKEN_LISTENER, fits + 1) is more
