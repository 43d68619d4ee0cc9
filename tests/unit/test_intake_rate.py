"""A tenant's rate into the log (``services/intake/rate.py``): a token bucket per tenant, by
table and by property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.services.intake.rate import TOKEN_BYTES, Buckets, Rate, cost


def test_a_burst_is_taken_then_the_rest_waits_its_turn() -> None:
    buckets = Buckets(Rate(per_s=2.0, burst=3))
    assert [buckets.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a", 0.0) == pytest.approx(0.5)  # one token back in half a second
    assert buckets.take("a", 0.25) == pytest.approx(0.25)  # a refused request takes nothing
    assert buckets.take("a", 0.5) == 0.0
    assert buckets.take("a", 0.5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("size", "tokens"),
    [(0, 1), (1, 1), (TOKEN_BYTES, 1), (TOKEN_BYTES + 1, 2), (256 * 1024, 64)],
)
def test_a_request_costs_a_token_for_each_4_kib_it_starts(size: int, tokens: int) -> None:
    assert cost(size) == tokens


def test_a_large_request_takes_its_tokens_even_past_the_burst() -> None:
    buckets = Buckets(Rate(per_s=4.0, burst=10))
    assert buckets.take("a", 0.0, 8) == 0.0
    assert buckets.take("a", 0.0, 4) == pytest.approx(0.5)  # 2 left: 2 more in half a second
    assert buckets.take("a", 0.5, 4) == 0.0
    # One that costs more than the bucket holds is taken from a full bucket, not refused for
    # good, and owes the rest: the next waits until all 64 are paid back and the bucket is full.
    assert buckets.take("b", 0.0, 64) == 0.0
    assert buckets.take("b", 0.0, 64) == pytest.approx(16.0)
    assert buckets.take("b", 16.0, 64) == 0.0


@pytest.mark.parametrize("burst", [1, 10, 64, 10_000])
def test_the_bytes_a_tenant_keeps_sending_are_bounded_whatever_its_burst(burst: int) -> None:
    # Charged at most the burst, a 256 KiB request cost one token at a burst of 1 (a strict
    # rate): 64 times the bytes ``per_s * TOKEN_BYTES`` says.
    rate = Rate(per_s=10.0, burst=burst)
    buckets = Buckets(rate)
    while buckets.take("a", 0.0) == 0.0:  # the burst spent: the steady rate is measured
        pass
    size, taken, now = 256 * 1024, 0, 0.0
    while now < 100.0:
        wait = buckets.take("a", now, cost(size))
        taken += wait == 0.0
        now += wait
    assert taken * size / 100.0 <= 1.05 * rate.per_s * TOKEN_BYTES


def test_a_quiet_tenant_has_its_burst_again_and_no_more() -> None:
    buckets = Buckets(Rate(per_s=10.0, burst=2))
    for _ in range(2):
        buckets.take("a", 0.0)
    assert [buckets.take("a", 100.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.1)]


def test_one_tenant_past_its_rate_holds_no_other_back() -> None:
    buckets = Buckets(Rate(per_s=1.0, burst=1))
    assert buckets.take("a", 0.0) == 0.0
    assert buckets.take("a", 0.0) > 0
    assert buckets.take("b", 0.0) == 0.0


def test_a_clock_that_steps_back_gives_nothing_back() -> None:
    buckets = Buckets(Rate(per_s=1.0, burst=1))
    assert buckets.take("a", 10.0) == 0.0
    assert buckets.take("a", 5.0) == pytest.approx(1.0)


def test_full_buckets_are_let_go_so_any_number_of_names_stays_bounded() -> None:
    # Without logins any name is a tenant: a client naming a new one per request keeps only
    # the buckets that have not filled again.
    buckets = Buckets(Rate(per_s=1_000.0, burst=10))
    for i in range(100_000):
        buckets.take(f"t{i}", i / 1_000.0)  # each bucket full again 10 ms after its request
    assert buckets.tenants() <= 2_048


@pytest.mark.parametrize(
    ("per_s", "burst"), [(0.0, 1), (-1.0, 1), (math.nan, 1), (math.inf, 1), (1.0, 0), (1.0, -5)]
)
def test_a_rate_that_is_not_one_is_refused(per_s: float, burst: int) -> None:
    with pytest.raises(ValueError):
        Rate(per_s, burst)


@given(
    per_s=st.floats(0.5, 100.0),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=300),
)
def test_never_more_taken_than_the_burst_and_the_rate_allow(
    per_s: float, burst: int, gaps: list[float]
) -> None:
    buckets = Buckets(Rate(per_s, burst))
    now, taken = 0.0, 0
    for gap in gaps:
        now += gap
        wait = buckets.take("a", now)
        if wait == 0.0:
            taken += 1
        else:
            assert 0 < wait <= 1 / per_s + 1e-9
            assert buckets.take("a", now + wait) == 0.0  # sent again when told: taken
            taken += 1
            now += wait
        assert taken <= burst + now * per_s + 1e-6
