"""The worker's log set-up: JSON lines, plain text off a terminal, aiokafka's start-up lookups kept out of errors."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import errors as kafka_errors

from agentlog.schemas.errors import ConfigError
from agentlog.worker import logs

REPO = Path(__file__).resolve().parents[3]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def coordinator_log() -> Iterator[tuple[logging.Logger, list[logging.LogRecord], _Clock]]:
    """aiokafka's coordinator logger with the filter on a fake clock, its records collected at WARNING and above."""
    logger = logging.getLogger(logs.COORDINATOR_LOGGER)
    clock = _Clock()
    lookups = logs.CoordinatorLookupFilter(clock)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addFilter(lookups)
    logger.addHandler(handler)
    try:
        yield logger, records, clock
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(lookups)
        logger.setLevel(logging.NOTSET)


def _lookup_failed(logger: logging.Logger, error: Exception) -> None:
    logger.error(logs.COORDINATOR_LOOKUP_FAILED, error)  # as aiokafka's ensure_coordinator_known writes it


def test_coordinator_lookups_failing_while_the_broker_starts_are_not_errors(coordinator_log):
    logger, records, clock = coordinator_log
    for error in (kafka_errors.GroupCoordinatorNotAvailableError(), kafka_errors.GroupLoadInProgressError(),
                  kafka_errors.NotCoordinatorForGroupError()):
        _lookup_failed(logger, error)
        clock.now += 0.1
    assert records == []


def test_coordinator_lookups_failing_past_the_grace_are_errors_again(coordinator_log):
    logger, records, clock = coordinator_log
    retries = 0
    while clock.now - 1000.0 < logs.COORDINATOR_GRACE_S:  # one retry a second, the coordinator never found
        _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
        clock.now += 1.0
        retries += 1
    assert records == [] and retries == int(logs.COORDINATOR_GRACE_S)
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("ERROR", "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError")] * 2


def _discovered(logger: logging.Logger) -> None:
    logger.info(logs.COORDINATOR_DISCOVERED, 1, "g")  # as aiokafka's ensure_coordinator_known writes it


def test_a_new_series_of_failed_lookups_has_its_own_grace(coordinator_log):
    logger, records, clock = coordinator_log
    logger.setLevel(logging.INFO)
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    _discovered(logger)
    clock.now += 3600  # the coordinator moves an hour later
    _lookup_failed(logger, kafka_errors.NotCoordinatorForGroupError())
    assert records == []


def test_failed_lookups_far_apart_are_errors_once_the_grace_is_over(coordinator_log):
    """With a broker down a lookup can take many seconds (aiokafka refreshes metadata between tries)."""
    logger, records, clock = coordinator_log
    logger.setLevel(logging.INFO)
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    clock.now += logs.COORDINATOR_GRACE_S / 2
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    clock.now += logs.COORDINATOR_GRACE_S / 2
    _lookup_failed(logger, kafka_errors.GroupCoordinatorNotAvailableError())
    assert [r.levelname for r in records] == ["ERROR"]


def test_the_configured_coordinator_logger_passes_the_discovery_to_the_filter():
    config = logs.logging_config("text", "warning")
    assert config["loggers"][logs.COORDINATOR_LOGGER]["level"] == logging.INFO
    assert config["handlers"]["stderr"]["level"] == "WARNING"
    assert logs.logging_config("text", "debug")["loggers"][logs.COORDINATOR_LOGGER]["level"] == logging.DEBUG


def test_other_failures_of_the_coordinator_logger_stay_errors(coordinator_log):
    logger, records, _ = coordinator_log
    _lookup_failed(logger, kafka_errors.KafkaConnectionError("broker gone"))
    logger.error("Heartbeat failed: %r", kafka_errors.GroupCoordinatorNotAvailableError())
    assert [r.levelname for r in records] == ["ERROR", "ERROR"]


def test_json_lines_carry_time_level_logger_message_and_the_exception():
    formatter = logs.JsonFormatter()
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.getLogger("agentlog.test").makeRecord(
            "agentlog.test", logging.ERROR, __file__, 1, "batch %d failed", (7,), sys.exc_info())
    line = formatter.format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "ERROR" and parsed["logger"] == "agentlog.test"
    assert parsed["message"] == "batch 7 failed" and parsed["pid"] == os.getpid()
    assert parsed["time"].endswith("+00:00") and parsed["time"][:4].isdigit()
    assert parsed["exc"].startswith("Traceback") and parsed["exc"].endswith("ValueError: bad\nvalue")
    plain = json.loads(formatter.format(logging.makeLogRecord({"msg": "ok", "levelname": "INFO", "name": "x"})))
    assert "exc" not in plain and "stack" not in plain


def test_text_off_a_terminal_is_plain(monkeypatch):
    stream = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    root, coordinator = logging.getLogger(), logging.getLogger(logs.COORDINATOR_LOGGER)
    saved = root.handlers[:], root.level, coordinator.filters[:]
    try:
        logs.setup_logging("text", "info")
        logging.getLogger("agentlog.test").error("stopped")
    finally:
        root.handlers[:], root.level, coordinator.filters[:] = saved
    assert stream.getvalue().endswith("[ERROR] agentlog.test: stopped\n") and "\x1b" not in stream.getvalue()


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ConfigError) as e:
        logs.logging_config("xml", "warning")
    assert e.value.code == "bad_log_format"


def test_the_worker_refuses_an_unknown_log_format_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    done = subprocess.run([sys.executable, "-m", "agentlog", "worker", "--log-format", "xml"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "error[bad_log_format]: AGENTLOG_LOG_FORMAT / --log-format 'xml' is not one of text, json\n"
