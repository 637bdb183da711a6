"""The two replay corpora (``corpus.py``), judged per lane and index by index.

Each case's expected verdict, kind and sequence come from how it was built; the ``--strict``
answer follows from the same construction (the first index whose events are not the same event).
"""

from __future__ import annotations

import pytest

from agentlog.replay.compare import compare_runs
from tests.unit.replay.corpus import Case, concurrent_cases, sequential_cases

SEQUENTIAL = sequential_cases()
CONCURRENT = concurrent_cases()


def _judged(case: Case, *, strict: bool) -> tuple[str, str | None, int | None]:
    result = compare_runs(case.original, case.replay, strict=strict)
    d = result.first_divergence
    return result.verdict, (d.kind if d else None), (d.at_sequence if d else None)


def test_the_sequential_corpus_covers_every_change_on_every_shape() -> None:
    assert len(SEQUENTIAL) == 56
    kinds = {(case.name.split("/")[0], case.kind or case.verdict) for case in SEQUENTIAL}
    for shape in ("llm", "check", "derive", "child"):
        for kind in ("match", "what-if", "output", "missing", "extra", "type-mismatch"):
            assert (shape, kind) in kinds
    assert sum(case.kind == "refusal" for case in SEQUENTIAL) == 4
    assert {"llm/extra-variable.changed-dispatch-at-18", "check/extra-variable.changed-dispatch-at-10",
            "derive/extra-variable.changed-dispatch-at-7"} <= {case.name for case in SEQUENTIAL}


@pytest.mark.parametrize("case", SEQUENTIAL, ids=lambda case: case.name)
def test_sequential_case_per_lane(case: Case) -> None:
    assert _judged(case, strict=False) == (case.verdict, case.kind, case.at)


@pytest.mark.parametrize("case", SEQUENTIAL, ids=lambda case: case.name)
def test_sequential_case_moves_nothing_across_lanes(case: Case) -> None:
    # A replay in the original's order with one event more or less has interleaved nothing
    # differently: the events after an insertion or removal shift, but none is reordered.
    assert compare_runs(case.original, case.replay).reordered == ()


@pytest.mark.parametrize("case", SEQUENTIAL, ids=lambda case: case.name)
def test_sequential_case_strict(case: Case) -> None:
    expected = case.strict_expectation()
    assert expected[2] == case.at  # a sequential replay departs where it was changed, in either mode
    assert _judged(case, strict=True) == expected


@pytest.mark.parametrize("case", CONCURRENT, ids=lambda case: case.name)
def test_concurrent_case_per_lane(case: Case) -> None:
    assert _judged(case, strict=False) == (case.verdict, case.kind, case.at)


@pytest.mark.parametrize("case", CONCURRENT, ids=lambda case: case.name)
def test_concurrent_case_strict(case: Case) -> None:
    assert _judged(case, strict=True) == case.strict_expectation()


def test_interleaving_only_lists_what_moved() -> None:
    for case in CONCURRENT:
        if case.verdict == "match":
            moved = compare_runs(case.original, case.replay).reordered
            assert moved and all(r["atSequence"] != r["replaySequence"] for r in moved), case.name
