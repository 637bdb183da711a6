"""The one-pass fold (``runstate.advance``) and the stateless log check (``runstate.chain_problem``).

Expected state hashes come from the reference path (``states_by_index``: fold + full JCS
hash), chains from :func:`agentlog.schemas.canonical.chain_hash`; neither is the code under test.
"""

from __future__ import annotations

import copy

from agentlog.core.fold import states_by_index
from agentlog.core.runstate import TERMINAL_TYPES, advance, chain_problem
from agentlog.schemas.canonical import GENESIS, chain_hash
from tests.unit.replay.runs import llm_run


def _chained(docs):
    out, head = [], GENESIS
    for doc in docs:
        h = chain_hash(head, doc)
        out.append({"doc": doc, "prevHash": head, "hash": h,
                    "source": {"topic": "t", "partition": 0, "offset": 0, "timestampMs": 0}})
        head = h
    return out


def test_advance_gives_the_reference_state_hash_at_every_index_and_snapshots_every_n_and_at_the_end():
    docs = llm_run("r-one")
    expected = states_by_index(docs)
    rec, snapshots = None, []
    for doc, committed, (_, s_hash) in zip(docs, _chained(docs), expected, strict=True):
        adv = advance(rec, doc, committed["hash"], snapshot_every=4, handoff_mode="auto")
        assert adv.state_hash == s_hash, doc["sequence"]
        assert adv.record["head"] == committed["hash"] and adv.record["next"] == doc["sequence"] + 1
        if adv.snapshot:
            snapshots.append(doc["sequence"])
        rec = adv.record
    assert docs[-1]["type"] in TERMINAL_TYPES and snapshots[-1] == len(docs) - 1
    assert snapshots[:3] == [3, 7, 11]


def test_chain_problem_accepts_honest_records_and_flags_altered_ones():
    records = _chained(llm_run("r-three"))
    assert all(chain_problem(r) is None for r in records)
    altered = copy.deepcopy(records[10])
    altered["doc"]["payload"]["value"] = -1
    problem = chain_problem(altered)
    assert problem is not None and problem["code"] == "hash_chain_broken"
    assert (problem["eventId"], problem["sequence"]) == (records[10]["doc"]["eventId"], 10)
    forged = copy.deepcopy(records[-1])
    forged["prevHash"] = "f" * 64
    assert chain_problem(forged)["code"] == "hash_chain_broken"
    assert chain_problem({"doc": "not a doc"}) is None  # nothing to key a violation by
