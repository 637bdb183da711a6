"""agentlog: an event-sourced store for multi-agent LLM runs.

The public Python API is the names in ``__all__``, imported from here (``from agentlog import Publisher,
load_settings``), and the framework adapters, one public module per framework since each has its own
``ReplayModel``: :mod:`agentlog.replay.frameworks.pydantic_ai`, :mod:`agentlog.replay.frameworks.openai_agents`
and :mod:`agentlog.replay.frameworks.langchain`. Every other module is internal and may change between
releases. Each name is imported from its module on first use (PEP 562), so ``import agentlog`` loads
neither Kafka, ClickHouse nor Faust, and a program that only publishes never loads the worker.

The package is also the code's top folder (``processors/``), one package per job:

* :mod:`agentlog.core` — the pure logic every path shares: fold, handoff machine,
  sequencing decision, run-state step, state hash, result cache. No Kafka,
  ClickHouse or Faust import (a test enforces it).
* :mod:`agentlog.replay` — the comparison engine, re-derivation from an offset,
  mock sessions, host-replay verdicts and replay tests.
* :mod:`agentlog.worker` — the agents (sequencer, runstate, handoff, OpenTelemetry) on
  Kafka transactions, the Faust app that hosts them, HTTP endpoints; it starts the audit
  sink. The only package that imports Faust.
* :mod:`agentlog.audit` — the ClickHouse store, the audit sink that fills it exactly
  once, migrations, row mapping, named queries, the query server and the HTML report.
* :mod:`agentlog.demo` — the guided tour; :mod:`agentlog.cli` — the ``agentlog`` command.
* :mod:`agentlog.metrics` — the process-wide metric registry (used by the worker and by replay).
* :mod:`agentlog.capabilities` — the capability document, computed by exercising the code.

Dependencies point one way: cli → demo → worker → audit, replay → core → ``streams`` → ``schemas``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlog.audit.queries import AuditQueries
    from agentlog.audit.store import open_store
    from agentlog.core.result_cache import ReplayCacheMiss
    from agentlog.replay.compare import ComparisonResult, compare_runs
    from agentlog.replay.divergence import Divergence
    from agentlog.replay.mock import MockReplaySession, open_mock_session
    from agentlog.replay.recorder import Recorder
    from agentlog.replay.regression import Program, ReplayTestFailed, ReplayTestResult, record, replay_test
    from agentlog.replay.served import ServedResults
    from agentlog.schemas.cachekey import cache_key
    from agentlog.schemas.errors import (
        AgentlogError,
        CacheKeyError,
        ConfigError,
        ContractError,
        EventRejected,
        InfraError,
        LogFormatError,
        ReplayError,
        StoreError,
        StoreLockedError,
    )
    from agentlog.schemas.events import RUN_EVENT_TYPES, RunEventDoc
    from agentlog.schemas.validate import validate_doc
    from agentlog.streams.publisher import (
        Decision,
        DecisionTimeout,
        Publisher,
        PublishError,
        PublishSummary,
        Reject,
        Run,
        SyncPublisher,
        SyncRun,
        publish_docs,
    )
    from agentlog.streams.reader import read_run
    from agentlog.streams.replay_client import start_replay
    from agentlog.streams.settings import Settings, load_settings

__all__ = [
    # publishing a run's events, and the sequencer's decision on each
    "Decision",
    "DecisionTimeout",
    "PublishError",
    "PublishSummary",
    "Publisher",
    "Reject",
    "Run",
    "SyncPublisher",
    "SyncRun",
    "publish_docs",
    # settings (AGENTLOG_* environment)
    "Settings",
    "load_settings",
    # the event contract
    "RUN_EVENT_TYPES",
    "RunEventDoc",
    "cache_key",
    "validate_doc",
    # errors: every one an AgentlogError with a stable code
    "AgentlogError",
    "CacheKeyError",
    "ConfigError",
    "ContractError",
    "EventRejected",
    "InfraError",
    "LogFormatError",
    "ReplayError",
    "StoreError",
    "StoreLockedError",
    # reading runs back: the committed log, the audit store
    "AuditQueries",
    "open_store",
    "read_run",
    # replay tests: record a run, replay a program against it (a file or a run id), the verdict as data
    "ComparisonResult",
    "Divergence",
    "Program",
    "Recorder",
    "ReplayTestFailed",
    "ReplayTestResult",
    "ServedResults",
    "compare_runs",
    "record",
    "replay_test",
    # replay by hand, from any framework: a replay run and the recorded results (mock mode)
    "MockReplaySession",
    "ReplayCacheMiss",
    "open_mock_session",
    "start_replay",
]

#: The module each public name lives in, imported when the name is first read.
_MODULE_OF = {
    **dict.fromkeys(["Decision", "DecisionTimeout", "PublishError", "PublishSummary", "Publisher", "Reject", "Run",
                     "SyncPublisher", "SyncRun", "publish_docs"], "agentlog.streams.publisher"),
    **dict.fromkeys(["Settings", "load_settings"], "agentlog.streams.settings"),
    **dict.fromkeys(["RUN_EVENT_TYPES", "RunEventDoc"], "agentlog.schemas.events"),
    "cache_key": "agentlog.schemas.cachekey",
    "validate_doc": "agentlog.schemas.validate",
    **dict.fromkeys(["AgentlogError", "CacheKeyError", "ConfigError", "ContractError", "EventRejected", "InfraError",
                     "LogFormatError", "ReplayError", "StoreError", "StoreLockedError"], "agentlog.schemas.errors"),
    "AuditQueries": "agentlog.audit.queries",
    "open_store": "agentlog.audit.store",
    "read_run": "agentlog.streams.reader",
    **dict.fromkeys(["ComparisonResult", "compare_runs"], "agentlog.replay.compare"),
    "Divergence": "agentlog.replay.divergence",
    "Recorder": "agentlog.replay.recorder",
    **dict.fromkeys(["Program", "ReplayTestFailed", "ReplayTestResult", "record", "replay_test"],
                    "agentlog.replay.regression"),
    "ServedResults": "agentlog.replay.served",
    **dict.fromkeys(["MockReplaySession", "open_mock_session"], "agentlog.replay.mock"),
    "ReplayCacheMiss": "agentlog.core.result_cache",
    "start_replay": "agentlog.streams.replay_client",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("agentlog")
    elif name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    else:
        raise AttributeError(f"module 'agentlog' has no attribute {name!r}")
    globals()[name] = value  # read once: the next access is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
