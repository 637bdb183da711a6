"""Write the golden run pairs in ``tests/unit/replay/golden/`` (the files are checked in).

    .venv/bin/python -m tests.unit.replay.make_golden

``test_goldens_current.py`` fails when the checked-in files differ from what this writes now.

Each pair is a source run and a replay of it, built from :func:`tests.unit.replay.runs.llm_run` and
changed on purpose; nothing here calls the comparison engine. The verdict each pair must get
is written in ``test_golden_cli.py`` from the reasoning below, not from a run of the code:

* ``match``: replayed from the second tool call (fromSeq 8) with new ids, clocks, trace ids,
  latency, human messages — and different arguments for the re-executed tool call at sequence 8
  (same result), which RFC 0041 §C allows. Verdict ``match``.
* ``diverged``: same replay, but the search tool returns 2 hits instead of 3 at sequence 9.
  Verdict ``diverged`` at 9, path ``payload.result.hits``, 3 → 2.
* ``refusal``: the replay re-executes from the LLM call (fromSeq 4); the model now refuses at
  sequence 5, and the replay fails right after. Verdict ``diverged_at_refusal`` at 5.

Concurrent workers and run trees (:func:`tests.unit.replay.runs.concurrent_run`: workers ``wa`` and
``wb`` interleave at sequences 3..8; each dispatch creates a child run,
:func:`~tests.unit.replay.runs.worker_child_run`). Files of the tree pairs hold the parent first,
then its child runs. The replays of the first two lay wb's events before wa's (``WB_FIRST``):

* ``interleaved``: only the interleaving differs. Per lane: ``match``, reordered sequences
  3→6, 4→3, 5→7, 6→8, 7→4, 8→5. ``--strict``: ``diverged`` at 3 (type stays toolCalled; node/args differ).
* ``interleaved-result``: also wb's tool returns 5 pages instead of 2 (sequence 7 of the source).
  Per lane: ``diverged`` at 7, ``payload.result.pages`` 2 → 5.
* ``child-diverged``: parent replayed faithfully; in worker-a's child run the tool returns 2 hits
  instead of 3 (child sequence 4). ``diverged`` at 4 with the path parent → worker-a (dispatched
  at 1) → child run.
* ``child-missing``: the replay dispatches worker-b under a new child id, but that child run
  has no events. ``diverged``, kind ``missing`` at 0 of worker-b's child, path via sequence 2.
* ``child-refusal``: worker-a's replayed child gets a refusal where the original got a valid
  envelope (child sequence 2), then fails. ``diverged_at_refusal`` at 2, path via worker-a.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.unit.replay.runs import (
    as_replay,
    concurrent_run,
    index_of,
    interleave,
    llm_run,
    perturb_volatile,
    worker_child_run,
)

#: The interleaving the replays of the concurrent run use: wb's events before wa's.
WB_FIRST = [0, 1, 2, 4, 7, 8, 3, 5, 6, 9]

GOLDEN = Path(__file__).with_name("golden")


def render(docs: list[dict]) -> bytes:
    """One run as a golden file's bytes: one key-sorted JSON object per line, UTF-8."""
    return "".join(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n" for doc in docs).encode("utf-8")


def pairs() -> dict[str, tuple[list[dict], list[dict]]]:
    original = llm_run("run-7f3a")
    second_call = index_of(original, "agent.toolCalled", 1)

    match = perturb_volatile(as_replay(original, replay_run_id="replay-7f3a-1", from_seq=second_call))
    match[second_call]["payload"]["args"] = {"q": "Q4 incidents", "limit": 50}

    diverged = perturb_volatile(as_replay(original, replay_run_id="replay-7f3a-2", from_seq=second_call))
    returned = index_of(original, "agent.toolReturned")
    diverged[returned]["payload"]["result"] = {"hits": 2, "ids": ["INC-41", "INC-42"]}

    started = index_of(original, "agent.invocation.started")
    refusal = as_replay(original, replay_run_id="replay-7f3a-3", from_seq=started)
    completed = index_of(original, "agent.invocation.completed")
    key = refusal[completed]["payload"]["cacheKey"]
    refusal[completed]["type"] = "envelope.refusal"
    refusal[completed]["payload"] = {"cacheKey": key, "reason": "model declined: policy update 2026-02"}
    failed = copy.deepcopy(refusal[completed])
    failed.update(sequence=completed + 1, eventId="evt-replay-7f3a-3-fail", type="run.failed", nodeId="planner",
                  payload={"error": {"code": "envelope_refusal", "message": "the model refused"}})
    failed["causationId"] = refusal[completed]["eventId"]
    refusal = refusal[: completed + 1] + [failed]

    out = {"match": (original, match), "diverged": (original, diverged), "refusal": (original, refusal)}
    out.update(tree_pairs())
    return out


def _tree(run_id: str) -> list[dict]:
    """A concurrent parent run followed by its two child runs (one file's worth)."""
    return concurrent_run(run_id) + worker_child_run(f"{run_id}.child-a", "wa") + worker_child_run(
        f"{run_id}.child-b", "wb")


def _replayed_tree(source: str, replay_id: str, order: list[int] | None = None) -> list[list[dict]]:
    """[parent, child-a, child-b] as an honest host replays them (children under fresh ids)."""
    parent = as_replay(concurrent_run(source), replay_run_id=replay_id)
    if order is not None:
        parent = interleave(parent, order)
    children = [as_replay(worker_child_run(f"{source}.child-{w}", node), replay_run_id=f"{replay_id}-fresh.child-{w}")
                for w, node in (("a", "wa"), ("b", "wb"))]
    return [parent, *children]


def tree_pairs() -> dict[str, tuple[list[dict], list[dict]]]:
    interleaved = _replayed_tree("par-1", "replay-par-1", WB_FIRST)

    result = _replayed_tree("par-2", "replay-par-2", WB_FIRST)
    wb_returned = WB_FIRST.index(7)
    result[0][wb_returned]["payload"]["result"] = {"pages": 5}

    child_diverged = _replayed_tree("par-3", "replay-par-3")
    child_diverged[1][4]["payload"]["result"] = {"hits": 2, "ids": ["INC-41", "INC-42"]}

    child_missing = _replayed_tree("par-4", "replay-par-4")[:2]  # worker-b's child run never happened

    child_refusal = _replayed_tree("par-5", "replay-par-5")
    child_a = child_refusal[1]
    refused = child_a[2]
    refused["type"] = "envelope.refusal"
    refused["payload"] = {"cacheKey": refused["payload"]["cacheKey"], "reason": "model declined"}
    failed = copy.deepcopy(refused)
    failed.update(sequence=3, eventId=f"{refused['eventId']}-fail", type="run.failed", nodeId="end",
                  payload={"error": {"code": "envelope_refusal", "message": "the model refused"}},
                  causationId=refused["eventId"])
    child_refusal[1] = child_a[:3] + [failed]

    def flat(runs: list[list[dict]]) -> list[dict]:
        return [doc for run in runs for doc in run]

    return {
        "interleaved": (concurrent_run("par-1"), interleaved[0]),
        "interleaved-result": (concurrent_run("par-2"), result[0]),
        "child-diverged": (_tree("par-3"), flat(child_diverged)),
        "child-missing": (_tree("par-4"), flat(child_missing)),
        "child-refusal": (_tree("par-5"), flat(child_refusal)),
    }


def golden_files() -> dict[str, bytes]:
    """File name → bytes of every golden file, as :func:`main` writes them."""
    out: dict[str, bytes] = {}
    for name, (original, replay) in pairs().items():
        out[f"{name}.original.jsonl"] = render(original)
        out[f"{name}.replay.jsonl"] = render(replay)
    return out


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, data in golden_files().items():
        (GOLDEN / name).write_bytes(data)


if __name__ == "__main__":
    main()
