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
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.unit.replay.runs import as_replay, index_of, llm_run, perturb_volatile

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

    return {"match": (original, match), "diverged": (original, diverged), "refusal": (original, refusal)}


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
