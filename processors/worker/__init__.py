"""The worker: the Faust app and its agents. The only package that imports Faust.

Find an agent by its file: :mod:`~processors.worker.sequencer` (ingest → log),
:mod:`~processors.worker.runstate` (host-replay verdicts, the live log check),
:mod:`~processors.worker.handoff` (derive-mode joins), :mod:`~processors.worker.sink`
(every output topic → ClickHouse). They all run the loop in :mod:`~processors.worker.batch`;
what the consumer group commits is :mod:`~processors.worker.positions`.
"""

from processors.worker.app import build_app, internal_topic_specs, run_worker
from processors.worker.wiring import Wiring

__all__ = ["Wiring", "build_app", "internal_topic_specs", "run_worker"]
