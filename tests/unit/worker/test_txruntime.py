"""The sequencer on its transactional runtime, in memory: :class:`agentlog.worker.txlog.MemoryLog` for Kafka.

The sequencer's own work (:func:`agentlog.worker.sequencer.build`) runs batch by batch through
:meth:`TxAgent.handle_batch` as the worker's loop hands it fetched records; its tables are RocksDB databases
under ``tmp_path`` restored from the memory log's changelogs. Expected state hashes come from the reference fold
(``states_by_index``), never from the runtime.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentlog.core.fold import states_by_index
from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import sequencer, txruntime
from agentlog.worker.memory import MemoryMessage, TopicPartition, memory_wiring
from agentlog.worker.owned import Owned
from agentlog.worker.txlog import MemoryLog
from agentlog.worker.txstate import plain_opener
from agentlog.worker.wiring import Wiring
from tests.unit.replay.runs import llm_run

INGEST = "agentlog.ingest"
TP = TopicPartition(INGEST, 0)


def _runtime(tmp_path: Path, records: MemoryLog, wiring: Wiring | None = None) -> txruntime.TxAgent:
    wiring = wiring or memory_wiring(Settings(home=tmp_path))
    owned = Owned()
    agent = sequencer.build(wiring, owned, replay=False)
    tables = txruntime.sequencer_tables(wiring.settings, lambda path, ttl: plain_opener(path))
    wiring.tables.update(tables)
    return txruntime.TxAgent(wiring, agent, records, tables, owned, short="ingest", group="agentlog-sequencer")


def _messages(docs: list[dict[str, Any]], first: int = 0) -> list[MemoryMessage]:
    return [MemoryMessage(first + i, 1_000 + i, encode_json(doc), doc["runId"].encode()) for i, doc in enumerate(docs)]


async def _feed(runtime: txruntime.TxAgent, docs: list[dict[str, Any]], first: int = 0) -> None:
    await runtime.assigned([TP])
    await runtime.handle_batch(TP, _messages(docs, first))


def _log(records: MemoryLog) -> list[dict[str, Any]]:
    return [decode_record(r.value) for r in asyncio.run(records.read({("agentlog.log", 0): 0}))[("agentlog.log", 0)]]


def test_a_batch_commits_its_log_records_with_their_state_hashes_and_its_position(tmp_path):
    records = MemoryLog()
    runtime = _runtime(tmp_path, records)
    docs = llm_run("tx-fold")
    asyncio.run(_feed(runtime, docs))
    logged = _log(records)
    assert [r["stateHash"] for r in logged] == [h for _, h in states_by_index([r["doc"] for r in logged])]
    assert [runtime._wiring.keyring.open(r["doc"]) for r in logged] == docs
    assert asyncio.run(records.position(INGEST, 0)) == len(docs)
    keys = asyncio.run(records.read({("agentlog.keyring", 0): 0}))[("agentlog.keyring", 0)]
    assert [k.key for k in keys] == [b"tx-fold"]


def test_a_restart_restores_the_runs_from_the_changelog_and_goes_on_where_it_left(tmp_path):
    records = MemoryLog()
    docs = llm_run("tx-restart")
    first = _runtime(tmp_path / "a", records)
    asyncio.run(_feed(first, docs[:5]))
    # A new worker on a new disk, the same keyring (what it reads from the keyring topic).
    second = _runtime(tmp_path / "b", records, memory_wiring(Settings(home=tmp_path)))
    second._wiring.keyring = first._wiring.keyring
    asyncio.run(_feed(second, docs[5:], first=5))
    logged = _log(records)
    assert [r["doc"]["sequence"] for r in logged] == [d["sequence"] for d in docs]  # no gap, no repeat
    assert [r["stateHash"] for r in logged] == [h for _, h in states_by_index([r["doc"] for r in logged])]
    assert not asyncio.run(records.read({("agentlog.rejections", 0): 0}))[("agentlog.rejections", 0)]


def test_a_fenced_batch_leaves_nothing_and_its_records_are_handled_by_the_new_writer(tmp_path):
    records = MemoryLog()
    docs = llm_run("tx-fence")
    zombie = _runtime(tmp_path / "a", records)
    asyncio.run(_feed(zombie, docs[:3]))
    successor = _runtime(tmp_path / "b", records, memory_wiring(Settings(home=tmp_path)))
    successor._wiring.keyring = zombie._wiring.keyring
    asyncio.run(successor.assigned([TP]))  # opens the partition's writer: the zombie is fenced

    async def zombie_goes_on() -> None:
        await zombie.handle_batch(TP, _messages(docs[3:6], 3))

    asyncio.run(zombie_goes_on())  # fenced: nothing of its batch is committed, and it drops the partition
    assert [r["doc"]["sequence"] for r in _log(records)] == [0, 1, 2]
    assert asyncio.run(records.position(INGEST, 0)) == 3

    asyncio.run(successor.handle_batch(TP, _messages(docs[3:6], 3)))  # the new owner, from the committed position
    assert [r["doc"]["sequence"] for r in _log(records)] == [0, 1, 2, 3, 4, 5]
    assert asyncio.run(records.position(INGEST, 0)) == 6


def test_the_worker_runs_the_sequencer_on_transactions_and_no_faust_agent_reads_ingest(tmp_path):
    from agentlog.streams.settings import load_settings
    from agentlog.worker.app import build_app
    from agentlog.worker.txstate import StateTable

    # Port 9 (discard): nothing listens there, and nothing here connects.
    settings = load_settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="unit", home=tmp_path,
                             clickhouse_url=f"chdb://{tmp_path / 'ch'}", replication_factor=1, partitions=2,
                             worker_role="process")
    wiring = build_app(settings, replay=False)
    ingest = wiring.topics["ingest"]
    assert not [a for a in wiring.app.agents.values() if a.channel is ingest]
    assert {name: type(wiring.tables[name]) for name in ("index", "runs", "closed")} == dict.fromkeys(
        ("index", "runs", "closed"), StateTable)
    assert wiring.tables["runs"].changelog == "unit-worker-run-state-changelog"  # the Faust table's changelog


def test_every_agent_runs_on_transactions_and_faust_reads_no_topic(tmp_path):
    from agentlog.streams.settings import load_settings
    from agentlog.worker.app import build_app
    from agentlog.worker.spans import HELD, SEQ
    from agentlog.worker.txstate import StateTable

    settings = load_settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="unit", home=tmp_path,
                             clickhouse_url=f"chdb://{tmp_path / 'ch'}", replication_factor=1, partitions=2,
                             worker_role="process", otlp_port=0)
    wiring = build_app(settings, replay=False)
    assert set(wiring.tx_agents) == {"sequencer", "handoff", "otel-spans", "otel-sequencer"}
    assert not wiring.app.agents and wiring.app.producer_only  # Faust starts no consumer and joins no group
    assert type(wiring.tables["links"]) is StateTable
    assert {name: type(wiring.tables[name]) for name in (HELD, SEQ)} == dict.fromkeys((HELD, SEQ), StateTable)
    assert wiring.tables[HELD].changelog == f"unit-worker-{HELD}-changelog"



def test_batches_run_side_by_side_and_a_rebalance_step_runs_alone_after_them():
    from agentlog.worker.txruntime import _Gate

    gate, order = _Gate(), []

    async def batch(name: str, hold: asyncio.Event) -> None:
        async with gate.batch():
            order.append(f"{name} starts")
            await hold.wait()
            order.append(f"{name} ends")

    async def step() -> None:
        async with gate.alone():
            order.append("rebalance")
            await asyncio.sleep(0)

    async def scenario() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        a = asyncio.ensure_future(batch("a", first))
        b = asyncio.ensure_future(batch("b", second))
        await asyncio.sleep(0.01)
        assert order == ["a starts", "b starts"]  # side by side
        rebalance = asyncio.ensure_future(step())
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(batch("c", asyncio.Event()))  # asks to start while the step waits
        first.set()
        await asyncio.sleep(0.01)
        assert "rebalance" not in order  # b is still in progress
        second.set()
        await asyncio.gather(a, b, rebalance)
        await asyncio.sleep(0.01)
        assert order == ["a starts", "b starts", "a ends", "b ends", "rebalance", "c starts"]
        late.cancel()

    asyncio.run(scenario())
