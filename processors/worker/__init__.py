"""The worker: the Faust app and its agents. The only package that imports Faust.

Find an agent by its file: :mod:`~processors.worker.sequencer` (ingest → log),
:mod:`~processors.worker.runstate` (host-replay verdicts, the live log check),
:mod:`~processors.worker.handoff` (derive-mode joins). They all run the loop in
:mod:`~processors.worker.batch`; what the consumer group commits is :mod:`~processors.worker.positions`.
The audit sink (every output topic → ClickHouse) is :mod:`processors.audit.sink`; the worker only
starts it, for the ``sink`` and ``all`` roles (:func:`processors.worker.app.build_app`).
"""

from processors.worker.app import build_app, internal_topic_specs, run_worker
from processors.worker.wiring import Wiring

__all__ = ["Wiring", "build_app", "internal_topic_specs", "run_worker"]
