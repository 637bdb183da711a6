"""A run recorded through OpenTelemetry as a replay's source: refused with the reason, never a false divergence.

The worker maps spans to runs (:func:`agentlog.core.otel.map_trace`); the replay adapters record what the program's
framework calls. For the same programs (:mod:`tests.otel_corpus.programs`) the two differ in the run tree (a hand-off
is a child run in the mapping, an in-run node in the adapters'), in the events (``node.*``, ``provider.usage``, the
hand-off's chain events against the adapters' hand-off tool call) and in the cache keys of most model calls, so a
replay of a mapped run through the adapters would diverge at once for no change of the program's. Every run of
every corpus fixture is refused (``otel_source``) before the program runs: by ``replay_recorded``, by
``agentlog replay-test``, and in a suite as an ``unsupported`` run that the rest of the suite goes on without.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.replay.pytest_plugin import SuiteCase
from agentlog.replay.regression import otel_mapped, replay_recorded
from agentlog.replay.suite import UNSUPPORTED, Suite, file_run, replay_suite
from agentlog.schemas.errors import ReplayError
from tests.unit.core.test_otel_corpus import CASES, mapped, spans_of

RECORDED = Path(__file__).parent / "recorded"


def _not_run(recorder: object) -> None:
    raise AssertionError("a refused recording does not run the program")


@pytest.fixture(scope="module")
def otel_runs() -> dict[str, list[dict]]:
    """Every run of every corpus fixture, mapped as the worker maps it: "<program>.<instrumentation>/<run id>"."""
    return {f"{program}.{instrumentation}/{run_id}": docs for program, instrumentation in CASES
            for run_id, docs in mapped(spans_of(program, instrumentation)).items()}


def _roots(otel_runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    return {key: docs for key, docs in otel_runs.items()
            if docs[0]["type"] == "run.started" and "parentRunId" not in docs[0]["payload"]}


def test_every_mapped_run_is_refused_before_the_program_runs_with_what_to_do(otel_runs):
    assert len(_roots(otel_runs)) == len(CASES)
    for key, docs in otel_runs.items():
        run_id = docs[0]["runId"]
        with pytest.raises(ReplayError) as refused:
            replay_recorded(run_id, docs, _not_run)
        message = str(refused.value)
        assert refused.value.code == "otel_source", key
        assert "\n" not in message and f"run {run_id} was recorded through OpenTelemetry" in message
        assert "record the run with the adapters" in message


def test_runs_the_adapters_recorded_are_not_taken_for_mapped_ones():
    for path in sorted(RECORDED.glob("*.jsonl")):
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        assert not otel_mapped(docs), path.name


def test_replay_test_refuses_an_exported_mapped_run_with_exit_2(otel_runs, tmp_path):
    [(key, docs)] = [(k, d) for k, d in _roots(otel_runs).items() if k.startswith("openai_agents.openllmetry/")]
    path = tmp_path / "otel.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    done = CliRunner().invoke(app, ["replay-test", str(path), "--program", "tests.otel_corpus.programs:support_agents"])
    assert done.exit_code == 2, done.output
    [line] = [line for line in done.output.splitlines() if line.strip()]
    assert line.startswith("error[otel_source]: run ") and "diverged" not in done.output


def test_a_suite_reports_mapped_runs_unsupported_and_replays_the_rest(otel_runs, tmp_path):
    pytest.importorskip("pydantic_ai")
    junitparser = pytest.importorskip("junitparser")
    runs = [file_run(RECORDED / "pydantic_ai.recorded.jsonl")[0]]
    for i, docs in enumerate(_roots(otel_runs).values()):
        path = tmp_path / f"otel-{i}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        runs.append(file_run(path)[0])
    suite = Suite("mixed", tuple(runs))
    report = replay_suite(suite, "tests.otel_corpus.programs:support_pydantic")
    assert report.counts == {"match": 1, UNSUPPORTED: len(CASES)} and report.ok and report.groups() == []
    for result in report.results[1:]:
        assert result.description.startswith(f"otel_source: run {result.run_id} was recorded through OpenTelemetry")
    assert f"not replayed: {len(CASES)} run(s)" in report.describe()
    [junit] = list(junitparser.JUnitXml.fromstring(report.junit().decode()))
    assert (junit.tests, junit.failures, junit.skipped) == (1 + len(CASES), 0, len(CASES))

    with pytest.raises(pytest.skip.Exception, match="unsupported .otel_source"):
        SuiteCase(suite, runs[1], None, None).replay(_not_run)
