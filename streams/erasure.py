"""``agentlog erase``: delete a subject's (or a run's) data keys everywhere, and prove it with a signed receipt.

Content past the sequencer is sealed under per-run data keys (SPEC §12), so erasing is deleting keys:

1. the keyring is read and the runs the erasure reaches are found (a subject's runs by its tag, every descendant
   through the parent links, and the ``rejections/<run>`` entries that seal their rejected bytes);
2. an erased marker is written over each run's key record (the worker stops using the key at once, and takes no
   more events of the run: ``run_erased``);
3. the ingest topic, the one plaintext buffer, is truncated up to what the worker has committed (``deleteRecords``
   on every partition, with the OTel topics before the sequencer);
4. the keyring is compacted: the erase writes to each partition concerned until its segment rolls, and reads the
   partition back until no record of an erased run holds a key any more;
5. a receipt signed with the worker's checkpoint key goes to the ``erasures`` topic.

Every step is idempotent, so an erase interrupted anywhere (a SIGKILL of the CLI or of the worker) is repeated
with the same command; the receipt's id is a digest of what was erased, so it is written once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import ClusterAuthorizationFailedError, KafkaError, TopicAuthorizationFailedError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentlog.core.erasure import receipt_id, sign_receipt
from agentlog.core.keyring import KeyRecord, runs_to_erase
from agentlog.core.sequencing import REJECTIONS_PREFIX
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import AgentlogError, InfraError
from agentlog.streams.keyring import Keyring, load_keyring, scan_keyring
from agentlog.streams.reader import read_topic
from agentlog.streams.security import client_kwargs, load_security
from agentlog.streams.settings import Settings
from agentlog.streams.topics import PLAINTEXT_TOPICS, reading_group, topic_name

__all__ = ["EraseResult", "erase", "keys_left", "read_receipts", "shred_keys"]

#: The key of the records an erase writes to roll a keyring segment (a tombstone: compaction drops it too).
ROLL_KEY = b"~erase-roll"
#: How long an erase waits for the keyring's compaction before it says what is left (it can be run again).
COMPACTION_WAIT_S = 120.0

Progress = Callable[[str], None]


@dataclass
class EraseResult:
    """What an erase did (``--json`` prints it)."""

    receipt_id: str
    runs: list[str]
    erased_now: list[str]
    events: dict[str, int]
    truncated: dict[str, int] = field(default_factory=dict)  # "topic[partition]" -> records below now deleted
    already: bool = False  # every run was erased before and its receipt written: nothing changed
    receipt: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"receiptId": self.receipt_id, "runs": self.runs, "erasedNow": self.erased_now, "events": self.events,
                "truncated": self.truncated, "alreadyErased": self.already, "seconds": round(self.seconds, 3)}


def _producer(settings: Settings, client_id: str = "agentlog-erase") -> AIOKafkaProducer:
    return AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True, client_id=client_id)


async def read_receipts(settings: Settings) -> list[dict[str, Any]]:
    """Every erasure receipt on the ``erasures`` topic (a missing topic: none)."""
    try:
        return [value async for _, _, _, value in read_topic(settings, "erasures")]
    except InfraError as e:
        if "does not exist" in str(e):
            return []
        raise


async def _count_events(settings: Settings, runs: Iterable[str]) -> dict[str, int]:
    """Each run's committed events (distinct sequences in its log partition)."""
    wanted = set(runs)
    seen: dict[str, set[int]] = {r: set() for r in wanted}
    async for _, _, key, value in read_topic(settings, "log"):
        run = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if run in wanted and isinstance(value.get("doc"), dict):
            seen[run].add(value["doc"].get("sequence"))
    return {r: len(s) for r, s in seen.items()}


async def _truncate(settings: Settings, admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Delete what the worker has committed from the plaintext topics; ``topic[partition]`` -> new start offset."""
    todo: dict[TopicPartition, RecordsToDelete] = {}
    by_group: dict[str, set[str]] = {}
    for short in PLAINTEXT_TOPICS:
        by_group.setdefault(reading_group(settings, short), set()).add(topic_name(settings, short))
    for group, names in by_group.items():
        committed = await admin.list_consumer_group_offsets(group)
        todo.update({tp: RecordsToDelete(meta.offset) for tp, meta in committed.items()
                     if tp.topic in names and meta.offset > 0})
    if not todo:
        return {}
    done = await admin.delete_records(todo, timeout_ms=30_000)
    return {f"{tp.topic}[{tp.partition}]": low for tp, low in done.items()}


async def keys_left(settings: Settings, runs: set[str]) -> dict[int, int]:
    """Per keyring partition, how many records the broker still holds that carry a key of one of ``runs``."""
    left: dict[int, int] = {}

    def take(m: Any) -> None:
        if m.key is not None and m.key.decode("utf-8", "replace") in runs and m.value \
                and not KeyRecord.from_value(m.value).erased:
            left[m.partition] = left.get(m.partition, 0) + 1

    await scan_keyring(settings, runs, take)
    return left


async def _compact(settings: Settings, producer: AIOKafkaProducer, runs: set[str], progress: Progress,
                   wait_s: float) -> None:
    """Wait until the keyring holds no key of ``runs`` (rolling segments so that the cleaner can take them)."""
    topic = topic_name(settings, "keyring")
    deadline = time.monotonic() + wait_s
    said = -1
    while left := await keys_left(settings, runs):
        total = sum(left.values())
        if total != said:
            progress(f"waiting for the keyring's compaction: {total} key record(s) of erased runs still on the "
                     f"broker (partitions {sorted(left)})")
            said = total
        if time.monotonic() > deadline:
            raise InfraError(f"after {wait_s:.0f} s the keyring still holds {total} key record(s) of erased runs "
                             f"(partitions {sorted(left)}): is {topic} compacted (cleanup.policy=compact, "
                             "segment.ms, max.compaction.lag.ms as `agentlog infra up` creates it)? The keys "
                             "cannot be used any more; run the same erase again to finish", code="erase_incomplete")
        for p in left:  # a record after segment.ms rolls the segment, which the cleaner may then compact
            await producer.send_and_wait(topic, key=ROLL_KEY, value=None, partition=p)
        await asyncio.sleep(1.0)


async def erase(settings: Settings, *, subject: str | None = None, run: str | None = None, by: str,
                signer: Ed25519PrivateKey, signer_kid: str, progress: Progress = lambda _: None,
                wait_s: float = COMPACTION_WAIT_S, now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                ) -> EraseResult:
    """Erase ``subject``'s runs or ``run`` and its descendants (see the module docstring).

    Raises:
        AgentlogError: ``unknown_subject`` / ``unknown_run`` when the keyring knows none (nothing changed).
        InfraError: Kafka is unreachable, or the keyring did not compact in time (``erase_incomplete``).
    """
    started = time.monotonic()
    keyring = await load_keyring(settings)
    tag = keyring.current.tag(subject) if subject is not None else None
    runs = runs_to_erase(keyring.records(), subject=keyring.tags(subject) if subject is not None else None,
                         run=run)
    if not runs:
        what = "subject" if subject is not None else "run"
        raise AgentlogError(f"no run of {what} {subject if subject is not None else run!r} is in the keyring: "
                            "nothing was erased", code=f"unknown_{what}")
    rid = receipt_id(subject_tag=tag, run=run, runs=runs)
    records: Mapping[str, KeyRecord] = {r: rec for r in runs if (rec := keyring.record(r)) is not None}
    pending = [r for r in runs if not records[r].erased]
    receipts = {r.get("receiptId"): r for r in await read_receipts(settings)}
    if not pending and rid in receipts:
        return EraseResult(rid, runs, [], {}, already=True, receipt=receipts[rid],
                           seconds=time.monotonic() - started)
    progress(f"erasing {len(runs)} run(s): {len(pending)} key(s) to delete")
    producer = _producer(settings)
    admin = AIOKafkaAdminClient(**client_kwargs(settings), request_timeout_ms=30_000)
    try:
        await producer.start()
        await admin.start()
        at = now_ms()
        # Truncating is the admin principal's alone (infra/kafka/secure.py): done first, a principal that may not
        # erase is refused before anything changed. Done again once the markers stop the worker taking the runs.
        await _truncate(settings, admin)
        keyring_topic = topic_name(settings, "keyring")
        sent = [await producer.send(keyring_topic, key=r.encode(), value=records[r].erase(at).to_value())
                for r in pending]
        for fut in sent:
            await fut
        truncated = await _truncate(settings, admin)
        progress(f"ingest truncated to the worker's committed offsets ({len(truncated)} partition(s))")
        await _compact(settings, producer, set(runs), progress, wait_s)
        events = await _count_events(settings, [r for r in runs if not r.startswith(REJECTIONS_PREFIX)])
        receipt = receipts.get(rid)
        if receipt is None:
            receipt = sign_receipt(signer, kid=signer_kid, subject_tag=tag, run=run,
                                   key_ids={r: records[r].key_id for r in runs}, events=events, by=by, at_ms=at)
            await producer.send_and_wait(topic_name(settings, "erasures"), key=rid.encode(), value=jcs(receipt))
    except (TopicAuthorizationFailedError, ClusterAuthorizationFailedError) as e:
        security = load_security(settings)
        who = f" to {security.sasl_username!r} ({security.source})" if security and security.sasl_username else ""
        raise AgentlogError(f"the broker's ACLs refused the erase{who}: only the admin principal may erase; run it "
                            "with the admin's properties file (AGENTLOG_KAFKA_CONFIG)", code="not_authorized") from e
    except KafkaError as e:
        raise InfraError(f"erasing on {settings.kafka_bootstrap} failed: {e}; run the same erase again") from e
    finally:
        await producer.stop()
        await admin.close()
    return EraseResult(rid, runs, pending, events, truncated, receipt=receipt, seconds=time.monotonic() - started)


async def shred_keys(settings: Settings, keyring: Keyring, ready: asyncio.Event, runs: Collection[str],
                     now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> list[str]:
    """Write an erased marker over the key record of each of ``runs`` and of their descendants; returns the runs
    whose key this deleted.

    Retention's half of an erasure (:mod:`agentlog.audit.retention`): the keys go, so the log, the snapshots and the
    changelogs keep only ciphertext no key opens, and the sequencer refuses later events of the runs (``run_erased``).
    No receipt (retention is the deployment's rule, not a request) and no truncation of the plaintext topics (the
    worker's principal may not; they keep their own three days). ``keyring`` is the worker's, followed live: this
    waits until it holds what the topic held at start (``ready``), and puts the markers in it at once.
    """
    await ready.wait()
    pending = [r for r in runs_to_erase(keyring.records(), run=runs)
               if (rec := keyring.record(r)) is not None and not rec.erased]
    if not pending:
        return []
    at = now_ms()
    markers = {r: rec.erase(at) for r in pending if (rec := keyring.record(r)) is not None}
    producer = _producer(settings, "agentlog-retention")
    await producer.start()
    try:
        topic = topic_name(settings, "keyring")
        sent = [await producer.send(topic, key=r.encode(), value=m.to_value()) for r, m in markers.items()]
        for fut in sent:
            await fut
    finally:
        await producer.stop()
    for marker in markers.values():
        keyring.put(marker)
    return pending
