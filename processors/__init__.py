"""agentlog's processors, one package per job.

* :mod:`agentlog.core` — the pure logic every path shares: fold, handoff machine,
  sequencing decision, run-state step, state hash, result cache. No Kafka,
  ClickHouse or Faust import (a test enforces it).
* :mod:`agentlog.replay` — the comparison engine, re-derivation from an offset,
  mock sessions and host-replay verdicts.
* :mod:`agentlog.worker` — the Faust app and its agents (sequencer, runstate,
  handoff), the one batch loop, commit positions, HTTP endpoints; it starts the audit
  sink. The only package that imports Faust.
* :mod:`agentlog.audit` — the ClickHouse store, the audit sink that fills it exactly
  once, migrations, row mapping, named queries, the query server and the HTML report.
* :mod:`agentlog.demo` — the guided tour; :mod:`agentlog.cli` — the ``agentlog`` command.
* :mod:`agentlog.metrics` — the process-wide metric registry (used by the worker and by replay).
* :mod:`agentlog.capabilities` — the capability document, computed by exercising the code.

Dependencies point one way: cli → demo → worker → audit, replay → core → ``streams`` → ``schemas``.
"""
