"""Retention: which runs a purge removes, decided from windows and the store's `now`.

Two categories, each with its own window falling back to the global one (30 days unless
configured): `agent_run` covers terminal runs, `approval` covers every run not yet terminal
(queued, running and waiting alike), so a run nobody decided on expires too. The cutoff is
on the run's creation time. `--days N` (N ≥ 1) overrides every window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from steptrail.domain.enums import RunStatus

DEFAULT_DAYS = 30


class Category(StrEnum):
    AGENT_RUN = "agent_run"
    APPROVAL = "approval"

    @property
    def statuses(self) -> tuple[RunStatus, ...]:
        terminal = tuple(s for s in RunStatus if s.is_terminal)
        if self is Category.AGENT_RUN:
            return terminal
        return tuple(s for s in RunStatus if not s.is_terminal)


@dataclass(frozen=True)
class RetentionPolicy:
    """Windows in days; `None` for a category means the global window."""

    days: int = DEFAULT_DAYS
    agent_run_days: int | None = None
    approval_days: int | None = None

    def __post_init__(self) -> None:
        for value in (self.days, self.agent_run_days, self.approval_days):
            if value is not None and value < 1:
                raise ValueError("retention windows are whole days, at least 1")

    def window(self, category: Category, override: int | None = None) -> int:
        """The window of `category` in days (`override`, if given, wins)."""
        if override is not None:
            if override < 1:
                raise ValueError("--days must be a positive whole number")
            return override
        specific = self.agent_run_days if category is Category.AGENT_RUN else self.approval_days
        return specific if specific is not None else self.days

    def cutoffs(self, now: datetime, override: int | None = None) -> dict[Category, datetime]:
        """Runs of each category created before its cutoff are due for purging."""
        return {c: now - timedelta(days=self.window(c, override)) for c in Category}
