"""Re-derivation's one-step usual index gives what the general path gives, on clean and altered logs (no broker).

``_Walk._usual`` takes an index that is next in order, chains, and meets its carried stateHash, and
leaves everything else to ``_Walk._index``. What must hold: a walk with it and a walk without it
(the general path for every record, as before) end in the same verdicts, counts, head, state and
record of what was seen, for every kind of alteration the walk reports, with and without
``collect_all``. The walk without it is a check that can fail: each altered log below does diverge.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from processors.replay.rederive import _Walk
from schemas.canonical import GENESIS
from tests.unit.core.forgery import forge, rechain
from tests.unit.core.runs import realistic_run


def _walk(records: list[dict[str, Any]], *, usual: bool, collect_all: bool) -> _Walk:
    walk = _Walk(state=None, head=GENESIS, next_seq=0, collect_all=collect_all, digests={}, snapshots={},
                 handoff_mode="check")
    if not usual:
        walk._usual = lambda *args: False  # type: ignore[method-assign]
    for offset, record in enumerate(records):
        walk.record(offset, record)
    walk.finish()
    return walk


def _summary(walk: _Walk) -> dict[str, Any]:
    return {"divergences": [d.to_dict() for d in walk.divergences], "compared": walk.compared,
            "undigested": walk.undigested, "events": walk.events, "head": walk.head, "next_seq": walk.next_seq,
            "state": walk.state, "seen": walk.seen, "last_digest": walk.last_digest,
            "state_diverged": walk.state_diverged, "state_blind": walk.state_blind, "conflicts": walk.conflicts}


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
        "no stateHash from the middle on": edited(lambda r: [x.pop("stateHash") for x in r[k:]]),
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
    if general is not None and name not in ("redelivered copy", "no stateHash from the middle on",
                                            "stateHash not a string"):
        # the comparison below is between two walks that found something (a rewritten copy is judged after the walk)
        assert general.divergences or general.conflicts, name
    assert usual_summary == general_summary
