"""Replay tests through the store: each framework's program recorded to a real worker, replayed in one line.

Per framework (pydantic-ai, OpenAI Agents SDK, LangGraph; offline scripted models,
:mod:`tests.otel_corpus.programs`): the program is recorded live and published through the SDK to a
real worker on Kafka; then replayed from the store by ``agentlog_replay(run_id, program, settings=…)``:
the unchanged program is a ``match``, a changed tool ``diverged`` at its result, a model that now
refuses ``diverged_at_refusal``. Each replay is published as a replay run (``run.started.replayOf``),
and the worker's own verdict agrees with the one the test made locally. The LangGraph replay takes its
recorded results over HTTP from the worker (``ServedResults``), as a host without the log would.
A tool whose code changed since the recording gives ``match`` when its calls are answered from the
recording (``tools="recorded"``, the tool not run) and ``diverged`` when it runs (``tools="run"``).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentlog.replay.host import host_verdicts
from agentlog.replay.regression import record
from agentlog.replay.served import ServedResults
from agentlog.streams.admin import ensure_topics
from tests.integration.replay.helpers import committed
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.otel_corpus.programs import PROGRAMS
from tests.tools import free_port
from tests.unit.replay.test_replay_frameworks import CHANGED_NOW, FRAMEWORK_MODULE, _tool_result_index

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    from agentlog.streams.settings import load_settings

    home = tmp_path_factory.mktemp("replay-frameworks")
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}", home=home,
                             clickhouse_url=f"chdb://{home / 'ch'}", replication_factor=1, partitions=2,
                             web_port=free_port())
    asyncio.run(ensure_topics(settings))
    worker = WorkerProcess(settings, web=True).start()
    yield settings, worker
    worker.stop()


def _worker_verdict(settings, worker, replay_run_id):
    async def found():
        got = await host_verdicts(settings, replay_run_id)
        return got[-1] if got else None

    return asyncio.run(wait_until(found, what=f"the worker's verdict on {replay_run_id}", worker=worker))


def _recorded(name: str, stack, tag: str) -> tuple[str, list[dict], ServedResults | None]:
    """Record the framework's program through the store: its run id, its docs, and (LangGraph) the worker's results."""
    pytest.importorskip(FRAMEWORK_MODULE[name])
    settings, worker = stack
    run_id = f"{name}-{tag}{uuid.uuid4().hex[:8]}"
    docs = record(PROGRAMS[name](), run_id=run_id, settings=settings)
    asyncio.run(wait_until(lambda: committed(settings, run_id, len(docs)), what="the recording committed",
                           worker=worker))
    results = ServedResults(f"http://127.0.0.1:{settings.web_port}", run_id) if name == "langgraph" else None
    return run_id, docs, results


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_run_recorded_through_the_store_replays_as_a_test(name, stack, agentlog_replay):
    settings, worker = stack
    run_id, docs, results = _recorded(name, stack, "")

    # The one line: unchanged code replays its recording as a match.
    same = agentlog_replay(run_id, PROGRAMS[name](), settings=settings, results=results)
    changed = agentlog_replay(run_id, PROGRAMS[name](**CHANGED_NOW[name]), settings=settings, expect="diverged")
    refusing = agentlog_replay(run_id, PROGRAMS[name](refuse=True), settings=settings, mode="live",
                               expect="diverged_at_refusal")

    assert same.served == sum(d["type"] == "agent.invocation.started" for d in docs) and same.asked == 0
    d = changed.first_divergence
    assert (d.at_sequence, d.kind, d.path) == (_tool_result_index(docs), "output", "payload.result")
    assert (refusing.first_divergence.at_sequence, refusing.first_divergence.kind) == (2, "refusal")
    for result in (same, changed, refusing):
        assert result.published
        verdict = _worker_verdict(settings, worker, result.replay_run_id)
        assert verdict["verdict"] == result.verdict, verdict
        assert verdict["firstDivergence"] == (result.first_divergence.to_dict() if result.first_divergence
                                              else None)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_changed_tool_matches_when_served_from_the_store_and_diverges_when_run(name, stack, agentlog_replay):
    """The tool's code changed since the recording: served its recorded result, the replay matches and the tool
    does not run; run again, it diverges at its result. The worker judges both published replays alike. The
    LangGraph replay asks the worker's results endpoint for the recorded tool result (``ServedResults``)."""
    settings, worker = stack
    run_id, docs, results = _recorded(name, stack, "tools-")

    not_run: list[str] = []
    served = agentlog_replay(run_id, PROGRAMS[name](**CHANGED_NOW[name], tool_calls=not_run), settings=settings,
                             results=results, tools="recorded")
    ran: list[str] = []
    rerun = agentlog_replay(run_id, PROGRAMS[name](**CHANGED_NOW[name], tool_calls=ran), settings=settings,
                            tools="run", expect="diverged")

    assert (served.verdict, served.tools_served, served.tools_run, not_run) == ("match", 1, 0, [])
    assert (rerun.tools_served, rerun.tools_run, len(ran)) == (0, 1, 1)
    d = rerun.first_divergence
    assert (d.at_sequence, d.kind, d.path) == (_tool_result_index(docs), "output", "payload.result")
    assert d.actual == next(iter(CHANGED_NOW[name].values()))
    for result in (served, rerun):
        assert result.published
        verdict = _worker_verdict(settings, worker, result.replay_run_id)
        assert verdict["verdict"] == result.verdict, verdict
