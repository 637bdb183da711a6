"""A verdict as the verdicts topic and the audit store keep it: what it says of the runs' content is sealed."""

from __future__ import annotations

import os

from agentlog.core.sealing import ERASED, DataKey, is_sealed
from agentlog.replay.host import opened_verdict, stored_verdict
from agentlog.schemas.canonical import jcs
from agentlog.schemas.records import verdict

KEY = DataKey("k1", os.urandom(32))
HOST_KEY = "alice@example.com"  # a key a host chose inside a variable's value


def _diverged():
    return verdict(replay_run_id="r1.replay", source_run_id="r1", mode="live", verdict="diverged",
                   error_code="replay_diverged", compared_through=1, events=[],
                   first_divergence={"atSequence": 1, "kind": "output", "path": f"variables.goal.{HOST_KEY}",
                                     "expected": None, "actual": "a note", "originalEventId": "e1"})


def test_the_divergence_path_is_sealed_with_its_values():
    stored = stored_verdict(_diverged(), KEY)
    divergence = stored["firstDivergence"]
    assert is_sealed(divergence["path"]) and is_sealed(divergence["actual"])
    assert HOST_KEY.encode() not in jcs(stored) and b"a note" not in jcs(stored)
    assert (divergence["atSequence"], divergence["kind"], divergence["originalEventId"]) == (1, "output", "e1")
    assert opened_verdict(stored, {"k1": KEY}.get) == _diverged()


def test_without_the_key_the_path_reads_erased():
    stored = stored_verdict(_diverged(), None)
    assert stored["firstDivergence"]["path"] == ERASED and stored["firstDivergence"]["actual"] == ERASED
