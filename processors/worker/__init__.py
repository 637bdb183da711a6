"""The worker: its agents and the Faust app that hosts them. The only package that imports Faust.

Find an agent by its file: :mod:`~agentlog.worker.sequencer` (ingest → log),
:mod:`~agentlog.worker.runstate` (host-replay verdicts, the live log check),
:mod:`~agentlog.worker.handoff` (derive-mode joins), :mod:`~agentlog.worker.spans` (OpenTelemetry). They all run
on Kafka transactions, :mod:`~agentlog.worker.txruntime`: the one module of commits and recovery.
The audit sink (every output topic → ClickHouse) is :mod:`agentlog.audit.sink`; the worker only
starts it, for the ``sink`` and ``all`` roles (:func:`agentlog.worker.app.build_app`).
"""

from agentlog.worker.app import build_app, internal_topic_specs, run_worker
from agentlog.worker.wiring import Wiring

__all__ = ["Wiring", "build_app", "internal_topic_specs", "run_worker"]
