"""compare_runs: every rule of SPEC §7 on copies of the realistic run, each changed in one place."""

from __future__ import annotations

import copy

import pytest

from agentlog.replay.compare import (
    ASPECTS,
    ComparisonResult,
    ReplayCounters,
    compare_runs,
    first_difference,
    record,
)
from agentlog.schemas.errors import ReplayError
from agentlog.schemas.stability import is_volatile, iter_paths
from agentlog.schemas.validate import validate_payload
from tests.unit.core.runs import realistic_run
from tests.unit.replay.runs import (
    TOOL_RESULT,
    as_replay,
    changed,
    index_of,
    llm_run,
    perturb_volatile,
    set_path,
)


@pytest.fixture
def original() -> list[dict]:
    return llm_run("run-1")


@pytest.fixture
def replay(original: list[dict]) -> list[dict]:
    return perturb_volatile(as_replay(original))


def assert_event_payloads_valid(result: ComparisonResult) -> None:
    """Every replay.* event the engine emits is a valid payload of its type (agentlog.schemas.payloads)."""
    for event in result.events:
        assert event["type"] in ("replay.diverged", "replay.divergedAtRefusal")
        validate_payload(event["type"], event["payload"])


# --- match: only volatile differences ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["check", "derive"])
def test_same_run_under_another_run_id_matches(mode: str) -> None:
    result = compare_runs(realistic_run("run-1", mode), realistic_run("run-7", mode))
    assert result.verdict == "match"
    assert result.error_code is None
    assert result.first_divergence is None and result.events == ()
    assert result.compared_through == len(realistic_run("run-1", mode)) - 1


def test_volatile_only_changes_match(original: list[dict], replay: list[dict]) -> None:
    # The replay differs in runId, every eventId, causationId bytes, timestamps, child/call ids,
    # latency, trace ids, error messages and raw bodies — and in nothing else.
    assert all(o["eventId"] != r["eventId"] and o["timestamp"] != r["timestamp"] for o, r in zip(original, replay, strict=False))
    result = compare_runs(original, replay, collect_all=True)
    assert result.verdict == "match", result.divergences
    assert result.to_json_dict()["divergences"] == []


def test_every_volatile_path_of_the_table_is_ignored(original: list[dict]) -> None:
    # Drive from the stability table: setting any non-wildcard volatile payload path changes nothing.
    from agentlog.schemas.stability import volatile_paths

    replay = as_replay(original)
    touched = 0
    for doc in replay:
        for pattern in volatile_paths(doc["type"]):
            if "[*]" in pattern or not pattern.startswith("payload.") or pattern == "payload":
                continue
            head = pattern.split(".")[1].split("[")[0]
            if head in ("request",):  # covered below: call bytes
                continue
            target = doc["payload"]
            parents = pattern.split(".")[1:-1]
            if not isinstance(target, dict) or any(not isinstance(target := target.get(p), dict) for p in parents):
                continue
            set_path(doc, pattern, f"volatile:{touched}")
            touched += 1
    assert touched > 50
    result = compare_runs(original, replay, collect_all=True)
    assert result.verdict == "match", result.divergences[:3]


def test_changed_tool_args_with_same_result_match(original: list[dict], replay: list[dict]) -> None:
    for seq in (index_of(replay, "agent.toolCalled", 0), index_of(replay, "agent.toolCalled", 1)):
        replay[seq]["payload"]["args"] = {"q": "incidents in Q4 2024", "limit": 25}
    started = index_of(replay, "agent.invocation.started")
    replay[started]["payload"]["request"]["messages"][0]["content"] = "Worst incident of Q4?"
    replay[started]["payload"]["cacheKey"] = "f" * 64
    replay[started + 1]["payload"]["cacheKey"] = "f" * 64
    assert compare_runs(original, replay).verdict == "match"


# --- divergence kinds --------------------------------------------------------------------------


def test_changed_tool_result_diverges_at_that_index(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "agent.toolReturned")
    replay[seq]["payload"]["result"]["hits"] = 4
    result = compare_runs(original, replay)
    assert result.verdict == "diverged"
    assert result.error_code == "replay_diverged"
    d = result.first_divergence
    assert (d.at_sequence, d.kind, d.path, d.expected, d.actual) == (seq, "output", "payload.result.hits", 3, 4)
    assert d.original_event_id == original[seq]["eventId"]
    assert result.compared_through == seq
    assert result.events == ({
        "type": "replay.diverged",
        "payload": {"sourceRunId": "run-1", "atSequence": seq, "originalEventId": original[seq]["eventId"],
                    "divergenceKind": "output", "divergencePoint": "agent.toolReturned"},
    },)
    assert_event_payloads_valid(result)


def test_changed_variable_reports_the_observable_state_path(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "variable.changed", 2)
    replay[seq]["payload"]["value"] = {"incidents": 3, "worst": "INC-41"}
    d = compare_runs(original, replay).first_divergence
    assert (d.at_sequence, d.kind, d.path) == (seq, "output", "variables.parentResult.worst")
    assert (d.expected, d.actual) == ("INC-42", "INC-41")


def test_changed_channel_reports_the_channel(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "channel.written", 1)
    replay[seq]["payload"]["value"] = "finished"
    d = compare_runs(original, replay).first_divergence
    assert d.at_sequence == seq and d.path.startswith("channels.progress")
    assert "done" in str(d.expected) and "finished" in str(d.actual)


def test_missing_event(original: list[dict], replay: list[dict]) -> None:
    result = compare_runs(original, replay[:-2])
    d = result.first_divergence
    assert (d.kind, d.at_sequence, d.expected, d.actual) == ("missing", len(original) - 2, "channel.written", None)
    assert result.events[0]["payload"]["divergenceKind"] == "missing"
    assert result.events[0]["payload"]["divergencePoint"] == "channel.written"


def test_extra_event(original: list[dict], replay: list[dict]) -> None:
    extra = copy.deepcopy(replay[-1])
    extra.update(sequence=len(replay), eventId="evt-extra", type="log.appended", payload={"line": "bye"})
    result = compare_runs(original, replay + [extra])
    d = result.first_divergence
    assert (d.kind, d.at_sequence, d.original_event_id, d.actual) == ("extra", len(original), None, "log.appended")
    assert "originalEventId" not in result.events[0]["payload"]
    assert result.events[0]["payload"]["divergenceKind"] == "extra"
    assert_event_payloads_valid(result)


def test_type_mismatch(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "provider.usage", 1)
    replay[seq]["type"] = "agent.reasoned"
    d = compare_runs(original, replay).first_divergence
    assert (d.kind, d.at_sequence, d.path, d.expected, d.actual) == (
        "type-mismatch", seq, "type", "provider.usage", "agent.reasoned")


def test_extra_retry_shows_as_type_mismatch(original: list[dict], replay: list[dict]) -> None:
    # One more retry shifts every later event: the retry count is compared, not tolerated.
    # Index by index that is a type mismatch; per lane it is the inserted retry itself.
    seq = index_of(replay, "node.retried")
    again = copy.deepcopy(replay[seq])
    again["payload"]["attempt"] = 2
    shifted = replay[: seq + 1] + [again] + replay[seq + 1 :]
    for i, doc in enumerate(shifted):
        doc["sequence"] = i
    d = compare_runs(original, shifted, strict=True).first_divergence
    assert (d.kind, d.at_sequence, d.expected, d.actual) == ("type-mismatch", seq + 1, "agent.toolCalled", "node.retried")
    result = compare_runs(original, shifted)
    d = result.first_divergence
    assert (d.kind, d.at_sequence, d.expected, d.actual) == ("extra", seq + 1, None, "node.retried")
    assert result.events[0]["payload"]["divergencePoint"] == "node.retried"


@pytest.mark.parametrize(
    ("type_", "path", "new"),
    [
        ("node.retried", "payload.attempt", 2),
        ("node.retried", "payload.errorCode", "ERR_HTTP_500"),
        ("provider.usage", "payload.costCents", 3),
        ("provider.usage", "payload.inputTokens", 41),
        ("agent.invocation.completed", "payload.envelope.answer", "dispatch worker-b only"),
        ("agent.invocation.completed", "payload.usage.outputTokens", 13),
    ],
)
def test_deterministic_aspects_are_compared_after_from_seq(
    original: list[dict], replay: list[dict], type_: str, path: str, new: object
) -> None:
    seq = [d["sequence"] for d in replay if d["type"] == type_][-1]
    set_path(replay[seq], path, new)
    d = compare_runs(original, replay).first_divergence
    assert (d.at_sequence, d.kind, d.path, d.actual) == (seq, "output", path, new)
    assert d.aspect == "result"


def test_every_compared_payload_field_is_a_divergence_when_changed(original: list[dict]) -> None:
    # SPEC §7 field stability: any non-volatile field (other than the call bytes, minted ids and
    # the bindings, which have their own rules) must diverge at its own index when changed.
    exempt = ("payload.args", "payload.request", "payload.cacheKey", "payload.recipe", "payload.bindings",
              "payload.replayOf", "payload.parentRunId", "payload.childRunId", "payload.callId")
    cases = 0
    for seq, doc in enumerate(original):
        for path, value in iter_paths(doc["payload"], "payload"):
            if is_volatile(doc["type"], path) or path.startswith(exempt):
                continue
            replay = as_replay(original)
            set_path(replay[seq], path, changed(value))
            result = compare_runs(original, replay)
            assert result.verdict == "diverged", (seq, path)
            assert result.first_divergence.at_sequence == seq, (seq, path, result.first_divergence)
            cases += 1
    assert cases > 60


# --- refusal (RFC 0041 §B) ---------------------------------------------------------------------


def _refuse(run: list[dict]) -> list[dict]:
    out = copy.deepcopy(run)
    seq = index_of(out, "agent.invocation.completed")
    key = out[seq]["payload"]["cacheKey"]
    out[seq]["type"] = "envelope.refusal"
    out[seq]["payload"] = {"cacheKey": key, "reason": "safety policy: dual-use"}
    return out


@pytest.mark.parametrize("collect_all", [False, True])
def test_valid_then_refusal(original: list[dict], replay: list[dict], collect_all: bool) -> None:
    seq = index_of(original, "agent.invocation.completed")
    result = compare_runs(original, _refuse(replay), collect_all=collect_all)
    assert result.verdict == "diverged_at_refusal"
    assert result.error_code == "replay_diverged_at_refusal"
    assert result.first_divergence.kind == "refusal"
    assert [e["type"] for e in result.events] == ["replay.divergedAtRefusal"]
    assert result.events[0]["payload"] == {
        "sourceRunId": "run-1", "atSequence": seq, "originalEnvelopeKind": "valid", "replayEnvelopeKind": "refusal",
        "originalEventId": original[seq]["eventId"], "nodeId": "planner", "refusalReason": "safety policy: dual-use",
    }
    assert_event_payloads_valid(result)


def test_refusal_then_valid(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(original, "agent.invocation.completed")
    result = compare_runs(_refuse(original), replay)
    assert (result.verdict, result.error_code) == ("diverged_at_refusal", "replay_diverged_at_refusal")
    payload = result.events[0]["payload"]
    assert (payload["originalEnvelopeKind"], payload["replayEnvelopeKind"]) == ("refusal", "valid")
    assert payload["atSequence"] == seq and payload["refusalReason"] == "safety policy: dual-use"
    assert not any(e["type"] == "replay.diverged" for e in result.events)


def test_refusal_followed_by_failure_fails_fast_at_the_refusal(original: list[dict], replay: list[dict]) -> None:
    refused = _refuse(replay)
    seq = index_of(refused, "envelope.refusal")
    failed = copy.deepcopy(refused[seq])
    failed.update(sequence=seq + 1, eventId="evt-fail", type="run.failed",
                  payload={"error": {"code": "envelope_refusal", "message": "refused"}})
    result = compare_runs(original, refused[: seq + 1] + [failed])
    assert result.verdict == "diverged_at_refusal"
    assert [e["type"] for e in result.events] == ["replay.divergedAtRefusal"]
    # Collect-all still reports what followed, but the refusal keeps the verdict and the error code.
    everything = compare_runs(original, refused[: seq + 1] + [failed], collect_all=True)
    assert everything.verdict == "diverged_at_refusal" and everything.error_code == "replay_diverged_at_refusal"
    assert everything.divergences[0].kind == "refusal" and len(everything.divergences) > 2


# --- causation and minted ids ------------------------------------------------------------------


def test_causation_must_map_through_the_event_id_mapping(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "agent.toolReturned")
    replay[seq]["causationId"] = replay[seq - 2]["eventId"]  # the first, failed toolCalled
    d = compare_runs(original, replay).first_divergence
    assert (d.at_sequence, d.path, d.aspect) == (seq, "causationId", "causation")
    assert (d.expected, d.actual) == (replay[seq - 1]["eventId"], replay[seq - 2]["eventId"])


def test_dropped_causation_diverges(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "variable.changed", 1)
    del replay[seq]["causationId"]
    d = compare_runs(original, replay).first_divergence
    assert (d.at_sequence, d.path, d.actual) == (seq, "causationId", None)


def test_inconsistent_minted_ids_diverge(original: list[dict], replay: list[dict]) -> None:
    seq = index_of(replay, "agent.toolReturned")
    replay[seq]["payload"]["callId"] = replay[seq - 3]["payload"]["callId"]  # the other call's id
    d = compare_runs(original, replay).first_divergence
    assert (d.at_sequence, d.path, d.aspect) == (seq, "payload.callId", "causation")


# --- bindings (MACP §3) ------------------------------------------------------------------------


def test_binding_change_is_what_if_never_match(original: list[dict], replay: list[dict]) -> None:
    replay[0]["payload"]["bindings"]["policyVersion"] = "p3"
    result = compare_runs(original, replay)
    assert result.verdict == "what-if"
    assert result.binding_diff == {"policyVersion": {"expected": "p2", "actual": "p3"}}
    assert result.error_code is None and result.first_divergence is None
    assert result.to_json_dict()["bindingDiff"] == result.binding_diff


def test_what_if_keeps_its_verdict_and_lists_divergences(original: list[dict], replay: list[dict]) -> None:
    replay[0]["payload"]["bindings"]["modeVersion"] = "m2"
    del replay[0]["payload"]["bindings"]["engineVersion"]
    seq = index_of(replay, "agent.toolReturned")
    replay[seq]["payload"]["result"] = {"hits": 0, "ids": []}
    result = compare_runs(original, replay)
    assert result.verdict == "what-if"
    assert set(result.binding_diff) == {"modeVersion", "engineVersion"}
    assert result.binding_diff["engineVersion"] == {"expected": "1.4.0", "actual": None}
    assert result.error_code == "replay_diverged"
    assert result.first_divergence.at_sequence == seq


# --- fromSeq and collect-all -------------------------------------------------------------------


def test_from_seq_splits_prefix_and_suffix(original: list[dict]) -> None:
    called = index_of(original, "agent.toolCalled", 1)
    replay = as_replay(original, from_seq=called)  # the second tool call is re-executed
    replay[called]["payload"]["args"] = {"q": "other"}
    assert compare_runs(original, replay).verdict == "match"
    # Re-executed from later on, the same call is part of the prefix: its bytes must be identical.
    later = as_replay(original, from_seq=called + 1)
    later[called]["payload"]["args"] = {"q": "other", "limit": 10}
    result = compare_runs(original, later)
    d = result.first_divergence
    assert (result.from_seq, d.at_sequence, d.path, d.aspect) == (called + 1, called, "payload.args.q", "prefix")
    # An explicit from_seq overrides replayOf.fromSeq.
    assert compare_runs(original, later, from_seq=called).verdict == "match"


def test_from_seq_defaults_to_zero_without_replay_of(original: list[dict]) -> None:
    plain = realistic_run("run-9")
    assert compare_runs(realistic_run("run-1"), plain).from_seq == 0


def test_collect_all_finds_every_divergence(original: list[dict], replay: list[dict]) -> None:
    returned = index_of(replay, "agent.toolReturned")
    replay[returned]["payload"]["result"]["hits"] = 9
    usage = index_of(replay, "provider.usage", 1)
    replay[usage]["type"] = "agent.reasoned"
    harvested = index_of(replay, "variable.changed", 2)
    replay[harvested]["payload"]["value"] = {"incidents": 2}
    fast = compare_runs(original, replay)
    assert len(fast.divergences) == 1 and len(fast.events) == 1 and not fast.exhaustive
    everything = compare_runs(original, replay, collect_all=True)
    assert [(d.at_sequence, d.kind) for d in everything.divergences] == [
        (returned, "output"), (usage, "type-mismatch"), (harvested, "output")]
    assert [e["payload"]["atSequence"] for e in everything.events] == [returned, usage, harvested]
    assert everything.compared_through == len(original) - 1
    assert everything.to_json_dict()["divergences"][1]["kind"] == "type-mismatch"
    assert_event_payloads_valid(everything)


def test_collect_all_reports_a_lasting_state_difference_once() -> None:
    original = realistic_run("run-1")
    replay = realistic_run("run-2")
    replay[1]["payload"]["value"] = "summarise Q3 incidents"  # 'goal' stays different to the end
    everything = compare_runs(original, replay, collect_all=True)
    assert [(d.at_sequence, d.path) for d in everything.divergences] == [(1, "variables.goal")]


# --- shape, errors, counters -------------------------------------------------------------------


def test_json_shape(original: list[dict], replay: list[dict]) -> None:
    body = compare_runs(original, replay).to_json_dict()
    assert {"verdict", "errorCode", "firstDivergence", "events"} <= set(body)
    assert "divergences" not in body and "bindingDiff" not in body
    replay[index_of(replay, "agent.toolReturned")]["payload"]["result"] = None
    first = compare_runs(original, replay).to_json_dict()["firstDivergence"]
    assert set(first) == {"atSequence", "kind", "originalEventId", "path", "expected", "actual"}


def test_result_is_frozen(original: list[dict], replay: list[dict]) -> None:
    result = compare_runs(original, replay)
    with pytest.raises(AttributeError):
        result.verdict = "diverged"  # type: ignore[misc]


def test_inputs_are_not_mutated(original: list[dict], replay: list[dict]) -> None:
    before = copy.deepcopy((original, replay))
    compare_runs(original, replay, collect_all=True)
    assert (original, replay) == before


@pytest.mark.parametrize("bad", ["empty", "duplicate", "no-sequence"])
def test_unusable_input_is_a_replay_error(original: list[dict], bad: str) -> None:
    replay = {"empty": [], "duplicate": original + [original[3]],
              "no-sequence": [{k: v for k, v in original[0].items() if k != "sequence"}]}[bad]
    with pytest.raises(ReplayError):
        compare_runs(original, replay)


def test_first_difference_paths() -> None:
    assert first_difference({"a": [1, {"x.y": 2}]}, {"a": [1, {"x.y": 3}]}) == ('a[1]["x.y"]', 2, 3)
    assert first_difference({"a": [1, 2]}, {"a": [1, 2, 3]}) == ("a.length", 2, 3)
    assert first_difference({"a": 1}, {"a": 1.0}) is None
    assert first_difference({"a": 1}, {"a": True}) == ("a", 1, True)


def test_counters(original: list[dict], replay: list[dict]) -> None:
    counters = ReplayCounters()
    record(compare_runs(original, replay), counters)
    snap = counters.snapshot()
    assert snap["match"] == {a: 1 for a in ASPECTS} and set(snap["mismatch"].values()) == {0}

    diverged = copy.deepcopy(replay)
    diverged[index_of(diverged, "agent.toolReturned")]["payload"]["result"] = TOOL_RESULT | {"hits": 1}
    diverged[0]["payload"]["bindings"]["configVersion"] = "c8"
    record(compare_runs(original, diverged), counters)  # fail-fast: only what it established
    snap = counters.snapshot()
    assert snap["mismatch"]["result"] == 1 and snap["mismatch"]["bindings"] == 1
    assert snap["match"]["state"] == 1  # not reached, not counted

    record(compare_runs(original, _refuse(replay), collect_all=True), counters)
    snap = counters.snapshot()
    assert snap["mismatch"]["refusal"] == 1 and snap["match"]["state"] == 2 and snap["match"]["bindings"] == 2
