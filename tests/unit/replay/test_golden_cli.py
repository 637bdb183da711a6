"""The checked-in golden run pairs, replayed through ``agentlog compare`` (CliRunner).

Expected verdicts come from how each pair was made (see ``make_golden.py``), not from a run of
the engine: a matching pair, a divergent one, and a refusal one whose test expects the failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlog.cli import app

GOLDEN = Path(__file__).with_name("golden")
runner = CliRunner()


def _compare(name: str, *extra: str):
    return runner.invoke(app, ["compare", str(GOLDEN / f"{name}.original.jsonl"),
                               str(GOLDEN / f"{name}.replay.jsonl"), *extra])


def test_golden_match() -> None:
    result = _compare("match", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["verdict"] == "match" and body["errorCode"] is None
    assert body["firstDivergence"] is None and body["events"] == []
    assert body["fromSeq"] == 8 and body["comparedThrough"] == 27


def test_golden_diverged() -> None:
    result = _compare("diverged", "--json")
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert (body["verdict"], body["errorCode"]) == ("diverged", "replay_diverged")
    assert body["firstDivergence"] == {
        "atSequence": 9, "kind": "output", "originalEventId": "run-7f3a:0009",
        "path": "payload.result.hits", "expected": 3, "actual": 2,
    }
    assert body["events"] == [{"type": "replay.diverged", "payload": {
        "sourceRunId": "run-7f3a", "atSequence": 9, "originalEventId": "run-7f3a:0009",
        "divergenceKind": "output", "divergencePoint": "agent.toolReturned"}}]


def test_golden_diverged_collect_all_sees_the_consequences() -> None:
    # The tool result feeds nothing else in the run, so --all finds that one divergence only.
    body = json.loads(_compare("diverged", "--json", "--all").stdout)
    assert [d["atSequence"] for d in body["divergences"]] == [9]


def test_golden_refusal() -> None:
    result = _compare("refusal", "--json")
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert (body["verdict"], body["errorCode"]) == ("diverged_at_refusal", "replay_diverged_at_refusal")
    assert body["firstDivergence"]["atSequence"] == 5 and body["firstDivergence"]["kind"] == "refusal"
    assert body["events"] == [{"type": "replay.divergedAtRefusal", "payload": {
        "sourceRunId": "run-7f3a", "atSequence": 5, "originalEnvelopeKind": "valid", "replayEnvelopeKind": "refusal",
        "originalEventId": "run-7f3a:0005", "nodeId": "planner",
        "refusalReason": "model declined: policy update 2026-02"}}]


def test_golden_refusal_collect_all_keeps_the_refusal_verdict() -> None:
    body = json.loads(_compare("refusal", "--json", "--all", "--strict").stdout)
    assert body["verdict"] == "diverged_at_refusal"
    kinds = [d["kind"] for d in body["divergences"]]
    assert kinds[0] == "refusal" and kinds[1] == "type-mismatch" and set(kinds[2:]) == {"missing"}
    assert "reordered" not in body  # --strict output keeps today's keys


def test_golden_refusal_collect_all_per_lane() -> None:
    # Per lane the replay's run.failed (node planner) is the planner lane's next event, so it is
    # paired with the original's next planner event — the provider.usage at sequence 11 — and
    # every other event after the refusal is missing.
    body = json.loads(_compare("refusal", "--json", "--all").stdout)
    assert body["verdict"] == "diverged_at_refusal"
    found = [(d["atSequence"], d["kind"]) for d in body["divergences"]]
    assert found[0] == (5, "refusal")
    assert [at for at, kind in found if kind == "type-mismatch"] == [11]
    assert {kind for at, kind in found[1:] if at != 11} == {"missing"}


def test_from_seq_option_overrides_replay_of() -> None:
    # Treating the second tool call as part of the copied prefix makes its new arguments a divergence.
    body = json.loads(_compare("match", "--json", "--from-seq", "9").stdout)
    assert body["verdict"] == "diverged"
    assert body["firstDivergence"]["atSequence"] == 8 and body["firstDivergence"]["path"] == "payload.args.limit"


def test_human_report_shows_the_field_diff() -> None:
    result = _compare("diverged")
    assert result.exit_code == 1
    assert "verdict: diverged" in result.stdout
    assert "payload.result.hits" in result.stdout
    assert "expected: 3" in result.stdout and "actual:   2" in result.stdout
    assert "verdict: match" in _compare("match").stdout


def test_human_report_lists_all_divergences_with_all() -> None:
    result = _compare("refusal", "--all")
    assert "diverged_at_refusal" in result.stdout and "divergences" in result.stdout


@pytest.mark.parametrize("problem", ["missing", "not-json", "not-an-object"])
def test_unreadable_input_is_exit_2_with_one_line(tmp_path: Path, problem: str) -> None:
    bad = tmp_path / "bad.jsonl"
    if problem == "not-json":
        bad.write_text('{"eventId": "e0", "sequence": 0\n', encoding="utf-8")
    elif problem == "not-an-object":
        bad.write_text("[1, 2]\n", encoding="utf-8")
    result = runner.invoke(app, ["compare", str(GOLDEN / "match.original.jsonl"), str(bad), "--json"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error[replay_error]:") and "bad.jsonl" in lines[0]
    assert result.stdout == ""


def test_committed_event_wrappers_are_accepted(tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.jsonl"
    with wrapped.open("w", encoding="utf-8") as out:
        for line in (GOLDEN / "match.replay.jsonl").read_text(encoding="utf-8").splitlines():
            out.write(json.dumps({"doc": json.loads(line), "prevHash": "0" * 64, "hash": "1" * 64}) + "\n")
    result = runner.invoke(app, ["compare", str(GOLDEN / "match.original.jsonl"), str(wrapped), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["verdict"] == "match"
