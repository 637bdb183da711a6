"""Kafka I/O for agentlog: topic catalogue, wire codec, publisher SDK, reader, admin.

Public names are re-exported here lazily (PEP 562), so ``import streams.settings``
— which every module does — does not pull in aiokafka and the schema models.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # settings
    "Settings": "streams.settings",
    "load_settings": "streams.settings",
    # Kafka client security: the AGENTLOG_KAFKA_CONFIG properties file
    "KafkaSecurity": "streams.security",
    "client_kwargs": "streams.security",
    "load_security": "streams.security",
    # topics and admin
    "TopicSpec": "streams.topics",
    "catalogue": "streams.topics",
    "topic_name": "streams.topics",
    "ensure_topics": "streams.admin",
    "ensure_topics_sync": "streams.admin",
    # wire codec
    "decode_ingest": "streams.codec",
    "encode_json": "streams.codec",
    "encode_avro": "streams.codec",
    "encode_record": "streams.codec",
    "decode_record": "streams.codec",
    # publisher SDK
    "Publisher": "streams.publisher",
    "Run": "streams.publisher",
    "SyncPublisher": "streams.publisher",
    "SyncRun": "streams.publisher",
    "PublishError": "streams.publisher",
    "PublishSummary": "streams.publisher",
    "Reject": "streams.publisher",
    "publish_docs": "streams.publisher",
    "uuid7": "streams.publisher",
    # reader
    "read_topic": "streams.reader",
    "read_run": "streams.reader",
    "RunLog": "streams.reader",
    "partition_for": "streams.reader",
    "offset_for_time": "streams.reader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streams' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
