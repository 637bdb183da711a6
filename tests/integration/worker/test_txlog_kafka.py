"""The :class:`agentlog.worker.txlog.RecordLog` contract on Kafka transactions (the session broker)."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.streams.admin import ensure_topics
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from agentlog.worker.txlog import KafkaLog, RecordLog
from tests.contract.txlog import LogContract

pytestmark = pytest.mark.kafka


class TestKafkaLog(LogContract):
    @pytest.fixture(autouse=True)
    def _broker(self, settings: Settings) -> None:
        asyncio.run(ensure_topics(settings))
        self.settings = settings

    def make_log(self) -> RecordLog:
        s = self.settings
        return KafkaLog(s, name=f"{s.topic_prefix}-contract", group=f"{s.topic_prefix}-contract")

    def topics(self) -> tuple[str, str, str]:
        s = self.settings
        return topic_name(s, "ingest"), topic_name(s, "log"), topic_name(s, "transitions")
