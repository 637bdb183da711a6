"""A record the broker refuses surfaces at flush/close as PublishError carrying the doc, never silently."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher, PublishError
from agentlog.streams.reader import read_run
from agentlog.streams.settings import Settings
from agentlog.streams.topics import TopicSpec, topic_name

pytestmark = pytest.mark.kafka


def test_broker_refusal_is_reported_at_close_with_the_doc(settings: Settings) -> None:
    small = TopicSpec(topic_name(settings, "ingest"), settings.partitions, {"max.message.bytes": "4096"})

    async def scenario() -> None:
        await ensure_topics(settings, [small])
        pub = Publisher(settings, wire="json", ensure=False, linger_ms=0)
        await pub.start()
        run = pub.run("run-big")
        ok = await run.emit_and_wait("run.started", {"bindings": {}})
        big = await run.emit("output.chunk", {"text": "x" * 20_000})  # valid by contract, too big for this topic
        with pytest.raises(PublishError) as info:
            await pub.close()
        assert [d for d, _ in info.value.failed] == [big]
        assert info.value.code == "publish_failed"
        seen = [item["doc"] for item in await read_run(settings, "run-big", short_name="ingest")]
        assert seen == [ok]

    asyncio.run(scenario())
