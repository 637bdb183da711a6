"""The state slider's state_at: the fold's state at an index, and exactly what that index changed."""

from __future__ import annotations

import pytest

from agentlog.console.state import state_at
from agentlog.core.fold import FoldError, fold_all
from tests.unit.core.runs import realistic_run


def test_the_last_index_is_the_folded_state():
    docs = realistic_run("run-s", mode="check")
    view = state_at(docs, len(docs) - 1)
    state, _ = fold_all(docs)
    assert view.status == state["status"] == "completed"
    assert view.parts == {"variables": state["variables"], "channels": state["channels"],
                          "handoffs": state["handoffs"]}
    assert view.changed == {"status"}  # run.completed changes the status only


def test_each_index_names_what_its_event_changed():
    docs = realistic_run("run-s", mode="check")
    assert state_at(docs, 0).changed == {"status"}  # run.started: pending -> running
    goal = next(i for i, d in enumerate(docs) if d["type"] == "variable.changed")
    view = state_at(docs, goal)
    assert view.changed == {f"variables.{docs[goal]['payload']['name']}"}
    assert view.event_type == "variable.changed" and view.sequence == docs[goal]["sequence"]
    assert docs[goal]["payload"]["name"] not in state_at(docs, goal - 1).parts["variables"]
    written = next(i for i, d in enumerate(docs) if d["type"] == "channel.written")
    assert state_at(docs, written).changed == {f"channels.{docs[written]['payload']['channel']}"}
    began = next(i for i, d in enumerate(docs) if d.get("payload", {}).get("phase") == "dispatch.began")
    assert state_at(docs, began).changed == {f"handoffs.{docs[began]['eventId']}"}


def test_an_unknown_event_changes_nothing_and_indexes_are_clamped():
    docs = realistic_run("run-s", mode="check")
    docs.insert(3, {**docs[3], "type": "x.custom", "eventId": "x"})
    assert state_at(docs, 3).changed == frozenset()
    assert state_at(docs, 10_000).index == len(docs) - 1 and state_at(docs, -5).index == 0
    with pytest.raises(FoldError):
        state_at([], 0)
