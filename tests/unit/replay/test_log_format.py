"""Re-derivation reads log format 2 only: a record without stateHash stops it with ``log_format_unsupported``.

No broker: :func:`agentlog.replay.rederive._replay` runs on an in-memory twin of the
:class:`agentlog.streams.reader.TopicReader` it is given (the run's log partition and snapshots as
record bytes), and ``agentlog replay`` on the same twin put in the reader's place.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.core.fold import states_by_index
from agentlog.replay import rederive
from agentlog.schemas.errors import LogFormatError
from agentlog.streams.codec import decode_record, encode_record
from agentlog.streams.settings import Settings
from agentlog.streams.topics import partition_for
from tests.unit.core.forgery import rechain
from tests.unit.replay.runs import llm_run

RUN = "r-format"
SETTINGS = Settings(topic_prefix="t")
ADVICE = ("this log was written by an agentlog before 0.2 (log format 1, records without stateHash); re-ingest its "
          "runs with `agentlog publish` from an export made with that version")


class _Reader:
    """The reads a replay makes, from the run's records held in memory (one partition: the run's)."""

    def __init__(self, log: list[dict[str, Any]], snapshots: list[dict[str, Any]] = ()) -> None:
        self.settings = SETTINGS
        self.partition = partition_for(SETTINGS, RUN)
        self.topics = {"log": [encode_record(r) for r in log], "snapshots": [encode_record(s) for s in snapshots]}

    async def read_raw(self, short: str, *, key: str | None = None, from_offsets: dict[int, int] | None = None,
                       **_: Any) -> AsyncIterator[tuple[int, list[tuple[int, bytes, bytes]]]]:
        start = (from_offsets or {}).get(self.partition, 0)
        yield self.partition, [(o, (key or "").encode(), v) for o, v in enumerate(self.topics[short]) if o >= start]

    async def read(self, short: str, **kwargs: Any) -> AsyncIterator[tuple[int, int, str | None, dict[str, Any]]]:
        async for partition, batch in self.read_raw(short, **kwargs):
            for offset, key, value in batch:
                yield partition, offset, key.decode(), decode_record(value)


def _log(format_1_from: int | None = None) -> list[dict[str, Any]]:
    """The run's log as the worker writes it; from ``format_1_from`` on, as an agentlog before 0.2 wrote it."""
    records = rechain(llm_run(RUN))
    for r in records[format_1_from:] if format_1_from is not None else ():
        del r["stateHash"]
    return records


def _snapshot_at(records: list[dict[str, Any]], at: int) -> dict[str, Any]:
    state, s_hash = states_by_index([r["doc"] for r in records])[at]
    return {"runId": RUN, "atSequence": at, "logPartition": 0, "logOffset": at, "state": state, "stateHash": s_hash,
            "headHash": records[at]["hash"]}


async def _replay(reader: _Reader, **start: Any) -> rederive.RederivationResult:
    return await rederive._replay(reader, RUN, from_offset=start.get("from_offset"), from_seq=start.get("from_seq"),
                                  collect_all=start.get("collect_all", False), progress=None)


def test_a_log_that_carries_its_state_hashes_replays_to_match():
    records = _log()
    for start in ({}, {"from_seq": 7}, {"from_offset": 12}):
        result = asyncio.run(_replay(_Reader(records, [_snapshot_at(records, 5)]), **start))
        assert result.verdict == "match", (start, result.first_divergence)
        assert "undigested" not in result.to_json_dict()


@pytest.mark.parametrize("start", [{}, {"from_seq": 7}, {"from_offset": 12}, {"collect_all": True}])
def test_a_format_1_log_stops_the_replay_with_log_format_unsupported(start):
    records = _log(format_1_from=0)
    with pytest.raises(LogFormatError) as e:
        asyncio.run(_replay(_Reader(records, [_snapshot_at(records, 5)]), **start))
    assert e.value.code == "log_format_unsupported"
    assert str(e.value).endswith(ADVICE)
    assert str(e.value).startswith(f"log record run {RUN}, sequence ")


def test_records_without_state_hash_from_the_middle_on_stop_the_replay_where_they_start():
    records = _log(format_1_from=9)
    partition = partition_for(SETTINGS, RUN)
    with pytest.raises(LogFormatError) as e:
        asyncio.run(_replay(_Reader(records)))
    assert str(e.value) == f"log record run {RUN}, sequence 9, log offset 9 in partition {partition}: {ADVICE}"


def test_agentlog_replay_says_log_format_unsupported_and_exits_2(tmp_path, monkeypatch):
    reader = _Reader(_log(format_1_from=0))

    class _TopicReader:
        def __init__(self, settings: Settings, **_: Any) -> None:
            reader.settings = settings

        async def __aenter__(self) -> _Reader:
            return reader

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(rederive, "TopicReader", _TopicReader)
    env = {"AGENTLOG_HOME": str(tmp_path / "home"), "AGENTLOG_TOPIC_PREFIX": "t"}
    human = CliRunner().invoke(app, ["replay", "--run", RUN], env=env)
    assert human.exit_code == 2
    assert human.stderr.startswith(f"error[log_format_unsupported]: log record run {RUN}, sequence 0")
    as_json = CliRunner().invoke(app, ["replay", "--run", RUN, "--json"], env=env)
    assert as_json.exit_code == 2
    body = json.loads(as_json.stdout)
    assert body["verdict"] == "error" and body["error"]["code"] == "log_format_unsupported"
