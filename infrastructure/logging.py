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
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, cast

# structlog is imported when an event passes the `steptrail` logger's level, or when a
# record is formatted, not when steptrail is: a command that logs nothing (`stats`, `runs`,
# `show` at the default level) does not pay for it (ADR 0051).
if TYPE_CHECKING:
    import structlog

LOGGER_NAME = "steptrail"

# The levels of the methods the lazy logger checks itself, as `structlog.stdlib` numbers them.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def _pre_chain() -> list[structlog.typing.Processor]:
    import structlog

    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


@cache
def _level_checked() -> type[structlog.typing.FilteringBoundLogger]:
    """structlog's filtering logger (made for DEBUG: the stdlib logger's level decides),
    asking that level before building anything for `debug` and `info`. Once the real logger
    exists (any event passed the level), the worker's few info events per run would each go
    through the bound-method chain, an event dict and `filter_by_level` raising `DropEvent`
    at the usual `warning` (~1.2 µs; ~0.2 µs asked first, ADR 0053). The level is asked on
    every call, so a level set later applies at once."""
    import structlog

    base = structlog.make_filtering_bound_logger(logging.DEBUG)

    class LevelChecked(base):  # type: ignore[misc, valid-type]
        def debug(self, event: str, *args: Any, **kw: Any) -> Any:
            if not self._logger.isEnabledFor(logging.DEBUG):
                return None
            return super().debug(event, *args, **kw)

        def info(self, event: str, *args: Any, **kw: Any) -> Any:
            if not self._logger.isEnabledFor(logging.INFO):
                return None
            return super().info(event, *args, **kw)

    return LevelChecked


def _structlog_logger() -> structlog.typing.FilteringBoundLogger:
    import structlog

    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        logging.getLogger(LOGGER_NAME),
        processors=[
            structlog.stdlib.filter_by_level,
            *_pre_chain(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=_level_checked(),
        cache_logger_on_first_use=False,
    )
    return logger


class _LazyLogger:
    """steptrail's structlog logger, built on first real use.

    An event below the `steptrail` logger's level is dropped here, by the test structlog's
    `filter_by_level` (the real logger's first processor) would make, so nothing else
    happens for it; `bind` keeps the values for when the logger is built; any other use
    (an event that passes the level, …) builds the real logger and hands over to it."""

    def __init__(self, root: _LazyLogger | None = None, context: dict[str, Any] | None = None):
        self._root = root  # what `bind` was called on, first in the chain (None: this one)
        self._context = context or {}
        self._real: structlog.typing.FilteringBoundLogger | None = None

    def _logger(self) -> structlog.typing.FilteringBoundLogger:
        if self._real is None:
            if self._root is None:
                self._real = _structlog_logger()
            else:  # as `root.bind(...)` would have made it, had root been built
                self._real = self._root._logger().bind(**self._context)
        return self._real

    def bind(self, **values: Any) -> structlog.typing.FilteringBoundLogger:
        if self._real is not None:
            return self._real.bind(**values)
        root = self._root or self
        bound = _LazyLogger(root, self._context | values)
        return cast("structlog.typing.FilteringBoundLogger", bound)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy, pickle, … probe for these: never the real logger's
            raise AttributeError(name)
        level = _LEVELS.get(name)
        if level is None or self._real is not None:
            value = getattr(self._logger(), name)
            if level is not None:  # built: its own first processor filters by level now
                self.__dict__[name] = value
            return value

        # Made once per logger and level, and kept: the worker's bound loggers log a few
        # info events per run each, and at the usual `warning` every one of them stops at
        # the level check below. Kept in __dict__, a later call skips `__getattr__`, the
        # closure and the stdlib logger's lookup (a lock; ADR 0084). The level is still
        # asked on every call (isEnabledFor, whose cache setLevel clears, as structlog's
        # filter_by_level asks it), so a level set later applies at once; the first event
        # that passes builds the real logger, whose method then takes this one's place.
        stdlib = logging.getLogger(LOGGER_NAME)

        def log(event: str | None = None, *args: Any, **kw: Any) -> Any:
            if not stdlib.isEnabledFor(level):
                return None
            method = getattr(self._logger(), name)
            self.__dict__[name] = method
            return method(event, *args, **kw)

        self.__dict__[name] = log
        return log


def steptrail_logger() -> structlog.typing.FilteringBoundLogger:
    """A structlog logger that hands its events to the stdlib logger `steptrail`.

    Events below the stdlib logger's effective level are dropped before any processing
    (before structlog is even imported).
    """
    return cast("structlog.typing.FilteringBoundLogger", _LazyLogger())


def set_level(level: str) -> None:
    """Set the `steptrail` logger's level (`debug` … `critical`)."""
    logging.getLogger(LOGGER_NAME).setLevel(level.upper())


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto", level: str = "info"
) -> None:
    """Send steptrail's log to stderr, as JSON lines or readable lines (what the CLI does;
    embedders configure `logging` their own way instead)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LazyFormatter(use_json=use_json, colors=sys.stderr.isatty()))
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if getattr(h, "_steptrail_cli", False)]:
        logger.removeHandler(old)
    handler._steptrail_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    set_level(level)


class _LazyFormatter(logging.Formatter):
    """structlog's `ProcessorFormatter` rendering JSON or readable lines, built when the
    first record is formatted."""

    def __init__(self, *, use_json: bool, colors: bool) -> None:
        super().__init__()
        self._use_json = use_json
        self._colors = colors
        self._real: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._real is None:
            import structlog

            renderer: structlog.typing.Processor = (
                structlog.processors.JSONRenderer()
                if self._use_json
                else structlog.dev.ConsoleRenderer(colors=self._colors)
            )
            self._real = structlog.stdlib.ProcessorFormatter(
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
                foreign_pre_chain=_pre_chain(),
            )
        return self._real.format(record)
