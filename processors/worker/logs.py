"""The worker's log: text or JSON lines on stderr, without the Kafka client's expected start-up errors.

``agentlog worker --log-format text|json`` (``AGENTLOG_LOG_FORMAT``). Text is coloured (by colorlog,
which Faust's logging uses too) only when stderr is a terminal and ``NO_COLOR`` is unset, so a log
file holds plain lines; JSON is one object per line with ``time``, ``level``, ``logger``, ``message``
and ``pid``, plus ``exc`` (the traceback) and ``stack`` when the record has them.

Faust's Worker (mode) sets up logging itself when it starts. It is handed :func:`logging_config`
(``Worker(logging_config=...)``), so it installs these handlers instead of its own; the worker
also applies the same configuration before Faust starts (:func:`setup_logging`), so the lines
written while topics are created and the store is migrated have the same form.
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import colorlog
from aiokafka import errors as kafka_errors

from agentlog.schemas.errors import ConfigError

__all__ = ["LOG_FORMATS", "CoordinatorLookupFilter", "JsonFormatter", "check_log_format", "logging_config",
           "setup_logging"]

#: ``--log-format`` / ``AGENTLOG_LOG_FORMAT`` values.
LOG_FORMATS = ("text", "json")

TEXT_FORMAT = "[%(asctime)s] [%(process)s] [%(levelname)s] %(name)s: %(log_color)s%(message)s"

#: The logger and message aiokafka writes at ERROR each time a group's coordinator lookup fails
#: (aiokafka/consumer/group_coordinator.py, ``ensure_coordinator_known``), then retries.
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"
COORDINATOR_LOOKUP_FAILED = "Group Coordinator Request failed: %s"
#: The failures a broker answers while it elects or loads a group's coordinator: every new group on a
#: fresh broker meets them for the few seconds ``__consumer_offsets`` takes to come up.
COORDINATOR_STARTING = (kafka_errors.GroupCoordinatorNotAvailableError, kafka_errors.GroupLoadInProgressError,
                        kafka_errors.NotCoordinatorForGroupError)
#: How long coordinator lookups may keep failing before their failures are errors again. On a broker just
#: started (`agentlog infra up`, then the worker) the series lasts a fraction of a second; one with no
#: coordinator for half a minute (a broker down, a group's offsets not loading) has a problem to see.
COORDINATOR_GRACE_S = 30.0
#: What aiokafka logs (INFO) once a lookup succeeds: it ends a series of failures.
COORDINATOR_DISCOVERED = "Discovered coordinator %s for group %s"


def check_log_format(log_format: str) -> str:
    """``log_format``, if it is one of :data:`LOG_FORMATS`.

    Raises:
        ConfigError: ``bad_log_format`` otherwise.
    """
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"AGENTLOG_LOG_FORMAT / --log-format {log_format!r} is not one of {', '.join(LOG_FORMATS)}",
                          code="bad_log_format")
    return log_format


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback stays inside its ``exc`` string)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class CoordinatorLookupFilter(logging.Filter):
    """Demote aiokafka's failed coordinator lookups to INFO while a broker is still starting its coordinator.

    Only the lookups that fail with :data:`COORDINATOR_STARTING` are touched, and only for the first
    :data:`COORDINATOR_GRACE_S` of a series of them (a series ends when aiokafka logs that it discovered the
    coordinator, however far apart its retries are); past that they are logged as aiokafka wrote them, at
    ERROR, every retry. Any other record of the logger passes unchanged. The logger is set to INFO at least
    (:func:`logging_config`) so the discovery reaches the filter; the handler's level still decides what is
    written.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._first: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == COORDINATOR_DISCOVERED:
            self._first = None
            return True
        if record.msg != COORDINATOR_LOOKUP_FAILED or not isinstance(record.args, tuple) or not (
                record.args and isinstance(record.args[0], COORDINATOR_STARTING)):
            return True
        now = self._clock()
        if self._first is None:
            self._first = now
        if now - self._first < COORDINATOR_GRACE_S:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def logging_config(log_format: str, level: str | int) -> dict[str, Any]:
    """A new :func:`logging.config.dictConfig` configuration: root at ``level`` to stderr in ``log_format``.

    A new dict each call: ``dictConfig`` consumes the formatter and filter factories of the one it is given.
    """
    level = level.upper() if isinstance(level, str) else level
    formatter: dict[str, Any] = (
        {"()": JsonFormatter} if check_log_format(log_format) == "json" else
        {"()": colorlog.TTYColoredFormatter, "fmt": TEXT_FORMAT, "stream": sys.stderr})
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"agentlog": formatter},
        "filters": {"coordinator_lookup": {"()": CoordinatorLookupFilter}},
        # The handler's level too: a record a filter demoted has passed its logger's level check already.
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": sys.stderr, "formatter": "agentlog",
                                "level": level}},
        "loggers": {COORDINATOR_LOGGER: {"filters": ["coordinator_lookup"], "level": _at_most_info(level)}},
        "root": {"level": level, "handlers": ["stderr"]},
    }


def _at_most_info(level: str | int) -> int:
    number = level if isinstance(level, int) else logging.getLevelName(level)
    return min(number, logging.INFO) if isinstance(number, int) else logging.INFO


def setup_logging(log_format: str, level: str | int) -> None:
    """Apply :func:`logging_config` now, for what the worker logs before Faust starts."""
    logging.config.dictConfig(logging_config(log_format, level))
