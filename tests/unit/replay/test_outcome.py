"""compare_outcome on the AOS replay-assertion fixture, driven by its own ``_replay_assertion`` lists."""

from __future__ import annotations

import copy
import json

import pytest

from agentlog.replay.compare import compare_outcome
from agentlog.schemas.errors import ReplayError
from agentlog.schemas.stability import WILDCARD, parse_path
from agentlog.schemas.upstream import UPSTREAM_DIR
from tests.unit.replay.runs import changed

REFERENCE = UPSTREAM_DIR
FIXTURE = REFERENCE / "aos/backend/app/schemas/examples/structured_outcome_replayable.json"


def _fixture() -> dict:
    assert FIXTURE.is_file(), f"AOS fixture not found at {FIXTURE} (set AGENTLOG_REFERENCE)"
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


ASSERTION = _fixture()["_replay_assertion"]
DETERMINISTIC = list(ASSERTION["deterministic_fields"])
IGNORED = list(ASSERTION["ignored_fields"])


@pytest.fixture
def outcome() -> dict:
    doc = _fixture()
    del doc["_replay_assertion"]
    return doc


def _compare(original: dict, replay: dict):
    return compare_outcome(original, replay, deterministic_fields=ASSERTION["deterministic_fields"],
                           ignored_fields=IGNORED)


def _mutate(doc: dict, path: str) -> None:
    """Change the value at ``path`` (first element for ``[*]``; ``.length`` appends); create it if absent."""
    if path.endswith(".length"):
        target = doc
        for seg in parse_path(path[: -len(".length")]):
            target = target[seg]
        target.append(copy.deepcopy(target[-1]))
        return
    segments = [0 if seg is WILDCARD else seg for seg in parse_path(path)]
    target = doc
    for seg in segments[:-1]:
        target = target.setdefault(seg, {}) if isinstance(target, dict) else target[seg]
    last = segments[-1]
    target[last] = changed(target[last]) if (isinstance(target, list) or last in target) else "new"


def test_identical_outcomes_match(outcome: dict) -> None:
    assert _compare(outcome, copy.deepcopy(outcome)) == []


@pytest.mark.parametrize("path", DETERMINISTIC)
def test_each_deterministic_field_changed_diverges_at_that_field(outcome: dict, path: str) -> None:
    replay = copy.deepcopy(outcome)
    _mutate(replay, path)
    divergences = _compare(outcome, replay)
    assert path in [d.path for d in divergences]
    d = next(d for d in divergences if d.path == path)
    assert d.kind == "output" and d.expected != d.actual
    if not path.endswith(".length") and "[*]" not in path:
        assert [d.path for d in divergences] == [path]


@pytest.mark.parametrize("path", IGNORED)
def test_each_ignored_field_changed_matches(outcome: dict, path: str) -> None:
    replay = copy.deepcopy(outcome)
    _mutate(replay, path)
    assert replay != outcome
    assert _compare(outcome, replay) == []


def test_retry_count_and_side_effect_order_are_compared(outcome: dict) -> None:
    replay = copy.deepcopy(outcome)
    replay["observability"]["backend_retries"] = 2
    replay["side_effects"][0]["target"], replay["side_effects"][1]["target"] = "hooks.slack.com", "api.example.com"
    paths = {d.path: (d.expected, d.actual) for d in _compare(outcome, replay)}
    assert paths["observability.backend_retries"] == (3, 2)
    assert paths["side_effects[*].target"][1][:2] == ["hooks.slack.com", "api.example.com"]


def test_missing_field_is_a_divergence(outcome: dict) -> None:
    replay = copy.deepcopy(outcome)
    del replay["metadata"]["skill_version"]
    [d] = _compare(outcome, replay)
    assert (d.path, d.expected, d.actual) == ("metadata.skill_version", "1.0.0", None)
    assert "absent in the replay" in d.detail


def test_a_field_declared_both_ways_is_refused(outcome: dict) -> None:
    with pytest.raises(ReplayError):
        compare_outcome(outcome, outcome, deterministic_fields=["status", "timestamp"], ignored_fields=["timestamp"])
