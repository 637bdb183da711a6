"""Re-derivation over log format 2 (stateHash in the record) and over a log mixing both formats.

Format-1 logs (digests on their own topic) are covered by ``test_rederive.py``'s hand-written
logs; here the recorded state hash travels in the log record itself, as the one-pass worker
writes it, and no digest record exists for those indexes. Expected values come from the pure
fold over the *original* docs (``states_by_index``), never from the code under test.
"""

from __future__ import annotations

import asyncio
import copy
import uuid

import pytest

from processors.core.fold import states_by_index
from processors.replay import replay_run
from tests.integration.replay.helpers import HandLog, chained
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _format2(docs: list[dict], hashed_over: list[dict] | None = None) -> list[dict]:
    """CommittedEvents for ``docs`` carrying the state hash an honest worker folds from ``hashed_over``."""
    records = chained(docs)
    for rec, (_, s_hash) in zip(records, states_by_index(hashed_over or docs), strict=True):
        rec["stateHash"] = s_hash
    return records


def test_format2_log_without_digests_replays_to_match_and_counts_every_index(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)

    async def scenario():
        async with HandLog(settings) as hand:
            await hand.log(_format2(docs))
        whole = await replay_run(settings, run_id, from_seq=0)
        assert whole.verdict == "match", whole.first_divergence
        assert whole.compared == len(docs) and whole.undigested == 0
        part = await replay_run(settings, run_id, from_seq=len(docs) // 2)  # needs the digests before its start
        assert part.verdict == "match", part.first_divergence
        assert part.from_seq == len(docs) // 2

    asyncio.run(scenario())


def test_format2_state_hash_disagreeing_with_the_refold_is_a_state_divergence(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 10

    async def scenario():
        forged = copy.deepcopy(docs)
        forged[k]["payload"]["value"] = 7
        async with HandLog(settings) as hand:
            # A self-consistent chain over the forged docs, but the state hashes an honest worker
            # recorded for the original ones.
            await hand.log(_format2(forged, hashed_over=docs))
        result = await replay_run(settings, run_id, from_seq=0)
        d = result.first_divergence
        assert result.verdict == "diverged"
        assert (d.at_sequence, d.kind, d.path) == (k, "state", "stateHash")

    asyncio.run(scenario())


def test_format2_altered_doc_is_tampered(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 10

    async def scenario():
        records = _format2(docs)
        records[k]["doc"]["payload"]["value"] = 4
        async with HandLog(settings) as hand:
            await hand.log(records)
        result = await replay_run(settings, run_id, from_seq=0)
        d = result.first_divergence
        assert (d.at_sequence, d.kind, d.path) == (k, "tampered", "hash")

    asyncio.run(scenario())


def test_log_upgraded_mid_run_replays_across_both_formats(settings):
    """Format-1 records (digests topic) up to ``cut``, format-2 records after it: one run, one match."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    cut = 12  # after sequence 10, the variable.changed the forgery below alters
    assert len(docs) > cut + 4

    async def scenario():
        records = chained(docs)[:cut] + _format2(docs)[cut:]
        async with HandLog(settings) as hand:
            where = await hand.log(records)
            await hand.recorded(docs[:cut], dict(enumerate(where)))
        whole = await replay_run(settings, run_id, from_seq=0)
        assert whole.verdict == "match", whole.first_divergence
        assert whole.compared == len(docs) and whole.undigested == 0
        late = await replay_run(settings, run_id, from_seq=cut + 2)
        assert late.verdict == "match", late.first_divergence

        # The format-1 half still needs its digests: a changed state there is caught by them.
        other = settings.replace(topic_prefix=settings.topic_prefix + "m")
        forged = copy.deepcopy(docs)
        forged[10]["payload"]["value"] = 7
        async with HandLog(other) as hand:
            where = await hand.log(chained(forged)[:cut] + _format2(forged, hashed_over=docs)[cut:])
            await hand.recorded(docs[:cut], dict(enumerate(where)))
        mixed = await replay_run(other, run_id, from_seq=0)
        assert (mixed.first_divergence.at_sequence, mixed.first_divergence.kind) == (10, "state")

    asyncio.run(scenario())
