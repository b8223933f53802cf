"""Unit tests of failure classification: which class an exception is, and whether it retries."""

from __future__ import annotations

import pytest

from steptrail.domain.classifier import (
    ClassifiedError,
    Classifier,
    FallbackChainExhausted,
    HttpStatusError,
    classify,
    status_class,
)
from steptrail.domain.enums import FailureClass


class Response:
    """A stand-in for an HTTP client's response object: only its status code matters."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class ProviderError(Exception):
    """An error that carries its HTTP response, the way most SDKs raise."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"provider said {status_code}")
        self.response = Response(status_code)


class QuotaError(Exception):
    """A user's own exception type."""


class HardQuotaError(QuotaError):
    """A subclass of the user's exception type."""


class StatusAttrError(Exception):
    """An error exposing its status as `status` rather than `status_code`."""

    def __init__(self, status: object) -> None:
        super().__init__("boom")
        self.status = status


def test_failure_class__eight_classes_and_the_durable_two() -> None:
    """There are the eight reference failure classes plus timeout and non_deterministic."""
    assert {c.value for c in FailureClass} == {
        "connection",
        "rate_limit",
        "auth",
        "configuration",
        "client_error",
        "server_error",
        "circuit_open",
        "timeout",
        "non_deterministic",
        "unknown",
    }


def test_is_retryable__exactly_the_transient_classes() -> None:
    """Only connection, rate_limit, server_error, circuit_open and timeout are retried."""
    retryable = {c for c in FailureClass if c.is_retryable}
    assert retryable == {
        FailureClass.CONNECTION,
        FailureClass.RATE_LIMIT,
        FailureClass.SERVER_ERROR,
        FailureClass.CIRCUIT_OPEN,
        FailureClass.TIMEOUT,
    }


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (401, FailureClass.AUTH),
        (403, FailureClass.AUTH),
        (429, FailureClass.RATE_LIMIT),
        (500, FailureClass.SERVER_ERROR),
        (502, FailureClass.SERVER_ERROR),
        (503, FailureClass.SERVER_ERROR),
        (599, FailureClass.SERVER_ERROR),
        (400, FailureClass.CLIENT_ERROR),
        (404, FailureClass.CLIENT_ERROR),
        (408, FailureClass.CLIENT_ERROR),
        (422, FailureClass.CLIENT_ERROR),
        (499, FailureClass.CLIENT_ERROR),
    ],
)
def test_classify__http_status(status: int, expected: FailureClass) -> None:
    """An HTTP status maps 401/403 auth, 429 rate_limit, 5xx server_error, other 4xx client."""
    assert status_class(status) is expected
    assert classify(HttpStatusError(status)) is expected
    assert classify(ProviderError(status)) is expected


@pytest.mark.parametrize("status", [200, 204, 302, 399, 600])
def test_classify__non_error_status_is_unknown(status: int) -> None:
    """A status that is not a 4xx/5xx error says nothing, so the error is unknown."""
    assert status_class(status) is None
    assert classify(HttpStatusError(status)) is FailureClass.UNKNOWN
    assert classify(ProviderError(status)) is FailureClass.UNKNOWN


def test_classify__status_attribute_named_status() -> None:
    """A status exposed as `status` counts like `status_code`."""
    assert classify(StatusAttrError(429)) is FailureClass.RATE_LIMIT


@pytest.mark.parametrize("status", [True, "503", 503.0, None])
def test_classify__non_int_status_ignored(status: object) -> None:
    """Only a real integer is an HTTP status; a bool, string or float is not."""
    assert classify(StatusAttrError(status)) is FailureClass.UNKNOWN


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError("reset"),
        ConnectionRefusedError("refused"),
        ConnectionResetError("reset"),
        BrokenPipeError("pipe"),
        ConnectionAbortedError("aborted"),
        TimeoutError("slow"),
    ],
)
def test_classify__connection_and_timeout(error: BaseException) -> None:
    """The standard library's connection and timeout errors are connection failures."""
    assert classify(error) is FailureClass.CONNECTION
    assert classify(error).is_retryable


@pytest.mark.parametrize(
    "error", [Exception("?"), ValueError("bad"), KeyError("k"), RuntimeError("x"), OSError("io")]
)
def test_classify__anything_else_unknown_not_retryable(error: BaseException) -> None:
    """An error no rule knows is unknown, and unknown is never retried."""
    assert classify(error) is FailureClass.UNKNOWN
    assert not classify(error).is_retryable


@pytest.mark.parametrize("failure_class", list(FailureClass))
def test_classify__declared_class_wins_over_status(failure_class: FailureClass) -> None:
    """An error that declares its failure class is that class, whatever else it carries."""
    error = ClassifiedError(failure_class)
    error.status_code = 500  # type: ignore[attr-defined]
    assert classify(error) is failure_class


def test_classified_error__accepts_string() -> None:
    """A failure class given by name is parsed; an unknown name raises."""
    assert ClassifiedError("circuit_open").failure_class is FailureClass.CIRCUIT_OPEN
    with pytest.raises(ValueError, match="nonsense"):
        ClassifiedError("nonsense")


def test_fallback_chain__classified_by_most_recent_attempt() -> None:
    """An exhausted fallback chain is the class of its last attempt, not its first."""
    chain = FallbackChainExhausted([HttpStatusError(401), HttpStatusError(503)])
    assert classify(chain) is FailureClass.SERVER_ERROR
    chain = FallbackChainExhausted([HttpStatusError(503), HttpStatusError(401)])
    assert classify(chain) is FailureClass.AUTH


def test_fallback_chain__recursive() -> None:
    """A chain whose last attempt is itself a chain classifies by that chain's last attempt."""
    inner = FallbackChainExhausted([ValueError("x"), TimeoutError("slow")])
    outer = FallbackChainExhausted([HttpStatusError(500), inner])
    assert classify(outer) is FailureClass.CONNECTION


def test_fallback_chain__empty_is_unknown() -> None:
    """An empty chain, even nested as the last attempt, is unknown."""
    assert classify(FallbackChainExhausted([])) is FailureClass.UNKNOWN
    nested = FallbackChainExhausted([HttpStatusError(503), FallbackChainExhausted([])])
    assert classify(nested) is FailureClass.UNKNOWN


def test_fallback_chain__last_attempt_uses_user_mappings() -> None:
    """The recursion into the last attempt still applies the user's mappings."""
    classifier = Classifier()
    classifier.register(QuotaError, FailureClass.RATE_LIMIT)
    chain = FallbackChainExhausted([HttpStatusError(500), QuotaError("over quota")])
    assert classifier(chain) is FailureClass.RATE_LIMIT
    assert classify(chain) is FailureClass.UNKNOWN


def test_register__user_mapping_wins() -> None:
    """A registered mapping overrides every built-in rule, even an HTTP status."""
    classifier = Classifier()
    classifier.register(HttpStatusError, FailureClass.CIRCUIT_OPEN)
    classifier.register(TimeoutError, "configuration")
    assert classifier(HttpStatusError(401)) is FailureClass.CIRCUIT_OPEN
    assert classifier(TimeoutError()) is FailureClass.CONFIGURATION
    assert classify(HttpStatusError(401)) is FailureClass.AUTH


def test_register__applies_to_subclasses() -> None:
    """A mapping for a class also classifies its subclasses."""
    classifier = Classifier()
    classifier.register(QuotaError, FailureClass.RATE_LIMIT)
    assert classifier(HardQuotaError()) is FailureClass.RATE_LIMIT
    assert classifier(ValueError()) is FailureClass.UNKNOWN


def test_register__most_specific_mro_entry_first() -> None:
    """With mappings for a class and its subclass, the subclass's mapping wins for it."""
    classifier = Classifier()
    classifier.register(HardQuotaError, FailureClass.CONFIGURATION)
    classifier.register(QuotaError, FailureClass.RATE_LIMIT)
    assert classifier(HardQuotaError()) is FailureClass.CONFIGURATION
    assert classifier(QuotaError()) is FailureClass.RATE_LIMIT


def test_register__later_registration_replaces() -> None:
    """Registering the same type again replaces its class."""
    classifier = Classifier({QuotaError: FailureClass.RATE_LIMIT})
    assert classifier(QuotaError()) is FailureClass.RATE_LIMIT
    classifier.register(QuotaError, FailureClass.AUTH)
    assert classifier(QuotaError()) is FailureClass.AUTH


def test_register__only_exception_classes() -> None:
    """Registering something that is not an exception class raises TypeError."""
    classifier = Classifier()
    with pytest.raises(TypeError):
        classifier.register(int, FailureClass.AUTH)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        classifier.register(ValueError(), FailureClass.AUTH)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nonsense"):
        classifier.register(ValueError, "nonsense")
    assert classifier(ValueError()) is FailureClass.UNKNOWN


def test_classifier__mappings_are_copied() -> None:
    """The classifier keeps its own copy, so mutating the dict given to it changes nothing."""
    given = {QuotaError: FailureClass.RATE_LIMIT}
    classifier = Classifier(given)
    given[QuotaError] = FailureClass.AUTH
    assert classifier(QuotaError()) is FailureClass.RATE_LIMIT
