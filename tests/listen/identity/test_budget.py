"""The review budget's bounds, on a clock the test turns: per connection, per source address,
for the whole process, and each driver's shares that no flood from elsewhere can use up."""

from __future__ import annotations

import pytest

from gatekeeper.limits import Limits
from gatekeeper.listen.identity import (
    MAX_SOURCES,
    ReviewBudget,
    ReviewCaller,
    TokenFailure,
    TokenRefusal,
    source_key,
)

GPU, NIC = "gpu.example.com", "nic.example.com"
# Buckets hold max(2, rate): here per connection 2, per source 4, process 8, per driver 2.
LIMITS = Limits(
    token_reviews=8,
    token_reviews_per_source=4,
    token_reviews_per_connection=1,
    token_reviews_per_driver=2,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def budget(clock: Clock) -> ReviewBudget:
    return ReviewBudget(LIMITS, clock=clock)


def caller(source: str = "10.0.0.1") -> ReviewCaller:
    return ReviewCaller(source)


def admitted(budget: ReviewBudget, who: ReviewCaller, tries: int, known: str | None = None) -> int:
    """How many of ``tries`` reviews ``budget`` admits for ``who`` at once."""
    count = 0
    for _ in range(tries):
        try:
            budget.admit(who, known)
        except TokenRefusal:
            continue
        count += 1
    return count


def refusal(budget: ReviewBudget, who: ReviewCaller, known: str | None = None) -> TokenRefusal:
    with pytest.raises(TokenRefusal) as refused:
        budget.admit(who, known)
    return refused.value


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("", "unknown"),
        (None, "unknown"),
        ("not-an-address", "unknown"),
    ],
)
def test_source_keys(address: str | None, key: str) -> None:
    assert source_key(address) == key


def test_one_connection_gets_its_bucket_then_429_naming_the_flag(
    budget: ReviewBudget, clock: Clock
) -> None:
    one = caller()
    assert admitted(budget, one, 10) == 2
    refused = refusal(budget, one)
    assert refused.code == 429 and refused.failure is TokenFailure.RATE_LIMITED
    assert "--max-token-reviews-per-connection" in refused.message
    assert refused.retry_after == 1
    assert "on one connection" in refused.reason
    clock.now += 1.0  # one second: one more review on that connection
    assert admitted(budget, one, 10) == 1
    # Another connection from the same address has a bucket of its own.
    assert admitted(budget, caller(), 10) == 2


def test_one_address_gets_its_bucket_whatever_its_connections(budget: ReviewBudget) -> None:
    assert sum(admitted(budget, caller("10.0.0.7"), 2) for _ in range(10)) == 4
    refused = refusal(budget, caller("10.0.0.7"))
    assert "--max-token-reviews-per-source" in refused.message
    assert admitted(budget, caller("10.0.0.8"), 1) == 1


def test_the_process_bound_holds_across_addresses(budget: ReviewBudget, clock: Clock) -> None:
    assert sum(admitted(budget, caller(f"10.0.1.{n}"), 2) for n in range(20)) == 8
    refused = refusal(budget, caller("10.0.2.1"))
    assert "--max-token-reviews)" in refused.message
    clock.now += 0.5  # 8 per second: 4 more, one address and connection each
    assert sum(admitted(budget, caller(f"10.0.3.{n}"), 1) for n in range(20)) == 4


def test_a_wait_of_more_than_a_second_is_said(clock: Clock) -> None:
    slow = ReviewBudget(Limits(token_reviews_per_connection=0.25), clock=clock)
    one = caller()
    assert admitted(slow, one, 5) == 2
    assert refusal(slow, one).retry_after == 4


def test_a_drivers_connection_keeps_its_share_during_a_flood(budget: ReviewBudget) -> None:
    driver = caller("10.0.9.9")
    budget.recognise(driver, GPU)  # it showed GPU's token (a cached answer or a review)
    flood = sum(admitted(budget, caller(f"10.0.4.{n}"), 2) for n in range(50))
    assert flood == 8
    # A rotated token on the driver's connection: its own share, not the flood's.
    assert admitted(budget, driver, 1) == 1
    # Its connection's own bucket still holds (2): the share does not lift it.
    assert admitted(budget, driver, 5) == 1


def test_a_known_token_skips_the_connection_bucket_and_uses_its_drivers_share(
    budget: ReviewBudget,
) -> None:
    sum(admitted(budget, caller(f"10.0.5.{n}"), 2) for n in range(50))  # the flood
    stranger = caller("10.0.6.1")
    assert admitted(budget, stranger, 1) == 0
    # GPU's own token asked about again (its answer expired): GPU's share, 2 at once.
    assert admitted(budget, stranger, 5, known=GPU) == 2
    # NIC's share is NIC's.
    assert admitted(budget, stranger, 5, known=NIC) == 2


def test_an_address_a_driver_connected_from_has_a_share_apart(budget: ReviewBudget) -> None:
    budget.recognise(caller("10.0.7.7"), GPU)
    driver_connection = caller("10.0.7.8")
    budget.recognise(driver_connection, GPU)
    sum(admitted(budget, caller(f"10.0.8.{n}"), 2) for n in range(50))  # the flood
    # New connections from GPU's address (a restarted container): the address share.
    assert sum(admitted(budget, caller("10.0.7.7"), 1) for _ in range(5)) == 2
    # Others on that address could use it up, but not GPU's own share.
    assert admitted(budget, driver_connection, 1) == 1


def test_a_connection_that_shows_a_token_of_no_driver_loses_the_share(
    budget: ReviewBudget,
) -> None:
    driver = caller("10.0.10.1")
    budget.recognise(driver, GPU)
    sum(admitted(budget, caller(f"10.0.11.{n}"), 2) for n in range(50))  # the flood
    # Others on GPU's address use up the share of that address.
    assert sum(admitted(budget, caller("10.0.10.1"), 1) for _ in range(5)) == 2
    budget.distrust(driver)  # it showed a token that is no driver's
    assert admitted(budget, driver, 1) == 0  # GPU's own share is no longer its


def test_an_addresses_share_lasts_an_hour(budget: ReviewBudget, clock: Clock) -> None:
    budget.recognise(caller("10.0.12.1"), GPU)
    clock.now += 3601
    sum(admitted(budget, caller(f"10.0.13.{n}"), 2) for n in range(50))  # the flood, now
    assert admitted(budget, caller("10.0.12.1"), 1) == 0


def test_source_state_stays_bounded(budget: ReviewBudget, clock: Clock) -> None:
    for n in range(MAX_SOURCES + 500):
        clock.now += 0.0001
        admitted(budget, caller(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"), 1)
    assert budget.tracked_sources <= MAX_SOURCES
    clock.now += 10  # every bucket full again: none kept
    admitted(budget, caller("10.200.0.1"), 1)
    assert budget.tracked_sources == 1


def test_refusals_on_a_connection_are_paced_after_a_burst(clock: Clock) -> None:
    budget = ReviewBudget(Limits(token_refusals_per_connection=4), clock=clock)
    one, other = ReviewCaller("10.0.0.1"), ReviewCaller("10.0.0.1")
    assert [budget.pace(one) for _ in range(4)] == [0, 0, 0, 0]  # the burst: max(2, rate)
    assert budget.pace(one) == pytest.approx(0.25)
    clock.now += 0.25  # answered after its hold; the next one waits its turn again
    assert budget.pace(one) == pytest.approx(0.25)
    assert budget.pace(other) == 0
    clock.now += 10
    assert budget.pace(one) == 0
