"""Rate limits shared by every worker (ADR 0080): their definitions and the sliding-window rule.

A rate limit says "at most `requests` grants and at most `tokens` estimated tokens in any
window of `per` seconds". The store keeps every grant (when, how many tokens) and decides a
new one under a lock on the limit's row with `decide`, a pure function of the grants still
in the window, the store's clock and the limit's block (a provider's `Retry-After`). The
window judged is `per + margin`: the margin covers the delay between the store's grant and
the call reaching the provider, which differs from one call to the next.

Why a log of grants rather than a counter: a fixed-window counter lets twice the limit
through across a boundary, a token bucket lets its burst plus the refill through in one
window; only the grants themselves can answer "how many in *any* window of `per` seconds".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import FailureClass

# A grant past this delay after its window opens is not worth waiting for in a test, and a
# definition beyond it is almost certainly seconds given as milliseconds.
MAX_PER_S = 7 * 24 * 3600.0
# The default margin added to the window (seconds): two calls whose delays between grant
# and provider differ by less than it are still `per` seconds apart at the provider.
DEFAULT_MARGIN_S = 0.2
# A provider's Retry-After beyond this is taken as this (a typo must not block for a day).
MAX_BLOCK_S = 3600.0
STEP_NAME_PREFIX = "rate_limit:"
# Burst mode waits for a run asleep for its rate limit only if it wakes within this many
# seconds (ADR 0083): a drain under a minute's window finishes, a run told to wait an hour
# is left to the next worker, as a run sleeping on its own timer is.
BURST_HORIZON_S = 60.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")


class InvalidRateLimit(ValueError):
    """A rate limit's definition, or a step's use of one, is refused (nothing is written)."""


class UnknownRateLimit(LookupError):
    """No rate limit of that name is defined (in the app, or in the store)."""


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRateLimit(f"{what} is a whole number of at least 1, not {value!r}")
    if value > 2**53:
        raise InvalidRateLimit(f"{what} of {value} is beyond what a store keeps")
    return value


def _seconds(value: Any, what: str, *, zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidRateLimit(f"{what} is a number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not zero) or value > MAX_PER_S:
        low = "0" if zero else "more than 0"
        raise InvalidRateLimit(f"{what} is {low} and at most {MAX_PER_S:g} s, not {value!r}")
    return float(value)


def check_name(name: Any) -> str:
    """`name` if it can name a rate limit: 1 to 100 letters, digits, `_ . : -`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRateLimit(
            f"a rate limit's name is 1 to 100 letters, digits and _ . : - "
            f"(starting with a letter or digit), not {name!r}"
        )
    return name


def check_estimate(tokens: Any, keyword: str = "tokens=") -> int:
    """An estimate of tokens as `keyword` gives it: 0 if None, else a whole number of at
    least 0 (what any limit's grant may hold is `RateLimit.check_use`)."""
    if tokens is None:
        return 0
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidRateLimit(f"{keyword} is a whole number of at least 0, not {tokens!r}")
    return tokens


@dataclass(frozen=True)
class RateLimit:
    """At most `requests` grants and `tokens` estimated tokens in any `per_s` seconds (either
    may be None, not both), judged over `per_s + margin_s`."""

    name: str
    requests: int | None
    tokens: int | None
    per_s: float
    margin_s: float = DEFAULT_MARGIN_S

    def __post_init__(self) -> None:
        check_name(self.name)
        _count(self.requests, f"rate limit {self.name!r}: requests")
        _count(self.tokens, f"rate limit {self.name!r}: tokens")
        if self.requests is None and self.tokens is None:
            raise InvalidRateLimit(f"rate limit {self.name!r} needs requests=, tokens= or both")
        _seconds(self.per_s, f"rate limit {self.name!r}: per", zero=False)
        _seconds(self.margin_s, f"rate limit {self.name!r}: margin", zero=True)
        if self.margin_s > self.per_s:
            raise InvalidRateLimit(
                f"rate limit {self.name!r}: a margin of {self.margin_s:g} s is more than its "
                f"window of {self.per_s:g} s"
            )

    @property
    def per_ms(self) -> int:
        return round(self.per_s * 1000)

    @property
    def margin_ms(self) -> int:
        return round(self.margin_s * 1000)

    @property
    def window_us(self) -> int:
        """The window the store judges, in microseconds: `per` plus the margin."""
        return (self.per_ms + self.margin_ms) * 1000

    def check_use(self, tokens: Any) -> int:
        """The tokens a step estimates (0 if None), refused if no grant could ever hold them."""
        estimate = check_estimate(tokens)
        if self.tokens is not None and estimate > self.tokens:
            raise InvalidRateLimit(
                f"a step estimating {tokens} tokens can never pass rate limit {self.name!r} "
                f"({self.tokens} tokens per {self.per_s:g} s)"
            )
        return estimate


@dataclass(frozen=True)
class RateLimitRow:
    """A stored limit with its window's use now (`steptrail limits`)."""

    limit: RateLimit
    used_requests: int
    used_tokens: int
    blocked_until: datetime | None
    updated_by: str


@dataclass(frozen=True)
class RateAnswer:
    """The store's answer to an acquire: a grant (its id), or the seconds to wait first."""

    grant_id: int | None
    wait_s: float


def decide(
    limit: RateLimit,
    grants: Sequence[tuple[int, int]],
    *,
    now_us: int,
    tokens: int,
    blocked_until_us: int | None = None,
) -> int:
    """When a grant of `tokens` may be given: `now_us` (at once) or a later instant.

    `grants` are `(granted_at_us, tokens)` of the limit, oldest first, all inside the window
    ending now (`granted_at > now - window`). A grant at `t` is allowed when the grants in
    `(t - window, t]` number fewer than `requests` and hold at most `tokens - tokens_wanted`:
    the half-open window means any `window` microseconds hold at most `requests` grants.
    """
    window = limit.window_us
    at = now_us if blocked_until_us is None else max(now_us, blocked_until_us)
    if limit.requests is not None and len(grants) >= limit.requests:
        # The oldest grants that must leave the window first: the k-th leaves at its time
        # plus the window.
        k = len(grants) - limit.requests + 1
        at = max(at, grants[k - 1][0] + window)
    if limit.tokens is not None:
        held = sum(t for _, t in grants)
        for granted_at, spent in grants:
            if held + tokens <= limit.tokens:
                break
            held -= spent
            at = max(at, granted_at + window)
    return at


def fits(
    limit: RateLimit,
    *,
    grants: int,
    held: int,
    tokens: int,
    now_us: int,
    blocked_until_us: int | None = None,
) -> bool:
    """Whether a grant of `tokens` may be given now, from the window's totals only (`grants`
    in it, `held` tokens): what `decide` answers with `now_us`, without reading the grants
    themselves, which only a wait needs."""
    if blocked_until_us is not None and blocked_until_us > now_us:
        return False
    if limit.requests is not None and grants >= limit.requests:
        return False
    return limit.tokens is None or held + tokens <= limit.tokens


def retry_after_of(error: BaseException, *, now: datetime) -> float | None:
    """The seconds a provider asked to wait: `retry_after` on the error, or the
    `Retry-After` header of its `response`; either as seconds or as an HTTP date (RFC 9110,
    read with `email.utils.parsedate_to_datetime`, turned into seconds from `now`). Capped
    at MAX_BLOCK_S; a date already past is 0; None if it says nothing readable."""
    value: Any = getattr(error, "retry_after", None)
    if value is None:
        headers: Any = getattr(getattr(error, "response", None), "headers", None)
        if isinstance(headers, Mapping):
            value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    return retry_after_seconds(value, now=now)


def retry_after_seconds(value: Any, *, now: datetime) -> float | None:
    """A `Retry-After` value (seconds as a number or text, an HTTP date as text or a
    `datetime`) as seconds from `now`, capped at MAX_BLOCK_S; None if unreadable."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                value = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                return None
    if isinstance(value, datetime):
        # An HTTP date is GMT; one written with "-0000" parses naive: take it as UTC.
        at = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        value = (at - now).total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return min(max(float(value), 0.0), MAX_BLOCK_S)


class RateLimited(ClassifiedError):
    """Raise from a step when a provider refused it for its rate (a 429), with how long it
    asked to wait: seconds, or its `Retry-After` header as given (seconds or an HTTP date,
    such as "Wed, 21 Oct 2026 07:28:00 GMT", or a `datetime`). A step with `limit=` blocks
    that limit for every worker until then (ADR 0080, 0083); a value that cannot be read
    blocks nothing. Classified `rate_limit`, so the run's retry policy for it applies."""

    def __init__(
        self, retry_after: float | str | datetime | None = None, message: str = ""
    ) -> None:
        super().__init__(FailureClass.RATE_LIMIT, message or "rate limited by the provider")
        self.retry_after = retry_after
