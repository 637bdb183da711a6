"""The checked-in golden run pairs are what ``make_golden.py`` writes now, byte for byte.

A change to the run builders (``runs.py``, ``tests/unit/core/runs.py``) or to ``make_golden.py``
that is not followed by ``python -m tests.unit.replay.make_golden`` fails here, instead of leaving
``test_golden_cli.py`` to judge files nobody can regenerate.
"""

from __future__ import annotations

import pytest

from tests.unit.replay.make_golden import GOLDEN, golden_files

EXPECTED = golden_files()


def test_the_golden_directory_holds_exactly_the_generated_files() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.jsonl")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_file_is_current(name: str) -> None:
    assert (GOLDEN / name).read_bytes() == EXPECTED[name], (
        f"{name} is stale; regenerate with: python -m tests.unit.replay.make_golden")
