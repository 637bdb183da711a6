"""The topic catalogue: every topic agentlog uses, with the config it must be created with.

One table instead of names scattered through the processors, so ``ensure_topics``
and the tests agree on what exists. Shapes and keys are in ``schemas/CONTRACT.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka.partitioner import murmur2

from agentlog.streams.settings import Settings

# Infinite retention: the committed log is the source of truth a replay re-reads.
_FOREVER = {"retention.ms": "-1", "cleanup.policy": "delete"}
# The ingest topic (with the OTel topics before the sequencer) is the one place a host's content is in plaintext
# (README "Personal data"): kept three days (time for a stopped worker to catch up over a weekend), in hourly
# segments so that retention applies by the hour.
INGEST_RETENTION_MS = 3 * 86_400_000
_INGEST = {"retention.ms": str(INGEST_RETENTION_MS), "segment.ms": "3600000", "cleanup.policy": "delete"}
_DELETE = {"cleanup.policy": "delete"}
_COMPACT = {"cleanup.policy": "compact"}

# short name -> topic config, in CONTRACT.md order.
_TOPICS: dict[str, dict[str, str]] = {
    "ingest": _INGEST,
    "log": _FOREVER,
    "transitions": _DELETE,
    "violations": _DELETE,
    "rejections": _DELETE,
    "snapshots": _COMPACT,
    "verdicts": _DELETE,
    "handoff-links": _DELETE,
    # Signed checkpoints of the committed log, keyed by run: kept as long as the log they vouch for.
    "checkpoints": _FOREVER,
    # Every run's wrapped data key, keyed by run (streams/keyring.py). Compacted, and compacted soon: an erasure
    # writes a marker over a run's key record, and the record holding the key is gone from disk once its segment
    # (rolled every ten seconds) is cleaned, within max.compaction.lag.ms.
    "keyring": {"cleanup.policy": "compact", "segment.ms": "10000", "max.compaction.lag.ms": "10000",
                "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"},
    # Signed erasure receipts (agentlog erase), keyed by receipt id: kept as long as the log.
    "erasures": _FOREVER,
    # OpenTelemetry spans from the OTLP receiver, keyed by trace id (a host's plaintext, before the sequencer).
    "spans": _INGEST,
    # Mapped span events without sequences, keyed by run: the span mapper → the run sequencer (plaintext too).
    "otel-events": _INGEST,
}

SHORT_NAMES: tuple[str, ...] = tuple(_TOPICS)
#: The topics that hold a host's plaintext before the sequencer (kept like ingest; an erase truncates them).
PLAINTEXT_TOPICS: tuple[str, ...] = tuple(short for short, config in _TOPICS.items() if config is _INGEST)


@dataclass(frozen=True)
class TopicSpec:
    """What ``ensure_topics`` creates: full name, partition count, replication, topic configs."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    replication: int = 1
    short: str = ""


def topic_name(settings: Settings, short: str) -> str:
    """Full topic name for a short name from the catalogue (``<prefix>.<short>``)."""
    if short not in _TOPICS:
        raise KeyError(f"unknown topic {short!r}; known: {', '.join(SHORT_NAMES)}")
    return f"{settings.topic_prefix}.{short}"


def durability_config(replication: int) -> dict[str, str]:
    """Topic configs every replicated topic needs, ours and Faust's alike.

    With 3+ replicas, acks=all must mean "on two brokers" so one broker loss loses nothing.
    """
    return {"min.insync.replicas": "2"} if replication >= 3 else {}


def catalogue(settings: Settings) -> list[TopicSpec]:
    """Every agentlog topic for these settings, ready to create."""
    rf = settings.replication_factor
    specs = []
    for short, base in _TOPICS.items():
        config = {**base, **durability_config(rf)}
        specs.append(
            TopicSpec(
                name=topic_name(settings, short),
                partitions=settings.partitions,
                config=config,
                replication=rf,
                short=short,
            )
        )
    return specs


#: The worker's agents, by the topic each reads (:mod:`agentlog.worker.txruntime`).
AGENTS = {"ingest": "sequencer", "handoff-links": "handoff", "spans": "otel-spans", "otel-events": "otel-sequencer"}


def agent_group(settings: Settings, name: str) -> str:
    """The consumer group of the worker's agent ``name``, also its writers' transactional-id prefix.

    Under the worker's own ``<prefix>-worker``, the prefix the secure broker's ACLs give the worker's groups and
    transactional ids (``infra/kafka/secure.py``).
    """
    return f"{settings.topic_prefix}-worker-{name}"


def reading_group(settings: Settings, short: str) -> str:
    """The consumer group whose committed offsets say how far the worker has taken topic ``short`` (one of
    :data:`AGENTS`): its agent's."""
    return agent_group(settings, AGENTS[short])


def partition_for(settings: Settings, run_id: str, topic: str = "log", *, partitions: int | None = None) -> int:
    """The partition Kafka's default partitioner puts ``run_id`` on.

    Same murmur2 as the Java client and aiokafka, so every event of a run — from the
    SDK, ``kcat`` or a Java host — is on this one partition. ``topic`` names the topic
    whose partition count applies; all catalogue topics have ``settings.partitions``.
    ``partitions`` overrides the count (e.g. with the count read from the broker).
    """
    del topic  # every catalogue topic is created with settings.partitions
    n = partitions or settings.partitions
    h: int = murmur2(run_id.encode())
    return (h & 0x7FFFFFFF) % n
