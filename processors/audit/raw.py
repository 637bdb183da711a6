"""The sink's fast path for the log: ClickHouse maps raw CommittedEvent records to ``events`` rows.

The log's records are JCS bytes (:func:`agentlog.streams.codec.encode_committed`):
``{"doc":<JCS of doc>,"hash":"…","prevHash":"…","source":{…},"stateHash":"…"}``, keys in that
order. So the exact ``doc`` text is a substring of the record, and ClickHouse can *prove* that
substring is the text the sequencer hashed: ``hash = lower(hex(SHA256(prevHash || doc)))``
(:func:`agentlog.schemas.canonical.chain_hash`). A batch's raw bytes go to ClickHouse in one insert
(:data:`LAND_DDL`, format ``LineAsString``); one ``INSERT … SELECT`` stages every ``events``
column extracted in C++ (:data:`STAGE_SELECT`) together with ``ok``: the row is proven to be what
:func:`agentlog.audit.rows.committed_rows` would have produced. Python touches no record.

The record is split by ONE regular expression (:data:`RECORD_RE`) written for the exact shape
our writer produces: JCS key order, the doc's known members around ``payload`` (strings with no
escapes, integers without leading zeros), 64-hex hashes (``stateHash`` among them: a record without
one is log format 1, which the Python path refuses), the four ``source`` members. JSON parsing
per column cost more than the rest of the sink together (measured); one RE2 pass does not. A row is
``ok`` when, besides the match,

* the record is valid UTF-8 and the doc text hashes to ``hash`` (so ``doc`` is byte for byte the
  text the chain hash was computed from; JCS is compositional, so ``payload`` — the text between
  the doc's ``"payload":`` and its final ``,"runId":"`` members, which the anchored pattern puts
  at the top level — is the payload's JCS, and it must be one valid JSON value);
* the timestamp is plain RFC 3339 UTC (``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``, years 1970–2261) that
  formats back to itself, so Python's ``fromisoformat`` and ClickHouse read the same instant
  (no ``:60``, no 30 February), truncated to milliseconds by both.

Every other record (a foreign writer's non-JCS text, a wrong hash, an escaped id, a numeric
timestamp, …) is neither lost nor stored differently: the sink sends exactly those through the
Python path (:func:`agentlog.audit.sink.split_batch`), which stores or rejects them the general way.

What the proof does not cover: a writer that hashes non-JCS doc text itself (a forged chain hash)
has that text stored as written, where the Python path would store the JCS of the parsed doc; the
live log check (``hash_chain_broken``) reports such a record either way.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["EVENT_COLUMNS", "HASHES_RE", "HEAD_RE", "RECORD_RE", "SOURCE_RE", "TAIL_RE", "counts_sql", "insert_sql",
           "land_ddl", "missing_sql", "runs_sql", "spans_sql", "stage_ddl", "stage_sql", "tops_sql",
           "unproven_sql"]

#: ``events`` columns the fast path writes (the table's MATERIALIZED analyst columns follow from them).
EVENT_COLUMNS = (
    "run_id", "sequence", "event_id", "causation_id", "type", "node_id", "event_time",
    "ingested_at", "source_topic", "kafka_partition", "kafka_offset", "hash", "prev_hash",
    "payload", "doc", "state_hash",
)

_S = r'[^"\\\x00-\x1f]*'  # a JSON string's text that needs no escape (so it is its own value)
_N = r"(?:0|[1-9][0-9]{0,17})"  # a non-negative integer, no leading zero, within Int64
_H = r"[0-9a-f]{64}"
_TS = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?Z"

#: A CommittedEvent exactly as our sequencer writes it (JCS), as anchored pieces cut around the
#: payload, each matched without capture groups (RE2 runs them as DFAs): the doc up to its first
#: ``"payload":`` (:data:`HEAD_RE`), the doc from its last ``,"runId":"`` (:data:`TAIL_RE`), and
#: from the record's last ``,"hash":"`` the two hashes (:data:`HASHES_RE`, a fixed 151 characters)
#: and the rest (:data:`SOURCE_RE`). No string in them holds a quote, so those cuts are the
#: top-level members, and the pieces all match exactly when :data:`RECORD_RE` (their concatenation,
#: the payload as ``.*``) does. One pattern over the whole record cost more than the rest of the
#: staging together (0.28 of 0.49 CPU-s per 200k records, measured; the hash runs next to the
#: source's members cost 0.12 in one pattern, 0.05 in two); the pieces never scan the payload.
HEAD_RE = (
    r'^\{'
    rf'(?:"causationId":"{_S}",)?(?:"engineVersion":"{_S}",)?"eventId":"{_S}",(?:"nodeId":"{_S}",)?'
    r'"payload":$'
)
TAIL_RE = rf'^,"runId":"{_S}",(?:"schemaVersion":{_N},)?"sequence":{_N},"timestamp":"{_TS}","type":"{_S}"\}}$'
HASHES_RE = rf'^,"hash":"{_H}","prevHash":"{_H}$'
SOURCE_RE = (
    rf'^","source":\{{"offset":-?{_N},"partition":-?(?:0|[1-9][0-9]{{0,8}}),"timestampMs":(?:{_N}|null),'
    rf'"topic":"{_S}"\}},"stateHash":"{_H}"\}}$'
)
#: The whole shape, for reading (and the tests): ``{"doc":`` HEAD payload TAIL HASHES SOURCE.
RECORD_RE = r'^\{"doc":' + HEAD_RE[1:-1] + ".*" + TAIL_RE[1:-1] + HASHES_RE[1:-1] + SOURCE_RE[1:]


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"table name {name!r} is not a plain identifier")
    return name


def land_ddl(land: str) -> str:
    """Where a batch's raw records land, one per line (Memory: emptied before every batch)."""
    return f"CREATE TABLE IF NOT EXISTS {_ident(land)} (raw String) ENGINE = Memory"


def stage_ddl(stage: str) -> str:
    """The staged batch: every ``events`` column, ``ok`` and the raw record (Memory)."""
    return f"""CREATE TABLE IF NOT EXISTS {_ident(stage)}
(
    raw String, ok Bool,
    run_id String, sequence UInt64, event_id String, causation_id String, type String, node_id String,
    event_time DateTime64(3, 'UTC'), ingested_at DateTime64(3, 'UTC'), source_topic String,
    kafka_partition Int32, kafka_offset Int64, hash String, prev_hash String, payload String, doc String,
    state_hash String
)
ENGINE = Memory"""


def _last(haystack: str, needle: str) -> str:
    """1-based start of the LAST ``needle`` in ``haystack`` (ClickHouse searches the reversed text)."""
    return (f"(toInt64(length({haystack})) - toInt64(position(reverse({haystack}), {_sql_string(needle[::-1])}))"
            f" - {len(needle) - 2})")


def stage_sql(land: str, stage: str) -> str:
    """Match every landed record against the pieces of :data:`RECORD_RE`, cut out its columns and
    prove it (module docstring). A record that is not proven keeps its raw bytes for the Python path;
    a proven one needs them no more."""
    return f"""INSERT INTO {_ident(stage)}
SELECT if(ok, '', raw), ok, simpleJSONExtractString(tail, 'runId'), simpleJSONExtractUInt(tail, 'sequence'),
       simpleJSONExtractString(head, 'eventId'), simpleJSONExtractString(head, 'causationId'),
       simpleJSONExtractString(tail, 'type'), simpleJSONExtractString(head, 'nodeId'), et,
       fromUnixTimestamp64Milli(simpleJSONExtractInt(src, 'timestampMs'), 'UTC'),
       simpleJSONExtractString(src, 'topic'), simpleJSONExtractInt(src, 'partition'),
       simpleJSONExtractInt(src, 'offset'), hash, prev_hash, if(payload = 'null', '', payload), doc,
       simpleJSONExtractString(src, 'stateHash')
FROM (
    SELECT raw, doc, hash, prev_hash, src, head, tail, payload,
           parseDateTime64BestEffortOrZero(ts, 3, 'UTC') AS et,
           shaped AND isValidUTF8(raw)
           AND lower(hex(SHA256(concat(prev_hash, doc)))) = hash
           AND isValidJSON(payload)
           AND toYear(et) BETWEEN 1970 AND 2261
           AND formatDateTime(et, '%Y-%m-%dT%H:%i:%S', 'UTC') = substring(ts, 1, 19) AS ok
    FROM (
        SELECT raw, doc, src, head, tail,
               startsWith(raw, '{{"doc":') AND run_at > payload_at + 9
               AND match(head, {_sql_string(HEAD_RE)}) AND match(tail, {_sql_string(TAIL_RE)})
               AND match(hashes, {_sql_string(HASHES_RE)}) AND match(src, {_sql_string(SOURCE_RE)}) AS shaped,
               substring(raw, hash_at + 9, 64) AS hash, substring(raw, hash_at + 87, 64) AS prev_hash,
               substring(doc, payload_at + 10, run_at - payload_at - 10) AS payload,
               simpleJSONExtractString(tail, 'timestamp') AS ts
        FROM (
            SELECT raw, doc, substring(raw, hash_at, 151) AS hashes, substring(raw, hash_at + 151) AS src, hash_at,
                   position(doc, '"payload":') AS payload_at, {_last("doc", ',"runId":"')} AS run_at,
                   substring(doc, 1, payload_at + 9) AS head, substring(doc, run_at) AS tail
            FROM (
                SELECT raw, {_last("raw", ',"hash":"')} AS hash_at, substring(raw, 8, hash_at - 8) AS doc
                FROM {_ident(land)}
            )
        )
    )
)"""


def _stored(stage: str) -> str:
    """The stored keys of the staged batch: an IN on the sort key, so it reads the batch's granules only.

    GLOBAL: on a cluster ``events`` is Distributed and the stage exists on this node only, so the
    set is built here and shipped to the shards (on one node it is the same plain IN).
    """
    return (f"SELECT run_id, sequence FROM events WHERE (run_id, sequence) GLOBAL IN "
            f"(SELECT run_id, sequence FROM {stage} WHERE ok)")


def insert_sql(stage: str, *, filtered: bool = True, settings: Mapping[str, int | str] | None = None) -> str:
    """Proven rows of the stage whose natural key is not stored yet, once per key, into ``events``.

    ``filtered=False`` leaves out the lookup of stored keys (a third of the statement's cost): only
    for a batch whose keys are known to be absent (:class:`agentlog.audit.exactly_once.SequenceTops`).
    A repeat within the batch is still dropped.

    ``settings`` (the insert's deduplication token: :func:`agentlog.audit.store.dedup_settings`) are
    written into the statement's own ``SETTINGS`` clause. Passed as per-call settings, they would make
    clickhouse-connect's chdb backend read ``system.settings`` and set and restore each one around
    the statement: about 7 ms of CPU per log batch.
    """
    cols = ", ".join(EVENT_COLUMNS)
    stored = f" AND (run_id, sequence) NOT IN ({_stored(stage)})" if filtered else ""
    clause = ("" if not settings else " SETTINGS " + ", ".join(
        f"{name} = {value if isinstance(value, int) else _sql_string(value)}" for name, value in settings.items()))
    return (f"INSERT INTO events ({cols}) SELECT {cols} FROM {_ident(stage)} "
            f"WHERE ok{stored} LIMIT 1 BY run_id, sequence{clause}")


def counts_sql(stage: str) -> str:
    """(proven rows, staged rows): what an ordinary batch needs before its insert."""
    return f"SELECT countIf(ok), count() FROM {_ident(stage)}"


def spans_sql(stage: str) -> str:
    """Per run of the staged batch: (run, lowest and highest proven sequence, proven rows, staged rows).

    A run with no proven row has ``0`` proven rows (its span is meaningless); the sums over all runs
    are :func:`counts_sql`'s counts.
    """
    return (f"SELECT run_id, minIf(sequence, ok), maxIf(sequence, ok), countIf(ok), count() "
            f"FROM {_ident(stage)} GROUP BY run_id")


def tops_sql() -> str:
    """The highest stored ``sequence`` of each run in ``{runs:Array(String)}`` (runs with none are absent)."""
    return "SELECT run_id, max(sequence) FROM events WHERE run_id IN {runs:Array(String)} GROUP BY run_id"


def missing_sql(stage: str) -> str:
    """(proven rows still missing from ``events``, proven rows, staged rows)."""
    return (f"SELECT countIf(ok AND (run_id, sequence) NOT IN ({_stored(stage)})), countIf(ok), count() "
            f"FROM {_ident(stage)}")


def unproven_sql(stage: str) -> str:
    """The raw bytes (base64, so exact) of the staged records ClickHouse could not prove."""
    return f"SELECT base64Encode(raw) FROM {_ident(stage)} WHERE NOT ok"


def runs_sql(stage: str) -> str:
    """The runs of the proven rows (the rollup repair of a re-formed range needs them)."""
    return f"SELECT DISTINCT run_id FROM {_ident(stage)} WHERE ok"
