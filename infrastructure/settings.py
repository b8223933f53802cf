"""Settings, from keyword arguments or `STEPTRAIL_*` environment variables.

Every number is finite and bounded: an out-of-range value is refused with an error that names
the variable and the range it must be in (ADR 0021), instead of passing validation and
crashing a worker later (`inf` seconds, a lease of 1e300 s, a retention window past year
9999).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

from pydantic import ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_REQUEST_BYTES, MAX_DAYS
from steptrail.domain.retry import RetryPolicy

DEFAULT_RETENTION_DAYS = 30
DAY_S = 86_400.0

# name: (lowest, highest, whether the lowest itself is allowed)
RANGES: dict[str, tuple[float, float, bool]] = {
    "lease_seconds": (0.0, 7 * DAY_S, False),
    "max_requeues": (0, 1000, True),
    "retry_base_seconds": (0.0, DAY_S, True),
    "retry_cap_seconds": (0.0, 7 * DAY_S, True),
    "retry_jitter": (0.0, 1.0, True),
    "poll_interval": (0.0, 3600.0, False),
    "max_request_bytes": (1024, 1 << 30, True),
    "max_payload_bytes": (1024, 1 << 30, True),
}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class InvalidSettings(ValueError):
    """A setting is out of range or malformed; the message names the variable."""


def variable(field: str) -> str:
    return f"STEPTRAIL_{field.upper()}"


def describe_range(field: str) -> str:
    low, high, inclusive = RANGES[field]
    kind = "a whole number" if isinstance(low, int) else "a finite number"
    lower = f"at least {low:g}" if inclusive else f"above {low:g}"
    return f"{kind} {lower} and at most {high:g}"


def _bounded(field: str, value: Any) -> float:
    low, high, inclusive = RANGES[field]
    try:
        number = float(str(value).strip()) if not isinstance(value, (int, float)) else value
    except ValueError:
        number = math.nan
    whole = isinstance(low, int)
    ok = (
        not isinstance(number, bool)
        and math.isfinite(number)
        and (number >= low if inclusive else number > low)
        and number <= high
        and (not whole or float(number).is_integer())
    )
    if not ok:
        raise ValueError(f"must be {describe_range(field)}, not {value!r}")
    return int(number) if whole else float(number)


class Settings(BaseSettings):
    """How a steptrail runtime behaves. Every field can be set as `STEPTRAIL_<FIELD>`.

    Attributes:
        database_url: `sqlite:///relative.db`, `sqlite:////absolute.db` or
            `postgresql://user:pass@host:port/db`; never empty. Add `?mode=ro` to open a
            SQLite database read-only.
        lease_seconds: how long a segment may go without an append before the reaper may
            reclaim its run; every step renews it, long steps every third of it.
        max_requeues: the requeue budget shared by failure retries and reclaims (3: at most
            4 executions).
        retry_base_seconds: the first retry delay; it doubles per retry, `min(base · 2^n,
            cap)`.
        retry_cap_seconds: no retry waits longer than this.
        retry_jitter: fraction of each delay drawn off at random to spread retries (0:
            exact delays).
        privacy_level: what the per-step log keeps: none, metadata, redacted, full. An
            invalid value means metadata, with a warning.
        poll_interval: seconds an idle worker waits between looks at the queue when nothing
            wakes it (PostgreSQL wakes it with LISTEN/NOTIFY at once) and no run it may
            claim comes due sooner (a timer, a wait's deadline: it waits until then).
        auto_migrate: create or upgrade the schema on open, under a lock; when false, run
            `steptrail migrate`.
        log_format: `json` (what `auto` means when stderr is not a terminal), `console`, or
            `auto`.
        log_level: the level of the `steptrail` logger.
        retention_days: the global retention window in days (unset, zero, negative or
            invalid means 30, with a warning; more than 36,500 is refused).
        retention_agent_run_days: the window for terminal runs; unset falls back to
            `retention_days`.
        retention_approval_days: the window for every run not yet terminal (queued,
            running, waiting); unset falls back to `retention_days`.
        max_request_bytes: the largest request accepted, as canonical JSON.
        max_payload_bytes: the largest step payload, result, submitted input or saved
            state accepted.
        app: `module:attribute` of your `steptrail.App` (what `--app` says on the command
            line).
        tracing: OpenTelemetry spans of runs, segments and steps: `auto` when the
            `opentelemetry-api` package is installed, `on` (fail if it is not), `off`.

    Raises:
        InvalidSettings: a value is out of range; the message names the variable.
    """

    model_config = SettingsConfigDict(env_prefix="STEPTRAIL_", extra="ignore")

    database_url: str = "sqlite:///steptrail.db"
    lease_seconds: float = 900.0
    max_requeues: int = 3
    retry_base_seconds: float = 30.0
    retry_cap_seconds: float = 600.0
    retry_jitter: float = 0.0
    privacy_level: PrivacyLevel = PrivacyLevel.METADATA
    poll_interval: float = 1.0
    auto_migrate: bool = True
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    retention_days: int = DEFAULT_RETENTION_DAYS
    retention_agent_run_days: int | None = None
    retention_approval_days: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    app: str | None = None
    tracing: Literal["auto", "on", "off"] = "auto"

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise InvalidSettings(settings_error(error)) from None

    @field_validator(*RANGES, mode="before")
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        return _bounded(info.field_name, value)

    @field_validator("database_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty (sqlite:///path.db or postgresql://host/db)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> Any:
        text = str(value).strip().lower()
        if text not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
        return text

    @field_validator("privacy_level", mode="before")
    @classmethod
    def _privacy(cls, value: Any) -> PrivacyLevel:
        level = PrivacyLevel.parse(value)
        if value is not None and str(value).strip().lower() != level.value:
            warnings.warn(f"invalid privacy level {value!r}; using metadata", stacklevel=2)
        return level

    @field_validator("retention_days", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> int:
        return _window(value, "STEPTRAIL_RETENTION_DAYS") or DEFAULT_RETENTION_DAYS

    @field_validator("retention_agent_run_days", "retention_approval_days", mode="before")
    @classmethod
    def _category_window(cls, value: Any, info: Any) -> int | None:
        return _window(value, variable(info.field_name))

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.lease_seconds * 1000))

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_requeues=self.max_requeues,
            base_ms=round(self.retry_base_seconds * 1000),
            cap_ms=round(self.retry_cap_seconds * 1000),
            jitter=self.retry_jitter,
        )


def settings_error(error: ValidationError) -> str:
    """One line per bad setting, each naming its variable: `STEPTRAIL_X must be …`."""
    problems = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"{variable(field)} {message}")
    return "; ".join(problems)


def _window(value: Any, name: str) -> int | None:
    """A positive whole number of days, or None (fall back) with a warning if it was set.

    Unset, blank, zero, negative or non-numeric falls back (the reference behaviour); a
    number of days past `MAX_DAYS` is refused, since falling back to 30 days would purge
    what the operator meant to keep.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        days = int(str(value).strip())
    except ValueError:
        days = 0
    if days > MAX_DAYS:
        raise ValueError(f"must be a whole number of days from 1 to {MAX_DAYS}, not {value!r}")
    if days <= 0:
        warnings.warn(f"invalid {name} {value!r}; falling back", stacklevel=3)
        return None
    return days
