"""Two agents chained in memory: the sequencer's handoff links feed the handoff agent (no broker).

A parent run dispatches children (derive mode: no host-emitted transitions); the sequencer re-keys each
dispatch and each child's outcome by childRunId onto ``handoff-links``; the handoff agent reads what the
sequencer's batch committed there, joins it and writes the derived transitions. Both agents run as the worker
runs them, each on its own transactions (:class:`agentlog.worker.memory.MemoryWorker`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import handoff
from agentlog.worker.memory import MemoryWorker, memory_wiring
from tests.unit.core.runs import child_run_id, child_runs, realistic_run


def _transitions(worker: MemoryWorker) -> list[dict[str, Any]]:
    return [decode_record(v) for v in worker.values("transitions")]


def test_the_handoff_agent_derives_the_transitions_from_the_sequencers_links(tmp_path):
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, handoff_mode="derive")))
    worker.sequencer()
    handoff.install(worker.agents)
    docs = realistic_run("p", "derive") + [doc for run in child_runs("p").values() for doc in run]

    asyncio.run(worker.feed("sequencer", [encode_json(doc) for doc in docs]))
    links = worker.values("handoff-links", 0)
    sequenced = len(worker.values("transitions"))  # the dispatches' own, derived inside the parent run
    assert links and not [t for t in _transitions(worker) if t["phase"].startswith("child.")]

    assert asyncio.run(worker.poll("handoff")) == len(links)  # what the sequencer committed to handoff-links
    derived = _transitions(worker)[sequenced:]
    by_child = {(t["childRunId"], t["phase"]) for t in derived}
    assert (child_run_id("p", "a"), "child.completed") in by_child
    assert (child_run_id("p", "a"), "output.harvested") in by_child
    assert (child_run_id("p", "c"), "child.cancelled") in by_child
    assert all(t["derived"] is True and t["parentRunId"] == "p" for t in derived)
