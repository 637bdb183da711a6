"""What the consumer group commits: the minimum of the durable positions of the agents reading a topic.

No broker: ``DurablePositions`` is plain bookkeeping over the consumer's view (here
:class:`agentlog.worker.memory.MemorySource`), and ``build_app`` only wires a Faust app (it
connects when started, which these tests never do).
"""

from __future__ import annotations

from agentlog.streams.settings import load_settings
from agentlog.worker.app import build_app
from agentlog.worker.memory import MemorySource
from agentlog.worker.memory import TopicPartition as _TP
from agentlog.worker.positions import DurablePositions


def _consumer(assigned, committed=None):
    """The consumer holding ``assigned``, with Faust's ack bookkeeping for each of them."""
    return MemorySource(assigned=set(assigned), committed_offsets=dict(committed or {}),
                        acks={tp: [1, 2, 3] for tp in assigned})


def test_the_slowest_agent_on_a_topic_bounds_the_commit():
    pos = DurablePositions()
    pos.consumes("log", "runs")
    pos.consumes("log", "sink-positions")
    pos.advance("runs", "log", 0, 900, generation=3)
    assert pos.committable("log", 0, 3) is None  # the sink has made nothing durable yet
    pos.advance("sink-positions", "log", 0, 400, generation=3)
    assert pos.committable("log", 0, 3) == 400
    pos.advance("sink-positions", "log", 0, 950, generation=3)
    assert pos.committable("log", 0, 3) == 900
    assert pos.committable("log", 1, 3) is None  # another partition is independent
    assert pos.committable("ingest", 0, 3) is None  # nobody declared reading it


def test_positions_only_move_forward_within_a_generation_and_expire_with_it():
    pos = DurablePositions()
    pos.consumes("ingest", "heads")
    pos.advance("heads", "ingest", 1, 50, generation=7)
    pos.advance("heads", "ingest", 1, 20, generation=7)  # a late, older batch: ignored
    assert pos.committable("ingest", 1, 7) == 50
    # After a rebalance the partition may have been handled further elsewhere: old positions do not count.
    assert pos.committable("ingest", 1, 8) is None
    pos.advance("heads", "ingest", 1, 30, generation=8)
    assert pos.committable("ingest", 1, 8) == 30


def test_offsets_to_commit_never_move_the_committed_offset_back():
    pos = DurablePositions()
    pos.consumes("log", "runs")
    a, b, c = _TP("log", 0), _TP("log", 1), _TP("ingest", 0)
    pos.advance("runs", "log", 0, 100, generation=1)
    pos.advance("runs", "log", 1, 40, generation=1)
    consumer = _consumer([a, b, c], committed={a: 60, b: 55})
    assert pos.offsets_to_commit(consumer, 1) == {a: 100}  # b's durable 40 is behind its committed 55
    assert a not in consumer.acks  # Faust's ack lists are not kept
    assert consumer.acks[c] == [1, 2, 3]  # untouched where we have nothing to say
    consumer.committed_offsets[a] = 100
    assert pos.offsets_to_commit(consumer, 1) == {}


def test_the_worker_app_commits_through_the_positions(tmp_path):
    # Port 9 (discard): nothing listens there, and nothing here connects anyway.
    settings = load_settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="unit", home=tmp_path,
                             clickhouse_url=f"chdb://{tmp_path / 'ch'}", replication_factor=1, partitions=2,
                             worker_role="process", agent_runtime="faust")
    wiring = build_app(settings, replay=False)
    consumer = wiring.app.consumer
    assert consumer._filter_committable_offsets.__name__ == "_filter_committable_offsets"
    assert getattr(consumer._filter_committable_offsets, "__self__", None) is None  # ours, not Faust's method
    topics = {wiring.topics[s].get_topic_name() for s in ("ingest", "log", "handoff-links")}
    # One pass: without the sink no Faust agent reads the log (the chain check is a plain consumer).
    consumed = {wiring.topics[s].get_topic_name() for s in ("ingest", "handoff-links")}
    assert {t for t in topics if wiring.positions._tables_by_topic.get(t)} == consumed


def test_positions_are_exported_as_a_gauge():
    from agentlog.metrics import Metrics

    pos = DurablePositions()
    pos.consumes("t.log", "runs")
    pos.advance("runs", "t.log", 1, 1234, generation=2)
    metrics = Metrics()
    metrics.add_collector(pos.series)
    text = metrics.render()
    assert "# TYPE agentlog_durable_position gauge" in text
    assert 'agentlog_durable_position{partition="1",table="runs",topic="t.log"} 1234' in text


def test_a_position_outlives_rebalances_the_worker_held_the_partition_through():
    """A batch made durable just before a rebalance, then no more records on the partition."""
    pos = DurablePositions()
    pos.consumes("links", "links")
    a, b = _TP("links", 7), _TP("links", 3)
    pos.offsets_to_commit(_consumer([a, b]), 4)  # seen holding both in generation 4
    pos.advance("links", "links", 7, 23, generation=4)
    pos.advance("links", "links", 3, 10, generation=4)
    # generation 5: still holds 7, lost 3 (someone else may have handled 3 meanwhile)
    assert pos.offsets_to_commit(_consumer([a]), 5) == {a: 23}
    # generation 6: 3 comes back, but 5 went by without it: its old position does not count
    assert pos.offsets_to_commit(_consumer([a, b]), 6) == {a: 23}
    assert pos.committable("links", 3, 6) is None
    # a generation this worker was never seen in breaks the chain too
    assert pos.committable("links", 7, 8) is None
