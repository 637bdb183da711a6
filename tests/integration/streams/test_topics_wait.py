"""Topic creation that needs more brokers than answer: a clear code, and waited out by long-running processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentlog.schemas.errors import InfraError
from agentlog.streams.admin import ensure_topics, ensure_topics_patiently
from agentlog.streams.topics import TopicSpec

pytestmark = [pytest.mark.kafka]


def test_replication_beyond_the_live_brokers_is_replication_unavailable(settings):
    spec = TopicSpec(f"{settings.topic_prefix}.needs-three", 1, {}, 3)  # the test broker is a single node
    with pytest.raises(InfraError) as caught:
        asyncio.run(ensure_topics(settings, [spec]))
    assert caught.value.code == "replication_unavailable"
    assert "replication 3" in str(caught.value) and "are all brokers up" in str(caught.value)


def test_patient_creation_retries_then_gives_up_with_the_same_error(settings, caplog):
    spec = TopicSpec(f"{settings.topic_prefix}.needs-three", 1, {}, 3)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="agentlog.admin"), pytest.raises(InfraError) as caught:
        asyncio.run(ensure_topics_patiently(settings, [spec], wait_s=2.5))
    assert caught.value.code == "replication_unavailable"
    assert time.monotonic() - started >= 2.5  # it did wait out its budget (a lower bound, not a threshold)
    waits = [r for r in caplog.records if "waiting for Kafka" in r.getMessage()]
    assert len(waits) >= 2


def test_patient_creation_does_not_wait_for_other_errors(settings, caplog):
    bad = TopicSpec(f"{settings.topic_prefix}.bad", 1, {"cleanup.policy": "no-such-policy"}, 1)
    with caplog.at_level("WARNING", logger="agentlog.admin"), pytest.raises(InfraError) as caught:
        asyncio.run(ensure_topics_patiently(settings, [bad], wait_s=60))
    assert caught.value.code not in {"replication_unavailable", "kafka_unreachable"}
    assert not [r for r in caplog.records if "waiting for Kafka" in r.getMessage()]
