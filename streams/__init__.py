"""Kafka I/O for agentlog: topic catalogue, wire codec, publisher SDK, reader, admin.

Public names are re-exported here lazily (PEP 562), so ``import agentlog.streams.settings``
— which every module does — does not pull in aiokafka and the schema models.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # settings
    "Settings": "agentlog.streams.settings",
    "load_settings": "agentlog.streams.settings",
    # Kafka client security: the AGENTLOG_KAFKA_CONFIG properties file
    "KafkaSecurity": "agentlog.streams.security",
    "client_kwargs": "agentlog.streams.security",
    "load_security": "agentlog.streams.security",
    # topics and admin
    "TopicSpec": "agentlog.streams.topics",
    "catalogue": "agentlog.streams.topics",
    "topic_name": "agentlog.streams.topics",
    "ensure_topics": "agentlog.streams.admin",
    "ensure_topics_sync": "agentlog.streams.admin",
    # wire codec
    "decode_ingest": "agentlog.streams.codec",
    "encode_json": "agentlog.streams.codec",
    "encode_avro": "agentlog.streams.codec",
    "encode_record": "agentlog.streams.codec",
    "decode_record": "agentlog.streams.codec",
    # publisher SDK
    "Publisher": "agentlog.streams.publisher",
    "Run": "agentlog.streams.publisher",
    "SyncPublisher": "agentlog.streams.publisher",
    "SyncRun": "agentlog.streams.publisher",
    "PublishError": "agentlog.streams.publisher",
    "PublishSummary": "agentlog.streams.publisher",
    "Reject": "agentlog.streams.publisher",
    "publish_docs": "agentlog.streams.publisher",
    "Decision": "agentlog.streams.publisher",
    "DecisionTimeout": "agentlog.streams.publisher",
    "wait_decisions": "agentlog.streams.publisher",
    "uuid7": "agentlog.streams.publisher",
    # reader
    "read_topic": "agentlog.streams.reader",
    "read_run": "agentlog.streams.reader",
    "RunLog": "agentlog.streams.reader",
    "partition_for": "agentlog.streams.topics",
    "offset_for_time": "agentlog.streams.reader",
    "end_marks": "agentlog.streams.reader",
    "TopicTail": "agentlog.streams.reader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlog.streams' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
