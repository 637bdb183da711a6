"""Create the catalogue's topics on a broker, idempotently.

Run before any producer or processor touches a topic, so partition counts and
retention come from ``agentlog.streams.topics`` and never from broker auto-creation
defaults (auto-created topics get one partition and finite retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, for_code

from agentlog.schemas.errors import InfraError
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import TopicSpec, catalogue

_TOPIC_ALREADY_EXISTS = 36
_INVALID_REPLICATION_FACTOR = 38
_TOPIC_AUTHORIZATION_FAILED = 29
log = logging.getLogger("agentlog.admin")
# How long to wait for a newly created topic's partitions to get leaders; creation is async in KRaft.
_LEADER_WAIT_S = 30.0


def _unreachable(settings: Settings, e: BaseException) -> InfraError:
    return InfraError(
        f"Kafka broker at {settings.kafka_bootstrap} is unreachable ({e}); "
        "start it with `agentlog infra up` or set AGENTLOG_KAFKA_BOOTSTRAP",
        code="kafka_unreachable",
    )


@contextlib.asynccontextmanager
async def _admin(settings: Settings, timeout_ms: int = 30_000) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client (an unreachable broker is ``kafka_unreachable``), closed on exit."""
    admin = AIOKafkaAdminClient(**client_kwargs(settings), request_timeout_ms=timeout_ms)
    try:
        await admin.start()
    except KafkaConnectionError as e:
        raise _unreachable(settings, e) from e
    try:
        yield admin
    finally:
        await admin.close()


async def ensure_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create every missing catalogue topic; return the names this call created.

    Existing topics are left alone (their config is not altered), so calling this
    on every start-up is safe.
    """
    specs = catalogue(settings) if specs is None else specs
    async with _admin(settings) as admin:
        try:
            existing = set(await admin.list_topics())
            missing = [s for s in specs if s.name not in existing]
            if not missing:
                return []
            response = await admin.create_topics(
                [NewTopic(s.name, s.partitions, s.replication, topic_configs=s.config) for s in missing]
            )
            created, denied = [], set()
            for entry in response.topic_errors:
                name, code = entry[0], entry[1]
                if code == 0:
                    created.append(name)
                elif code == _TOPIC_AUTHORIZATION_FAILED:
                    # A secured cluster: a host principal may describe and write only the
                    # ingest topic, so every other topic looks missing to it and it may create none. The
                    # worker or `agentlog infra up --secure` creates them; not this client's business.
                    log.debug("not authorised to create or describe topic %s; left to the worker", name)
                    denied.add(name)
                elif code != _TOPIC_ALREADY_EXISTS:  # lost a race with another creator: fine
                    message = entry[2] if len(entry) > 2 and entry[2] else for_code(code).__name__
                    if code == _INVALID_REPLICATION_FACTOR:
                        raise InfraError(
                            f"could not create topic {name} with replication {_replication(missing, name)}: "
                            f"{message}; are all brokers up?",
                            code="replication_unavailable",
                        )
                    raise InfraError(f"could not create topic {name}: {message} (Kafka error {code})")
            waited = [s.name for s in missing if s.name not in denied]
            if waited:
                await _wait_for_leaders(admin, waited)
            return created
        except KafkaConnectionError as e:
            raise _unreachable(settings, e) from e
        except KafkaError as e:
            raise InfraError(f"Kafka admin request to {settings.kafka_bootstrap} failed: {e}") from e


def _replication(specs: list[TopicSpec], name: str) -> int:
    return next((s.replication for s in specs if s.name == name), 0)


#: Conditions a long-running process may wait out: they end when a broker comes (back) up.
TRANSIENT_CODES = frozenset({"kafka_unreachable", "replication_unavailable"})


async def ensure_topics_patiently(
    settings: Settings, specs: list[TopicSpec] | None = None, *, wait_s: float = 300.0
) -> list[str]:
    """:func:`ensure_topics`, waiting up to ``wait_s`` while the broker is unreachable or too few are up.

    A worker restarted while one broker of a replicated cluster is down cannot create a topic
    it has never had (replication 3 needs 3 live brokers); dying there would need a manual
    restart once the broker is back. It waits instead, saying why on every attempt.
    """
    deadline = time.monotonic() + wait_s
    delay = 1.0
    while True:
        try:
            return await ensure_topics(settings, specs)
        except InfraError as e:
            left = deadline - time.monotonic()
            if e.code not in TRANSIENT_CODES or left <= 0:
                raise
            log.warning("waiting for Kafka (%s); retrying in %.0f s, giving up in %.0f s", e, delay, left)
            await asyncio.sleep(min(delay, max(left, 0.1)))
            delay = min(delay * 2, 10.0)


async def _wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Topic creation returns before partitions have leaders; producers sent too early see errors."""
    deadline = asyncio.get_running_loop().time() + _LEADER_WAIT_S
    while True:
        described = await admin.describe_topics(names)
        ready = all(
            t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        )
        if ready:
            _warn_under_replicated(described)
            return
        if asyncio.get_running_loop().time() > deadline:
            raise InfraError(f"topics {names} were created but have no partition leaders after {_LEADER_WAIT_S}s")
        await asyncio.sleep(0.1)


def _warn_under_replicated(described: list[dict[str, Any]]) -> None:
    """Say so when a new topic's replicas are not all in sync: a broker it was placed on is down.

    Kafka may place a new topic's replicas on a broker that is down but not yet fenced; the topic works,
    with fewer copies than asked for until that broker is back.
    """
    short = sorted({t["topic"] for t in described for p in t["partitions"] if len(p["isr"]) < len(p["replicas"])})
    if short:
        log.warning("created %d topic(s) with replicas out of sync (%s); are all brokers up?", len(short),
                    ", ".join(short[:3]) + (" …" if len(short) > 3 else ""))


async def describe_partitions(admin: AIOKafkaAdminClient, topics: Iterable[str]) -> dict[str, list[int]]:
    """The partitions of each of ``topics`` on the broker now, sorted; a topic it does not have, or does not
    describe to this principal (ACLs), is left out.

    A consumer without a group knows a topic's partitions only once it has fetched that topic's metadata, and
    aiokafka's consumer has no public call that fetches it (``partitions_for_topic`` answers from what it
    holds); the admin client asks the broker about exactly these topics.
    """
    described = await admin.describe_topics(list(topics))
    return {t["topic"]: sorted(p["partition"] for p in t["partitions"])
            for t in described if t["error_code"] == 0 and t["partitions"]}


async def topic_partitions(settings: Settings, topics: Iterable[str]) -> dict[str, list[int]]:
    """:func:`describe_partitions` through an admin client of its own."""
    topics = list(topics)
    async with _admin(settings) as admin:
        try:
            return await describe_partitions(admin, topics)
        except KafkaError as e:
            raise InfraError(f"describing {', '.join(topics)} on {settings.kafka_bootstrap} failed: {e}") from e


def ensure_topics_sync(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """``ensure_topics`` for callers without an event loop (CLI, bench)."""
    return asyncio.run(ensure_topics(settings, specs))


async def list_topic_names(settings: Settings) -> set[str]:
    """Every topic name on the broker (the benches print the count: metadata cost grows with it)."""
    async with _admin(settings) as admin:
        return set(await admin.list_topics())


async def delete_topics(settings: Settings, names: list[str]) -> int:
    """Delete ``names`` (benches remove what they created); returns how many the broker accepted.

    Every all-topics metadata response a client decodes lists every topic on the broker; a bench
    broker that keeps each run's topics grows to ~4,000, and those responses then take a tenth of a
    worker's busy time. Deleting in chunks keeps each request small.
    """
    deleted = 0
    async with _admin(settings, timeout_ms=60_000) as admin:
        for i in range(0, len(names), 100):
            response = await admin.delete_topics(names[i:i + 100], timeout_ms=60_000)
            deleted += sum(1 for entry in response.topic_error_codes if entry[1] == 0)
    return deleted
