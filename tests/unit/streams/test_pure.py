"""Pure logic of the streams package: ids, timestamps, topic catalogue, partitioner, codec. No broker."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from aiokafka.partitioner import DefaultPartitioner

from agentlog.schemas.errors import EventRejected
from agentlog.streams.codec import decode_ingest, decode_record, encode_json, encode_record
from agentlog.streams.publisher import _UUIDv7, rfc3339_ms, uuid7, uuid7_time_ms
from agentlog.streams.settings import Settings
from agentlog.streams.topics import catalogue, partition_for, topic_name

DOC = {
    "eventId": "e-1",
    "runId": "r-1",
    "type": "variable.changed",
    "payload": {"name": "x", "value": [1, 2.5, "é", None]},
    "timestamp": "2025-01-02T03:04:05.678Z",
    "sequence": 0,
}


class TestUUIDv7:
    def test_version_and_variant_bits(self) -> None:
        u = uuid.UUID(uuid7())
        assert u.version == 7
        assert u.variant == uuid.RFC_4122

    # Fresh generators: the process-wide one is monotonic, so a test minting "future" ids would skew it.

    def test_embeds_the_given_millisecond(self) -> None:
        assert uuid7_time_ms(_UUIDv7()(1_700_000_000_123)) == 1_700_000_000_123

    def test_ids_minted_in_one_millisecond_sort_in_mint_order(self) -> None:
        mint = _UUIDv7()
        ids = [mint(1_800_000_000_000) for _ in range(5000)]  # > 4096: crosses a counter overflow
        assert len(set(ids)) == len(ids)
        assert ids == sorted(ids)
        assert uuid7_time_ms(ids[0]) == 1_800_000_000_000

    def test_later_milliseconds_sort_later(self) -> None:
        mint = _UUIDv7()
        assert mint(1_900_000_000_000) < mint(1_900_000_000_001)

    def test_clock_stepping_back_keeps_order(self) -> None:
        mint = _UUIDv7()
        a = mint(2_000_000_000_500)
        assert mint(2_000_000_000_000) > a


def test_rfc3339_ms_is_utc_with_millis_and_z() -> None:
    ms = 1_700_000_000_007
    text = rfc3339_ms(ms)
    assert text.endswith("Z") and len(text) == len("2023-11-14T22:13:20.007Z")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and parsed.utcoffset().total_seconds() == 0
    assert int(parsed.timestamp() * 1000) == ms


class TestCatalogue:
    def test_every_contract_topic_once_with_prefix(self) -> None:
        names = [t.name for t in catalogue(Settings(topic_prefix="p"))]
        expected = ["ingest", "log", "transitions", "violations", "rejections", "snapshots",
                    "verdicts", "handoff-links", "checkpoints", "keyring", "erasures", "spans", "otel-events"]
        assert names == [f"p.{n}" for n in expected]

    def test_retention_and_compaction(self) -> None:
        specs = {t.short: t for t in catalogue(Settings(partitions=6))}
        assert specs["ingest"].config["retention.ms"] == str(3 * 86_400_000)  # the one plaintext buffer: short
        assert specs["keyring"].config["cleanup.policy"] == "compact"
        assert specs["erasures"].config["retention.ms"] == "-1"
        assert specs["log"].config["retention.ms"] == "-1"
        assert specs["checkpoints"].config["retention.ms"] == "-1"  # as long as the log they vouch for
        assert specs["snapshots"].config["cleanup.policy"] == "compact"
        assert all(t.partitions == 6 for t in specs.values())

    def test_min_insync_only_with_three_replicas(self) -> None:
        assert all("min.insync.replicas" not in t.config for t in catalogue(Settings(replication_factor=1)))
        three = catalogue(Settings(replication_factor=3))
        assert all(t.config["min.insync.replicas"] == "2" and t.replication == 3 for t in three)

    def test_unknown_short_name(self) -> None:
        with pytest.raises(KeyError):
            topic_name(Settings(), "nope")


class TestPartitioner:
    # Kafka's own murmur2 test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
    JAVA_VECTORS = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }

    @pytest.mark.parametrize("key,signed", JAVA_VECTORS.items())
    def test_same_partition_as_java_default_partitioner(self, key: str, signed: int) -> None:
        # Java: Utils.toPositive(murmur2(key)) % numPartitions
        for n in (1, 3, 4, 7, 12):
            assert partition_for(Settings(partitions=n), key) == (signed & 0x7FFFFFFF) % n

    def test_agrees_with_aiokafka_producer(self) -> None:
        parts = list(range(5))
        for i in range(200):
            run_id = f"run-{i}"
            assert partition_for(Settings(partitions=5), run_id) == DefaultPartitioner()(run_id.encode(), parts, parts)


class TestCodec:
    def test_json_with_leading_whitespace(self) -> None:
        assert decode_ingest(b" \n\t" + encode_json(DOC)) == DOC

    def test_encode_json_is_jcs(self) -> None:
        assert encode_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'

    def test_record_roundtrip(self) -> None:
        rec = {"doc": DOC, "prevHash": "0" * 64, "hash": "f" * 64}
        assert decode_record(encode_record(rec)) == rec

    @pytest.mark.parametrize(
        "value,code",
        [
            (b"", "decode_error"),
            (b"[1,2]", "decode_error"),
            (b"hello", "decode_error"),
            (b'{"a":1', "decode_error"),
            (b'{"a":1,"a":2}', "decode_error"),
            (b'{"a":NaN}', "non_finite_number"),
            (b"\x01\x00\x00\x00\x01", "bad_magic"),
            (b"\xff\xfe", "bad_magic"),
        ],
    )
    def test_rejections(self, value: bytes, code: str) -> None:
        with pytest.raises(EventRejected) as info:
            decode_ingest(value)
        assert info.value.code == code


# --- encode_committed: the log record composed around the doc's chain-hash bytes ---------------------


def test_encode_committed_equals_the_reference_encoding_of_the_whole_record():
    import rfc8785

    from agentlog.core.sequencing import Accepted, Source, decide
    from agentlog.schemas.records import committed_event
    from agentlog.streams.codec import encode_committed
    from tests.unit.replay.runs import llm_run

    hard = {"eventId": "e-hard", "runId": "r-hard", "type": "variable.changed", "sequence": 0,
            "timestamp": "2025-01-15T10:00:00.000Z",
            "payload": {"name": "x", "value": [1e21, 5e-324, -0.0, 0.1, 2**53 - 1, "\u2028\x1f\"\\", {"\U0001f600": 1,
                                                                                                      "\ue000": 2}]}}
    head, checked = None, 0
    for doc in [*llm_run("r-enc"), hard]:
        d = decide(None if doc is hard else head, lambda _e: [0, "", 0, 0] if doc.get("causationId") == _e else None,  # noqa: B023 - called at once
                   doc, Source("agentlog.ingest", 3, 77, 1700000000000))
        assert isinstance(d, Accepted)
        head = d.head if doc is not hard else head
        c = d.committed
        state_hash = "ab" * 32
        reference = rfc8785.dumps(committed_event(doc=doc, prev_hash=c["prevHash"], hash=c["hash"],
                                                  source=c["source"], state_hash=state_hash))
        assert encode_committed(d.doc_bytes, c["prevHash"], c["hash"], c["source"], state_hash) == reference
        checked += 1
    assert checked > 20


def test_encode_committed_refuses_what_would_need_escaping():
    import pytest

    from agentlog.streams.codec import encode_committed

    with pytest.raises(ValueError):
        encode_committed(b"{}", "0" * 64, 'x"' * 32, {"topic": "t"}, "0" * 64)
    with pytest.raises(ValueError):
        encode_committed(b"{}", "0" * 64, "0" * 64, {"topic": "t"}, 'x"' * 32)


def test_a_record_source_is_written_as_the_reference_writes_it():
    """``source`` is composed directly in the common shape; any other shape goes through jcs."""
    import rfc8785
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agentlog.streams.codec import _source_bytes

    ints = st.integers(-(2**53) - 5, 2**53 + 5) | st.sampled_from([0, 1, 2**53 - 1, -1])
    sources = st.fixed_dictionaries(
        {"topic": st.text(max_size=6) | st.sampled_from(["agentlog.ingest", "\u2028\"\\\x1f", "\U0001f600\ue000"]),
         "partition": ints, "offset": ints, "timestampMs": ints | st.booleans()},
        optional={"extra": st.just(1)})

    @settings(max_examples=300, deadline=None)
    @given(sources)
    def check(source):
        try:
            reference = rfc8785.dumps(source)
        except rfc8785.CanonicalizationError:
            with pytest.raises(Exception):  # noqa: B017 - the general jcs raises the contract's error
                _source_bytes(source)
            return
        assert _source_bytes(source) == reference

    check()
