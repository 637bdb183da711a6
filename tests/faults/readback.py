"""Reading a fault test's outputs back from the topics, and checking every run against its clean fold.

The SIGKILL tests (one worker, many workers) end the same way: read the committed log once,
deduplicated as every reader does, keep the latest snapshot per run, and prove each run's
records are its chain and its last snapshot its clean fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentlog.core.fold import fold_all, state_hash
from agentlog.core.sealing import seal_event
from agentlog.streams.keyring import Keyring, load_keyring
from agentlog.streams.reader import read_topic
from agentlog.streams.settings import Settings
from tests.faults.gen import chain_of


@dataclass
class Outputs:
    """What the worker wrote: the log by run and sequence (first copy), and the other outputs."""

    log: dict[str, dict[int, dict[str, Any]]]
    copies: int  # log records seen again at a later offset (redelivered, identical or not)
    conflicts: int  # … of which differ from the first copy
    snaps: dict[str, dict[str, Any]]  # the latest snapshot per run
    rejections: list[dict[str, Any]]
    violations: list[dict[str, Any]]
    keyring: Keyring  # every run's data key: the log holds each doc in its stored (sealed) form

async def read_outputs(settings: Settings) -> Outputs:
    log: dict[str, dict[int, dict[str, Any]]] = {}
    copies = conflicts = 0
    async for _, _, _, rec in read_topic(settings, "log"):
        doc = rec["doc"]
        seen = log.setdefault(doc["runId"], {})
        first = seen.get(doc["sequence"])
        if first is None:
            seen[doc["sequence"]] = rec
        else:
            copies += 1
            conflicts += first != rec
    snaps: dict[str, dict[str, Any]] = {}
    async for _, _, key, snap in read_topic(settings, "snapshots"):
        if snap["atSequence"] >= snaps.get(key, {}).get("atSequence", -1):
            snaps[key] = snap
    rejections = [r async for _, _, _, r in read_topic(settings, "rejections")]
    violations = [v async for _, _, _, v in read_topic(settings, "violations")]
    return Outputs(log, copies, conflicts, snaps, rejections, violations, await load_keyring(settings))


def check_runs(runs: dict[str, list[dict[str, Any]]], out: Outputs) -> int:
    """Assert every run is committed whole, chained as its docs (sealed under its key), its last snapshot their
    clean fold.

    Returns the number of events missing from the log (0, or an assertion has failed first).
    """
    assert out.conflicts == 0, "different records at the same (runId, sequence)"
    assert out.rejections == [], out.rejections[:3]
    assert out.violations == [], out.violations[:3]
    lost = 0
    for run_id, sent in runs.items():
        got = out.log.get(run_id, {})
        lost += sum(1 for d in sent if d["sequence"] not in got)
        assert len(got) == len(sent), f"{run_id}: {len(got)} of {len(sent)} committed"
        docs = sealed_runs({run_id: sent}, out.keyring)[run_id]  # what the sequencer stores
        chain = chain_of(docs)
        for doc, (prev, h) in zip(docs, chain, strict=True):
            rec = got[doc["sequence"]]
            assert rec["doc"] == doc and rec["prevHash"] == prev and rec["hash"] == h
        clean, _ = fold_all(docs)
        snap = out.snaps[run_id]
        assert snap["atSequence"] == len(docs) - 1
        assert snap["state"] == clean and snap["stateHash"] == state_hash(clean)
        assert snap["headHash"] == chain[-1][1]
    return lost


def sealed_runs(runs: dict[str, list[dict[str, Any]]], keyring: Keyring) -> dict[str, list[dict[str, Any]]]:
    """``runs`` as the sequencer stores them: each doc sealed under its run's data key (deterministic)."""
    out = {}
    for run_id, docs in runs.items():
        key = keyring.data_key(run_id)
        assert key is not None, f"{run_id} has no data key in the keyring"
        out[run_id] = [seal_event(d, key) for d in docs]
    return out


async def stored_runs(settings: Settings, runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """:func:`sealed_runs` with the keyring read from ``settings``' topic."""
    return sealed_runs(runs, await load_keyring(settings))
