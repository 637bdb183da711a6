"""Re-derivation's one-step usual index gives what the general path gives, on clean and altered logs (no broker).

``_Walk._usual`` takes an index that is next in order, chains, and meets its carried stateHash, and
leaves everything else to ``_Walk._index``. What must hold: a walk with it and a walk without it
(the general path for every record) end in the same verdicts, counts, head, state and
record of what was seen, for every kind of alteration the walk reports, with and without
``collect_all``. The walk without it is a check that can fail: each altered log below does diverge.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentlog.replay.rederive import _Walk
from tests.unit.core.forgery import forge, rechain
from tests.unit.core.runs import realistic_run
from tests.unit.replay.walks import new_walk, walk_records, walk_summary


def _walk(records: list[dict[str, Any]], *, usual: bool, collect_all: bool) -> _Walk:
    return walk_records(records, usual=usual, collect_all=collect_all)


_summary = walk_summary


def _clean() -> list[dict[str, Any]]:
    return rechain(realistic_run("usual-1", "check"))


def _altered() -> dict[str, list[dict[str, Any]]]:
    clean = _clean()
    k = len(clean) // 2

    def edited(change: Any) -> list[dict[str, Any]]:
        records = copy.deepcopy(clean)
        change(records)
        return records

    return {
        "doc rewritten, hash kept": edited(lambda r: r[k]["doc"].update(nodeId="elsewhere")),
        "stateHash altered": edited(lambda r: r[k].update(stateHash="0" * 64)),
        "prevHash altered": edited(lambda r: r[k].update(prevHash="1" * 64)),
        "hash altered": edited(lambda r: r[k].update(hash="2" * 64)),
        "record missing": edited(lambda r: r.pop(k)),
        "redelivered copy": edited(lambda r: r.insert(k + 3, copy.deepcopy(r[k]))),
        "rewritten copy": edited(lambda r: r.insert(k + 3, {**copy.deepcopy(r[k]), "hash": "3" * 64})),
        "no stateHash from the middle on (log format 1)": edited(lambda r: [x.pop("stateHash") for x in r[k:]]),
        "stateHash not a string": edited(lambda r: r[k].update(stateHash=7)),
        "no hash": edited(lambda r: r[k].pop("hash")),
    }


@pytest.mark.parametrize("collect_all", [False, True])
def test_a_clean_log_walks_the_same_with_the_usual_index(collect_all: bool) -> None:
    with_usual, general = _walk(_clean(), usual=True, collect_all=collect_all), \
        _walk(_clean(), usual=False, collect_all=collect_all)
    assert not with_usual.divergences and with_usual.compared == len(_clean())
    assert _summary(with_usual) == _summary(general)


def test_a_forgery_that_recomputes_every_hash_walks_the_same() -> None:
    forged = forge(_clean(), 5, lambda doc: doc.update(nodeId="forged"))
    assert _summary(_walk(forged, usual=True, collect_all=True)) == _summary(_walk(forged, usual=False,
                                                                                 collect_all=True))


def _outcome(records: list[dict[str, Any]], *, usual: bool, collect_all: bool) -> tuple[_Walk | None, Any]:
    """The walk and its summary, or ``None`` and the exception type when the walk raises (both paths must)."""
    try:
        walk = _walk(copy.deepcopy(records), usual=usual, collect_all=collect_all)
    except Exception as e:  # noqa: BLE001 - compared, not hidden: the general path raises it as well
        return None, type(e)
    return walk, _summary(walk)


@pytest.mark.parametrize("collect_all", [False, True])
@pytest.mark.parametrize("name", sorted(_altered()))
def test_an_altered_log_walks_the_same_with_the_usual_index(name: str, collect_all: bool) -> None:
    records = _altered()[name]
    general, general_summary = _outcome(records, usual=False, collect_all=collect_all)
    with_usual, usual_summary = _outcome(records, usual=True, collect_all=collect_all)
    if general is not None and name != "redelivered copy":
        # the comparison below is between two walks that found something (a rewritten copy is judged after the walk)
        assert general.divergences or general.conflicts, name
    assert usual_summary == general_summary


# --- the usual indexes of a fetched batch in one frame (``_Walk.usual_run``) ---------------------------

def _batched_walk(records: list[dict[str, Any]], *, collect_all: bool, size: int) -> tuple[_Walk, list[int]]:
    """The replay's loop: ``usual_run`` over each batch of undecoded records, the general way for the rest."""
    from agentlog.streams.codec import decode_record, encode_record

    other = {"doc": {"runId": "someone-else", "sequence": 0}, "hash": "x"}
    raw = []
    for offset, record in enumerate(records):
        raw.append((2 * offset, b"k", encode_record(record)))
        if offset % 5 == 2:
            raw.append((2 * offset + 1, b"k", encode_record(other)))  # another run's record on the partition
    raw.insert(len(raw) // 3, (10_000, b"k", encode_record({"doc": "not an object"})))
    walk = new_walk(collect_all=collect_all)
    progressed: list[int] = []
    for start in range(0, len(raw), size):
        batch = raw[start:start + size]
        i = 0
        while i < len(batch):
            i = walk.usual_run(batch, i, "usual-1", progress=lambda done, total: progressed.append(done))
            if i == len(batch):
                break
            offset, _, data = batch[i]
            i += 1
            value = decode_record(data)
            doc = value.get("doc")
            if not isinstance(doc, dict) or doc.get("runId") != "usual-1":
                continue
            walk.record(offset, value, doc)
    return walk, progressed


def _by_offset(walk: _Walk) -> dict[str, Any]:
    summary = _summary(walk)
    summary["seen"] = {seq: (offset // 2, *rest) for seq, (offset, *rest) in walk.seen.items()}
    summary["divergences"] = [{**d, "logOffset": d["logOffset"] // 2 if d.get("logOffset") else d.get("logOffset")}
                              for d in summary["divergences"]]
    summary["conflicts"] = [(seq, offset // 2, copy_) for seq, offset, copy_ in walk.conflicts]
    return summary


@pytest.mark.parametrize("collect_all", [False, True])
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_usual_runs_of_a_batch_walk_as_record_by_record(collect_all: bool, size: int) -> None:
    logs = {"clean": _clean(), "forged": forge(_clean(), 5, lambda doc: doc.update(nodeId="forged")), **_altered()}
    for name, records in logs.items():
        one_by_one, expected = _outcome(records, usual=True, collect_all=collect_all)
        try:
            got = _by_offset(_batched_walk(copy.deepcopy(records), collect_all=collect_all, size=size)[0])
        except Exception as e:  # noqa: BLE001 - compared: the record-by-record walk raises it as well
            got = type(e)
        assert got == expected, name
    clean, progressed = _batched_walk(_clean(), collect_all=collect_all, size=size)
    assert not clean.divergences and clean.compared == len(_clean())
    assert progressed == []  # fewer than PROGRESS_EVERY events


def test_usual_runs_report_progress_as_the_loop_did(monkeypatch) -> None:
    from agentlog.replay import rederive

    monkeypatch.setattr(rederive, "PROGRESS_EVERY", 3)
    walk, progressed = _batched_walk(_clean(), collect_all=False, size=1000)
    assert progressed and all(done % 3 == 0 for done in progressed) and progressed == sorted(progressed)
    assert not walk.divergences
