"""Logging: structlog events that travel through the standard `logging` module (ADR 0021).

steptrail logs with structlog (snake_case past-tense events with fixed keys `run_id`,
`worker_id`, `version`; never a payload, STYLE 9), but its loggers do not depend on the
process-wide structlog configuration: each is a structlog logger wrapped around the stdlib
logger `steptrail`, so

* embedded in a program, steptrail writes nothing by itself: records go to the `steptrail`
  logger and the host's logging configuration decides where they land (with none, Python
  prints warnings and errors to stderr, and nothing else);
* the CLI calls `configure_logging`, which puts one stderr handler on that logger rendering
  JSON lines (stderr not a terminal) or readable lines (a terminal).

`STEPTRAIL_LOG_LEVEL` sets the level of the `steptrail` logger when it is given.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

LOGGER_NAME = "steptrail"

_PRE_CHAIN: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


_FILTERING = structlog.make_filtering_bound_logger(logging.DEBUG)


class _LevelCheckedLogger(_FILTERING):  # type: ignore[misc, valid-type]
    """The filtering logger, asking the stdlib logger's level before building anything for
    `debug` and `info`: the worker logs a few info events per run, and at the usual
    `warning` each cost a bound-method chain, an event dict and the `filter_by_level`
    processor raising `DropEvent` (ADR 0053). The answer is read on every call, so a level
    set later (`set_level`, the host's logging configuration) applies at once."""

    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        if not self._logger.isEnabledFor(logging.DEBUG):
            return None
        return super().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        if not self._logger.isEnabledFor(logging.INFO):
            return None
        return super().info(event, *args, **kw)


def steptrail_logger() -> structlog.typing.FilteringBoundLogger:
    """A structlog logger that hands its events to the stdlib logger `steptrail`.

    Events below the stdlib logger's effective level are dropped before any processing.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        logging.getLogger(LOGGER_NAME),
        processors=[
            structlog.stdlib.filter_by_level,
            *_PRE_CHAIN,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=_LevelCheckedLogger,
        cache_logger_on_first_use=False,
    )
    return logger


def set_level(level: str) -> None:
    """Set the `steptrail` logger's level (`debug` … `critical`)."""
    logging.getLogger(LOGGER_NAME).setLevel(level.upper())


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto", level: str = "info"
) -> None:
    """Send steptrail's log to stderr, as JSON lines or readable lines (what the CLI does;
    embedders configure `logging` their own way instead)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=_PRE_CHAIN,
        )
    )
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if getattr(h, "_steptrail_cli", False)]:
        logger.removeHandler(old)
    handler._steptrail_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    set_level(level)
