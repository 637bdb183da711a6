"""A run whose input held personal data, stored redacted by the sequencer, replays as ``match`` in ``recorded`` mode.

The host keyed each model call over the original text; the replay reads the recorded (redacted) input, so it asks
the redacted request. The recording keeps each redacted call under its stored request's key too, and the replay
looks a miss up by its own request redacted by the same policy (no broker: the sequencer's redaction is the
deployment's :class:`~agentlog.core.redaction.Redactor` applied to the recorded events, as it applies it).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic_ai")

from agentlog.core.redaction import Redactor  # noqa: E402
from agentlog.replay.regression import record, replay_recorded  # noqa: E402
from agentlog.schemas.content import REDACTIONS  # noqa: E402
from agentlog.streams.settings import Settings  # noqa: E402
from tests.unit.replay import suite_program  # noqa: E402

ASKED = {"order": "101", "question": "Where is my order 101? Write to alice@example.com please."}


def _stored() -> list[dict]:
    docs = record(suite_program.support, run_id="pii-1", input=ASKED)
    stored = [Redactor().stored(doc) for doc in docs]
    assert "alice@example.com" not in json.dumps(stored)  # the input and every request that quoted it
    assert any(REDACTIONS in d["payload"] for d in stored if d["type"] == "agent.invocation.started")
    return stored


def test_a_redacted_input_replays_as_a_match_in_recorded_mode(tmp_path):
    result = replay_recorded("pii-1", _stored(), suite_program.support, mode="recorded",
                             settings=Settings(home=tmp_path), publish=False)
    assert result.verdict == "match", result


def test_a_request_the_policy_redacts_beyond_the_input_replays_as_a_match(tmp_path):
    """The program's own instructions quote an address: the replay asks them in clear, the recording keeps them
    masked, and the replay's request redacted by the policy is the recorded one."""
    program = suite_program.support_program(instructions="Answer the customer; escalate to ops@example.com.")
    docs = record(program, run_id="pii-2", input=ASKED)
    stored = [Redactor().stored(doc) for doc in docs]
    assert "ops@example.com" not in json.dumps(stored)
    result = replay_recorded("pii-2", stored, program, mode="recorded", settings=Settings(home=tmp_path),
                             publish=False)
    assert result.verdict == "match" and result.served == 2, result


def test_a_changed_program_still_misses(tmp_path):
    """The redacted key finds the same request only: another prompt is still another request."""
    result = replay_recorded("pii-1", _stored(), suite_program.support_prompt_v2, mode="recorded",
                             settings=Settings(home=tmp_path), publish=False)
    assert result.verdict != "match" and result.miss is not None


def test_a_worker_serving_a_redacted_recording_answers_the_replays_request_by_its_redacted_key():
    """``/replay/<run>/results`` (a host replaying against the worker) tries the request redacted as well."""
    import copy

    from agentlog.core.result_cache import ResultCache
    from agentlog.replay.served import results_answer

    program = suite_program.support_program(instructions="Answer the customer; escalate to ops@example.com.")
    stored = [Redactor().stored(doc) for doc in record(program, run_id="pii-3", input=ASKED)]
    started = next(d for d in stored if d["type"] == "agent.invocation.started")
    asked = copy.deepcopy(started["payload"]["request"])  # the replay's: its input redacted, its instructions not
    asked["messages"][0]["parts"][0]["content"] = "Answer the customer; escalate to ops@example.com."
    cache = ResultCache.from_events(stored)
    params = {"node": started["nodeId"], "request": asked}
    assert results_answer(cache, "pii-3", params)[0] == 404
    status, answer = results_answer(cache, "pii-3", params, Redactor().request)
    assert status == 200 and answer["result"]["kind"] == "valid"
