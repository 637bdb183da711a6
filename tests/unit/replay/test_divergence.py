"""One Divergence for both replay jobs: each engine builds it, and each keeps the JSON it always emitted.

The expected JSON below is written out by hand from how the inputs were made, not captured from a run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from agentlog.core.fold import states_by_index
from agentlog.replay import ComparisonResult, Divergence, DivergenceKind, RederivationResult, compare_runs
from agentlog.replay.exported import read_jsonl

# The walk over the committed log is re-derivation without its Kafka reads (unit tests have no
# broker; tests/integration/replay/test_rederive.py runs the whole of replay_run on one).
from agentlog.replay.rederive import _Walk
from agentlog.schemas.canonical import GENESIS, chain_hash
from tests.unit.replay.runs import llm_run

GOLDEN = Path(__file__).with_name("golden")


def test_the_comparison_engine_builds_a_divergence_with_the_comparison_json() -> None:
    # diverged pair (make_golden.py): the search tool returns 2 hits instead of 3 at sequence 9.
    result = compare_runs(read_jsonl(GOLDEN / "diverged.original.jsonl"), read_jsonl(GOLDEN / "diverged.replay.jsonl"))
    assert isinstance(result, ComparisonResult)
    d = result.first_divergence
    assert isinstance(d, Divergence) and d.engine == "comparison"
    expected = {"atSequence": 9, "kind": "output", "originalEventId": "run-7f3a:0009",
                "path": "payload.result.hits", "expected": 3, "actual": 2}
    assert d.to_dict() == expected
    assert list(d.to_dict()) == list(expected)  # key order too: some outputs are not key-sorted
    assert result.to_json_dict()["firstDivergence"] == expected


def _committed(docs: list[dict]) -> list[dict]:
    out, prev = [], GENESIS
    for doc, (_, s_hash) in zip(docs, states_by_index(docs), strict=True):
        head = chain_hash(prev, doc)
        out.append({"doc": doc, "prevHash": prev, "hash": head, "stateHash": s_hash})
        prev = head
    return out


def test_the_rederivation_engine_builds_a_divergence_with_the_rederivation_json() -> None:
    records = _committed(llm_run("run-d")[:6])
    walk = _Walk(state=None, head=GENESIS, next_seq=0, collect_all=False, digests={}, snapshots={},
                 handoff_mode="auto")
    for offset, record in enumerate(records):
        if record["doc"]["sequence"] != 3:  # the log lost sequence 3; sequence 4 sits at offset 4
            walk.record(offset, record)
    [d] = walk.divergences
    assert isinstance(d, Divergence) and d.engine == "rederivation" and d.aspect == "chain"
    expected = {"atSequence": 3, "kind": "missing", "path": None, "expected": "sequence 3", "actual": "sequence 4",
                "logOffset": 4, "detail": "the committed log jumps from sequence 2 to 4; 1 record(s) are missing"}
    assert d.to_dict() == expected
    assert list(d.to_dict()) == list(expected)
    result = RederivationResult(verdict="diverged", run_id="run-d", from_seq=0, snapshot_used=None, compared=0,
                                first_divergence=d, head_hash=None, divergences=(d,), collect_all=True)
    body = result.to_json_dict()
    assert body["firstDivergence"] == expected and body["divergences"] == [expected]


def test_one_kind_vocabulary_covers_both_engines() -> None:
    assert set(get_args(DivergenceKind)) == {
        "output", "missing", "extra", "type-mismatch", "refusal",  # comparison
        "state", "tampered",  # re-derivation (+ missing)
    }


def test_a_divergence_is_frozen() -> None:
    d = Divergence(engine="comparison", at_sequence=0, kind="extra", path=None, expected=None, actual="run.started")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.kind = "missing"  # type: ignore[misc]
