"""Settings, from keyword arguments or `STEPTRAIL_*` environment variables."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.retry import RetryPolicy

DEFAULT_RETENTION_DAYS = 30


class Settings(BaseSettings):
    """How a steptrail runtime behaves. Every field can be set as `STEPTRAIL_<FIELD>`.

    Attributes:
        database_url: `sqlite:///path.db` (default `sqlite:///steptrail.db`) or
            `postgresql://user@host:port/db`.
        lease_seconds: how long a segment may go without an append before the reaper may
            reclaim its run (default 900).
        max_requeues: the requeue budget shared by failure retries and reclaims (default 3).
        retry_base_seconds / retry_cap_seconds: backoff `min(base · 2^n, cap)` (30 s, 600 s).
        retry_jitter: fraction of each delay drawn off at random (default 0: exact delays).
        privacy_level: what the per-step log keeps: none, metadata (default), redacted, full.
            An invalid value means metadata.
        poll_interval: seconds an idle worker waits between looks at the queue when nothing
            wakes it (PostgreSQL wakes it with LISTEN/NOTIFY at once).
        auto_migrate: create or upgrade the schema on open, under a lock (default true).
        retention_days: global retention window (default 30; unset, zero, negative or
            invalid means 30). retention_agent_run_days (terminal runs) and
            retention_approval_days (every non-terminal run) fall back to it.
        tracing: OpenTelemetry spans of runs, segments and steps: `auto` (default) when the
            `opentelemetry-api` package is installed, `on` (fail if it is not), `off`.
    """

    model_config = SettingsConfigDict(env_prefix="STEPTRAIL_", extra="ignore")

    database_url: str = "sqlite:///steptrail.db"
    lease_seconds: float = Field(default=900.0, gt=0)
    max_requeues: int = Field(default=3, ge=0)
    retry_base_seconds: float = Field(default=30.0, ge=0)
    retry_cap_seconds: float = Field(default=600.0, ge=0)
    retry_jitter: float = Field(default=0.0, ge=0, le=1)
    privacy_level: PrivacyLevel = PrivacyLevel.METADATA
    poll_interval: float = Field(default=1.0, gt=0)
    auto_migrate: bool = True
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"
    retention_days: int = DEFAULT_RETENTION_DAYS
    retention_agent_run_days: int | None = None
    retention_approval_days: int | None = None
    app: str | None = None
    tracing: Literal["auto", "on", "off"] = "auto"

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
        return _window(value, "retention_days") or DEFAULT_RETENTION_DAYS

    @field_validator("retention_agent_run_days", "retention_approval_days", mode="before")
    @classmethod
    def _category_window(cls, value: Any) -> int | None:
        return _window(value, "retention window")

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


def _window(value: Any, name: str) -> int | None:
    """A positive whole number of days, or None (fall back) with a warning if it was set."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        days = int(str(value).strip())
    except ValueError:
        days = 0
    if days <= 0:
        warnings.warn(f"invalid {name} {value!r}; falling back", stacklevel=3)
        return None
    return days
