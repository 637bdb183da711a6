"""The Faust adapters of the worker's ports, on a built app that is never started (no broker).

What the runtime reads through them (:mod:`agentlog.worker.ports`) must be there on the installed
Faust: an upgrade that renames one breaks here, like ``tests/unit/streams/test_internals.py`` for the
private attributes under them. The in-memory twin is what every other unit test of the worker runs on.
"""

from __future__ import annotations

import asyncio
import inspect

from aiokafka import TopicPartition

from agentlog.streams.settings import load_settings
from agentlog.worker import ports
from agentlog.worker.app import FaustMembership, FaustProducer, FaustRunner, FaustSource, build_app
from agentlog.worker.memory import MemoryMembership, MemoryProducer, MemoryRunner, MemorySource


def _wiring(tmp_path):
    # Port 9 (discard): nothing listens there, and nothing here connects.
    settings = load_settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="unit", home=tmp_path,
                             clickhouse_url=f"chdb://{tmp_path / 'ch'}", replication_factor=1, partitions=2,
                             worker_role="process", agent_runtime="faust")
    return build_app(settings, replay=False)


def test_the_worker_is_wired_with_the_faust_adapters(tmp_path):
    wiring = _wiring(tmp_path)
    assert isinstance(wiring.runner, FaustRunner) and wiring.runner.app is wiring.app
    assert isinstance(wiring.producer, FaustProducer)
    assert isinstance(wiring.source, FaustSource) and isinstance(wiring.membership, FaustMembership)
    # the agents the runtime registered are Faust agents on the topics the runner declared
    agents = {agent.name.rsplit(".", 1)[-1]: agent for agent in wiring.app.agents.values()}
    assert agents["sequencer"].channel is wiring.topics["ingest"]


def test_the_faust_source_and_membership_answer_before_the_consumer_starts(tmp_path):
    wiring = _wiring(tmp_path)
    source, membership = wiring.source, wiring.membership
    tp = TopicPartition(wiring.topics["ingest"].get_topic_name(), 0)
    assert callable(source.assignment)  # Faust's answers once its consumer thread runs
    assert source.committed(tp) is None and source.read_offset(tp) is None
    assert source.fetch_position(tp) is None  # aiokafka's consumer is made when Faust's thread starts
    source.forget_acks(tp)
    assert membership.settling() is False
    assert isinstance(membership.generation, int)


def test_the_faust_producer_hands_out_the_aiokafka_batch_api(tmp_path):
    async def scenario() -> None:
        app = _wiring(tmp_path).app
        app.producer._producer = app.producer._new_producer()  # what Faust does at start (no broker needed)
        batches = FaustProducer(app).batches()
        assert batches.create_batch().append(key=b"k", value=b"v", timestamp=None).offset == 0
        assert callable(batches.send_batch) and callable(batches.partitions_for)

    asyncio.run(scenario())


def _methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def test_both_implementations_have_every_method_of_their_port():
    for port, impls in ((ports.Source, (FaustSource, MemorySource)), (ports.Membership, (FaustMembership,
                        MemoryMembership)), (ports.Producer, (FaustProducer, MemoryProducer)),
                        (ports.Runner, (FaustRunner, MemoryRunner))):
        wanted = _methods(port)
        for impl in impls:
            missing = wanted - _methods(impl) - set(getattr(impl, "__dataclass_fields__", {}))
            assert not missing, f"{impl.__name__} lacks {missing} of {port.__name__}"
