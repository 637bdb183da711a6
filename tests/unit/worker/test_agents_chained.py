"""Two agents chained on the in-memory ports: the sequencer's handoff links feed the handoff agent (no broker).

A parent run dispatches children (derive mode: no host-emitted transitions); the sequencer re-keys each
dispatch and each child's outcome by childRunId onto ``handoff-links``; the handoff agent reads them
from the in-memory broker, joins them and writes the derived transitions. Both agents run as the worker
runs them (:func:`agentlog.worker.batch.batched_agent`, :meth:`Batch.commit`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import handoff, sequencer
from agentlog.worker.batch import FaustAgents, position_key
from agentlog.worker.memory import MemoryStream, event, memory_wiring, parts
from agentlog.worker.wiring import Wiring
from tests.unit.core.runs import child_run_id, child_runs, realistic_run


async def _run(wiring: Wiring, name: str, topic: str, values: list[bytes | None]) -> None:
    """Run agent ``name`` on ``values`` (offsets 0.. of ``topic[0]``) until its position is past them."""
    table, agent = {"sequencer": "runs", "handoff": "links"}[name], parts(wiring).runner.agents[name][1]
    stream = MemoryStream([event(topic, 0, offset, value) for offset, value in enumerate(values)])
    running = asyncio.ensure_future(agent(stream))
    while not running.done() and (wiring.tables[table].get(0, position_key(topic, 0)) or 0) < len(values):
        await asyncio.sleep(0.002)
    stream.close()
    await running


def _transitions(broker: Any, topic: str) -> list[dict[str, Any]]:
    return [decode_record(v) for v in broker.values(topic)]


def test_the_handoff_agent_derives_the_transitions_from_the_sequencers_links(tmp_path):
    wiring = memory_wiring(Settings(home=tmp_path, handoff_mode="derive"),
                           tables=("index", "runs", "closed", "links"))
    sequencer.install(wiring, replay=False)
    handoff.install(wiring, FaustAgents(wiring))
    broker = parts(wiring).broker
    name = {short: wiring.topics[short].get_topic_name() for short in ("ingest", "handoff-links", "transitions")}
    docs = realistic_run("p", "derive") + [doc for run in child_runs("p").values() for doc in run]

    asyncio.run(_run(wiring, "sequencer", name["ingest"], [encode_json(doc) for doc in docs]))
    links = broker.values(name["handoff-links"], 0)
    sequenced = len(broker.values(name["transitions"]))  # the dispatches' own, derived inside the parent run
    assert links and not [t for t in _transitions(broker, name["transitions"]) if t["phase"].startswith("child.")]

    asyncio.run(_run(wiring, "handoff", name["handoff-links"], links))
    derived = _transitions(broker, name["transitions"])[sequenced:]
    by_child = {(t["childRunId"], t["phase"]) for t in derived}
    assert (child_run_id("p", "a"), "child.completed") in by_child
    assert (child_run_id("p", "a"), "output.harvested") in by_child
    assert (child_run_id("p", "c"), "child.cancelled") in by_child
    assert all(t["derived"] is True and t["parentRunId"] == "p" for t in derived)
