"""Failure classification: which class of failure an exception is, and so whether to retry.

`classify` is a pure function of the exception and the registered mappings. Its order:

1. a mapping the user registered for the exception's type (most specific class in its MRO);
2. a fallback chain that was exhausted classifies as its most recent attempt, recursively
   (an empty chain is `unknown`);
3. an exception that declares `failure_class` itself (`ClassifiedError`);
4. an HTTP status found on the exception or its `response`: 401/403 auth, 429 rate_limit,
   5xx server_error, any other 4xx client_error;
5. the standard library's connection and timeout errors are `connection`;
6. anything else is `unknown`, which is not retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from steptrail.domain.enums import FailureClass


class ClassifiedError(Exception):
    """An error that knows its failure class (raise it from a step to steer the retry)."""

    def __init__(self, failure_class: FailureClass | str, message: str = "") -> None:
        super().__init__(message or str(failure_class))
        self.failure_class = FailureClass(failure_class)


class HttpStatusError(Exception):
    """A provider answered with an HTTP error status."""

    def __init__(self, status_code: int, message: str = "") -> None:
        super().__init__(message or f"HTTP {status_code}")
        self.status_code = status_code


class FallbackChainExhausted(Exception):
    """Every provider in a fallback chain failed; `attempts` holds their errors, oldest first."""

    def __init__(self, attempts: Sequence[BaseException], message: str = "") -> None:
        super().__init__(message or f"fallback chain exhausted after {len(attempts)} attempt(s)")
        self.attempts = tuple(attempts)


def status_class(status: int) -> FailureClass | None:
    """The failure class of an HTTP status, or None when it is not an error status."""
    if status in (401, 403):
        return FailureClass.AUTH
    if status == 429:
        return FailureClass.RATE_LIMIT
    if 500 <= status <= 599:
        return FailureClass.SERVER_ERROR
    if 400 <= status <= 499:
        return FailureClass.CLIENT_ERROR
    return None


def _http_status(error: BaseException) -> int | None:
    for holder in (error, getattr(error, "response", None)):
        for attr in ("status_code", "status"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def classify(
    error: BaseException,
    mappings: Mapping[type[BaseException], FailureClass] | None = None,
) -> FailureClass:
    """The failure class of `error` (see the module docstring for the order of the rules)."""
    if mappings:
        for cls in type(error).__mro__:
            if cls in mappings:
                return mappings[cls]
    if isinstance(error, FallbackChainExhausted):
        if not error.attempts:
            return FailureClass.UNKNOWN
        return classify(error.attempts[-1], mappings)
    declared = getattr(error, "failure_class", None)
    if isinstance(declared, FailureClass):
        return declared
    status = _http_status(error)
    if status is not None and (by_status := status_class(status)) is not None:
        return by_status
    if isinstance(error, (ConnectionError, TimeoutError)):
        return FailureClass.CONNECTION
    return FailureClass.UNKNOWN


class Classifier:
    """`classify` with a registry of the user's own exception → class mappings."""

    def __init__(self, mappings: Mapping[type[BaseException], FailureClass] | None = None):
        self._mappings: dict[type[BaseException], FailureClass] = dict(mappings or {})

    def register(self, exc_type: type[BaseException], failure_class: FailureClass | str) -> None:
        if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
            raise TypeError(f"{exc_type!r} is not an exception class")
        self._mappings[exc_type] = FailureClass(failure_class)

    def __call__(self, error: BaseException) -> FailureClass:
        return classify(error, self._mappings)
