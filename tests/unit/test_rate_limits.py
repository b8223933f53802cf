"""The rate limit's pure parts (ADR 0080): definitions, the sliding-window decision and the
provider's Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steptrail import App
from steptrail.domain.classifier import classify
from steptrail.domain.enums import FailureClass
from steptrail.domain.rate_limits import (
    MAX_BLOCK_S,
    InvalidRateLimit,
    RateLimit,
    RateLimited,
    decide,
    fits,
    retry_after_of,
)
from steptrail.workers.rate_limits import claim

S = 1_000_000  # microseconds in a second


@pytest.mark.parametrize(
    "kwargs",
    [
        {"per": 60},  # neither requests nor tokens
        {"requests": 0, "per": 60},
        {"requests": -1, "per": 60},
        {"requests": True, "per": 60},
        {"requests": 1.5, "per": 60},
        {"tokens": 0, "per": 60},
        {"requests": 1, "per": 0},
        {"requests": 1, "per": -1},
        {"requests": 1, "per": float("nan")},
        {"requests": 1, "per": 10**9},
        {"requests": 1, "per": "60"},
        {"requests": 1, "per": 1, "margin": -0.1},
        {"requests": 1, "per": 1, "margin": 2},
    ],
)
def test_app_rate_limit__bad_values_are_refused_and_nothing_defined(kwargs: Any) -> None:
    """Each bad value raises InvalidRateLimit naming the limit; the app defines nothing."""
    app = App()
    with pytest.raises(InvalidRateLimit, match="openai"):
        app.rate_limit("openai", **kwargs)
    assert app.rate_limits == {}


@pytest.mark.parametrize("name", ["", " x", "a b", "x" * 101, "-lead", "tab\t", 7])
def test_app_rate_limit__bad_names_are_refused(name: Any) -> None:
    """A name is 1 to 100 letters, digits and _ . : - starting with a letter or digit."""
    with pytest.raises(InvalidRateLimit, match="name"):
        App().rate_limit(name, requests=1, per=1)


def test_app_rate_limit__one_definition_per_name_and_include_merges() -> None:
    """The same definition twice is fine; another under the same name is refused, also
    through include."""
    app = App()
    app.rate_limit("openai", requests=500, tokens=200_000, per=60)
    app.rate_limit("openai", requests=500, tokens=200_000, per=60)
    with pytest.raises(InvalidRateLimit, match="already defined"):
        app.rate_limit("openai", requests=5, per=60)
    other = App()
    other.rate_limit("openai", requests=1, per=1)
    with pytest.raises(InvalidRateLimit, match="already defined"):
        app.include(other)
    pack = App()
    pack.rate_limit("search", requests=3, per=1)
    app.include(pack)
    assert set(app.rate_limits) == {"openai", "search"}


def test_claim__checks_the_step_before_anything_runs() -> None:
    """tokens= needs limit=, the limit must be defined, the estimate must fit the limit."""
    limits = {"openai": RateLimit("openai", requests=None, tokens=100, per_s=60)}
    assert claim(limits, None, None) is None
    with pytest.raises(InvalidRateLimit, match="give limit="):
        claim(limits, None, 5)
    with pytest.raises(LookupError, match="defined: openai"):
        claim(limits, "other", 5)
    with pytest.raises(InvalidRateLimit, match="can never pass"):
        claim(limits, "openai", 101)
    with pytest.raises(InvalidRateLimit, match="at least 0"):
        claim(limits, "openai", -1)
    got = claim(limits, "openai", 100)
    assert got is not None
    assert (got.tokens, got.grant_id) == (100, None)


def test_decide__requests_wait_for_the_oldest_grant_to_leave() -> None:
    """3 requests per 10 s (no margin): the 4th waits until the 1st is 10 s old."""
    limit = RateLimit("r", requests=3, tokens=None, per_s=10, margin_s=0)
    grants = [(1 * S, 0), (2 * S, 0), (5 * S, 0)]
    assert decide(limit, grants, now_us=6 * S, tokens=0) == 11 * S
    assert decide(limit, grants[1:], now_us=6 * S, tokens=0) == 6 * S


def test_decide__the_margin_widens_the_window() -> None:
    """A margin of 0.5 s makes the judged window 10.5 s."""
    limit = RateLimit("r", requests=1, tokens=None, per_s=10, margin_s=0.5)
    assert decide(limit, [(0, 0)], now_us=S, tokens=0) == 10.5 * S


def test_decide__tokens_wait_until_enough_leave() -> None:
    """100 tokens per 10 s: 40+50 held, 30 more must wait until the 40 leave; 60 more
    until both have."""
    limit = RateLimit("t", requests=None, tokens=100, per_s=10, margin_s=0)
    grants = [(1 * S, 40), (3 * S, 50)]
    assert decide(limit, grants, now_us=4 * S, tokens=10) == 4 * S
    assert decide(limit, grants, now_us=4 * S, tokens=30) == 11 * S
    assert decide(limit, grants, now_us=4 * S, tokens=100) == 13 * S


def test_decide__a_block_holds_every_grant_until_it_ends() -> None:
    """A provider's block delays even a grant the window would allow."""
    limit = RateLimit("b", requests=5, tokens=None, per_s=10)
    assert decide(limit, [], now_us=S, tokens=0, blocked_until_us=4 * S) == 4 * S
    assert decide(limit, [], now_us=5 * S, tokens=0, blocked_until_us=4 * S) == 5 * S


@given(
    requests=st.integers(1, 6),
    per=st.integers(1, 5),
    arrivals=st.lists(st.integers(0, 20 * S), min_size=1, max_size=60),
)
def test_decide__granting_as_told_never_overfills_any_window(
    requests: int, per: int, arrivals: list[int]
) -> None:
    """Acquirers arriving at any instants, each granted at the instant `decide` names: no
    half-open window of the judged width ever holds more than `requests` grants."""
    limit = RateLimit("p", requests=requests, tokens=None, per_s=per, margin_s=0)
    window = limit.window_us
    given_at: list[int] = []
    clock = 0
    for arrival in sorted(arrivals):
        clock = max(clock, arrival)
        inside = [(g, 0) for g in given_at if g > clock - window]
        at = decide(limit, inside, now_us=clock, tokens=0)
        if at > clock:  # waits, then asks again at that instant
            clock = at
            inside = [(g, 0) for g in given_at if g > clock - window]
            assert decide(limit, inside, now_us=clock, tokens=0) == clock
        given_at.append(clock)
    for t in given_at:
        assert sum(1 for g in given_at if t <= g < t + window) <= requests


NOW = datetime(2026, 10, 21, 7, 28, 0, tzinfo=UTC)


def test_retry_after_of__the_error_or_its_response_header() -> None:
    """`retry_after` on the error, else the Retry-After header, in seconds; junk is none; a
    huge value is capped."""
    assert retry_after_of(RateLimited(retry_after=2.5), now=NOW) == 2.5
    response = SimpleNamespace(headers={"Retry-After": "7"})
    assert retry_after_of(SimpleNamespace(response=response), now=NOW) == 7.0  # type: ignore[arg-type]
    junk = SimpleNamespace(headers={"retry-after": "soon, please"})
    assert retry_after_of(SimpleNamespace(response=junk), now=NOW) is None  # type: ignore[arg-type]
    assert retry_after_of(ValueError("no"), now=NOW) is None
    assert retry_after_of(RateLimited(retry_after=10**9), now=NOW) == MAX_BLOCK_S
    assert retry_after_of(RateLimited(retry_after="nan"), now=NOW) is None
    assert classify(RateLimited(retry_after=1)) is FailureClass.RATE_LIMIT


def test_retry_after_of__an_http_date_is_seconds_from_now() -> None:
    """An HTTP date (on the error or in the header) is the seconds from `now` to it: a date
    past is 0, one beyond the cap is capped, a "-0000" date is UTC, a datetime works too."""
    dated = SimpleNamespace(headers={"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"})
    assert retry_after_of(SimpleNamespace(response=dated), now=NOW) == 30.0  # type: ignore[arg-type]
    assert retry_after_of(RateLimited("Wed, 21 Oct 2026 07:29:00 GMT"), now=NOW) == 60.0
    assert retry_after_of(RateLimited("Wed, 21 Oct 2026 07:29:00 -0000"), now=NOW) == 60.0
    assert retry_after_of(RateLimited("Wed, 21 Oct 2026 09:28:00 +0200"), now=NOW) == 0.0
    assert retry_after_of(RateLimited("Wed, 21 Oct 2015 07:28:00 GMT"), now=NOW) == 0.0
    assert retry_after_of(RateLimited("Thu, 22 Oct 2026 07:28:00 GMT"), now=NOW) == MAX_BLOCK_S
    later = NOW + timedelta(seconds=12)
    assert retry_after_of(RateLimited(later), now=NOW) == 12.0


@given(
    requests=st.one_of(st.none(), st.integers(1, 5)),
    tokens=st.one_of(st.none(), st.integers(1, 100)),
    # Inside the window ending now (10 s, no margin): after 0, as the store's prune leaves.
    grants=st.lists(st.tuples(st.integers(1, 9 * S), st.integers(0, 40)), max_size=8),
    want=st.integers(0, 100),
    blocked=st.one_of(st.none(), st.integers(0, 20 * S)),
)
def test_fits__agrees_with_decide_at_now(
    requests: int | None,
    tokens: int | None,
    grants: list[tuple[int, int]],
    want: int,
    blocked: int | None,
) -> None:
    """The store grants from the window's totals (`fits`) and reads the grants only to
    compute a wait (`decide`): both say the same about now."""
    if requests is None and tokens is None:
        requests = 1
    limit = RateLimit("f", requests=requests, tokens=tokens, per_s=10, margin_s=0)
    want = min(want, tokens or want)
    now = 10 * S
    grants = sorted(grants)
    held = sum(t for _, t in grants)
    allowed = fits(
        limit, grants=len(grants), held=held, tokens=want, now_us=now, blocked_until_us=blocked
    )
    assert allowed == (
        decide(limit, grants, now_us=now, tokens=want, blocked_until_us=blocked) == now
    )
