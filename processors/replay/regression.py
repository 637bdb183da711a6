"""Replay tests: run the host's agent code against a recorded run and fail with the first divergence.

A recorded run is a regression test. :func:`replay_test` reads it (from the store, or from a file
``agentlog export`` wrote), runs the program with a :class:`~agentlog.replay.recorder.Recorder`
whose framework adapters answer each model call with the result recorded for its cache key
(and, with ``tools="recorded"``, each tool call with the result recorded for it),
publishes the re-execution as a replay run (``run.started.replayOf``) when it has settings, and
judges it with the comparison engine the worker runs (:func:`agentlog.replay.compare.compare_runs`),
here and now: a worker that is running judges the published run too, and must agree.

A program is a callable taking the recorder (``program(recorder)``); it builds its agents with the
adapters of :mod:`agentlog.replay.frameworks` around the models it would use, and runs them on
``recorder.input``: what the recorded run was asked (``run.started`` ``payload.input``, else its first
user message: :func:`agentlog.replay.recorder.recorded_input`), so one program replays any run of a
suite. The same program records the run in the first place (:func:`record`, mode ``live``).

The outcome is data (:class:`ReplayTestResult`); :meth:`ReplayTestResult.check` turns a verdict other
than the expected one into :class:`ReplayTestFailed`, whose message is the first divergence.

Some recordings cannot be a replay's source, and are refused before the program runs (:func:`refusal`): a run
stored metrics-only holds no content (``metrics_only``), and a run the worker mapped from OpenTelemetry spans
(:func:`otel_mapped`) is not what the adapters record (``otel_source``): its hand-offs are child runs where the
adapters record the agent handed to as a node of the same run, it has the spans' own events (``node.*``,
``provider.usage``, the hand-off's ``runOrchestrator.decided`` and chain events) where the adapters record the
hand-off as a tool call, and its model requests are keyed as the instrumentation exported them (tool-call ids,
tool ``strict`` flags, provider names), so that hardly any call of a replay finds its recorded result. Compared,
such a pair would diverge at once for no change of the program's; the refusal says so and how to get a recording
that replays.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlog.core.redaction import metrics_only_error, stored_metrics_only
from agentlog.core.result_cache import ReplayCacheMiss, ResultCache
from agentlog.replay.compare import ComparisonResult, compare_runs
from agentlog.replay.divergence import Divergence
from agentlog.replay.exported import read_jsonl
from agentlog.replay.mock import MockReplaySession, describe_miss
from agentlog.replay.recorder import Mode, RecordedResults, Recorder, ToolMode, delegating_tools, recorded_input
from agentlog.schemas.content import REDACTIONS
from agentlog.schemas.errors import ReplayError
from agentlog.streams.publisher import publish_docs, uuid7
from agentlog.streams.reader import read_run
from agentlog.streams.redaction import load_redactor
from agentlog.streams.replay_client import replay_of
from agentlog.streams.settings import Settings, load_settings

__all__ = ["Program", "ReplayTestFailed", "ReplayTestResult", "load_recorded", "otel_mapped", "record", "refusal",
           "replay_recorded", "replay_test"]

#: The host's agent code: given the recorder, build the agents with the replay adapters and run them.
Program = Callable[[Recorder], Any]


class ReplayTestFailed(ReplayError, AssertionError):
    """A replay test's verdict is not the one expected; ``result`` holds the comparison.

    Read the first divergence in the message: the index, what the recording had and what the
    program did now. If the change is intended, re-record the run (``agentlog replay-test --record``
    or :func:`record`) and check the new recording in.
    """

    code = "replay_test_failed"

    def __init__(self, message: str, *, result: ReplayTestResult) -> None:
        super().__init__(message, code=result.comparison.error_code or self.code)
        self.result = result


@dataclass(frozen=True, kw_only=True)
class ReplayTestResult:
    """One replay test, as data: the verdict and first divergence (:attr:`comparison`), the replay's events,
    and what the program met on the way (``miss``: the diagnosis of a call the recording cannot answer;
    ``error``: what the program raised, ``traceback`` where). ``served``/``asked``: model calls answered
    recorded / by the model; ``tools_served``/``tools_run``: tool calls answered recorded / by running the tool."""

    source_run_id: str
    replay_run_id: str
    mode: Mode
    tools: ToolMode
    comparison: ComparisonResult
    docs: tuple[dict[str, Any], ...]
    served: int
    asked: int
    tools_served: int = 0
    tools_run: int = 0
    miss: dict[str, Any] | None = None
    error: str | None = None
    traceback: str | None = None
    published: bool = False

    @property
    def verdict(self) -> str:
        return self.comparison.verdict

    @property
    def first_divergence(self) -> Divergence | None:
        return self.comparison.first_divergence

    def describe(self) -> str:
        """The report a failing test prints: verdict, first divergence, and why the program stopped."""
        lines = [f"replay of {self.source_run_id} as {self.replay_run_id} ({self.mode}, tools {self.tools}): "
                 f"{self.verdict}"
                 + (f" [{self.comparison.error_code}]" if self.comparison.error_code else "")]
        d = self.first_divergence
        if d is not None:
            where = f"{d.event_type or '-'}" + (f", node {d.node_id}" if d.node_id else "")
            lines.append(f"first divergence at index {d.at_sequence}: {d.kind} ({where})")
            if d.path:
                lines.append(f"  path:     {d.path}")
            lines.append(f"  expected: {_fmt(d.expected)}")
            lines.append(f"  actual:   {_fmt(d.actual)}")
            if d.detail:
                lines.append(f"  note:     {d.detail}")
        for key, diff in self.comparison.binding_diff.items():
            lines.append(f"  what-if: {key} {_fmt(diff.get('expected'))} → {_fmt(diff.get('actual'))}")
        if self.miss is not None:
            lines.append(f"then a call the recording cannot answer: {describe_miss(self.miss)}")
        elif self.error is not None:
            lines.append(f"the program raised: {self.error}")
        lines.append(f"calls answered from the recording: {self.served}, by the model: {self.asked}")
        lines.append(f"tool calls answered from the recording: {self.tools_served}, by running the tool: "
                     f"{self.tools_run}")
        return "\n".join(lines)

    def check(self, expect: str = "match") -> ReplayTestResult:
        """This result, if its verdict is ``expect``.

        Raises:
            ReplayTestFailed: another verdict (the message is :meth:`describe`).
        """
        if self.verdict != expect:
            raise ReplayTestFailed(f"expected {expect}, got {self.describe()}", result=self)
        return self


def _fmt(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 400 else text[:400] + "…"


def load_recorded(source: str | Path, *, settings: Settings | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(run id, events) of a recorded run: a JSONL export (a path) or a run in the store (a run id).

    Raises:
        ReplayError: the file cannot be read, or the store holds no events of the run.
    """
    path = Path(source)
    if isinstance(source, Path) or path.suffix in (".jsonl", ".json") or path.exists():
        docs = read_jsonl(path)
        if not docs:
            raise ReplayError(f"{path} holds no events; nothing to replay")
        root = str(docs[0].get("runId"))
        return root, [d for d in docs if d.get("runId") == root]
    run_id = str(source)
    committed = asyncio.run(read_run(settings or load_settings(), run_id, refuse_erased=True))
    if not committed:
        raise ReplayError(f"run {run_id} has no committed events; check the run id and the topic prefix "
                          "(AGENTLOG_TOPIC_PREFIX), or give an exported file")
    return run_id, [c["doc"] for c in committed]


def otel_mapped(docs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the run was mapped from OpenTelemetry spans by the worker (``agentlog.core.otel``): the mapper marks
    every ``run.started`` it makes, and what it keeps of a span it does not map, ``payload.source: "opentelemetry"``.
    """
    return any(isinstance(payload := doc.get("payload"), Mapping) and payload.get("source") == "opentelemetry"
               for doc in docs)


def refusal(source_id: str, docs: Sequence[Mapping[str, Any]]) -> ReplayError | None:
    """Why the recorded run ``source_id`` cannot be a replay's source (module docstring), or None when it can."""
    if stored_metrics_only(docs):
        return metrics_only_error(source_id)
    if otel_mapped(docs):
        return ReplayError(f"run {source_id} was recorded through OpenTelemetry, not through the replay adapters: its "
                           "run tree, node names and cache keys are its spans', which a replay through the adapters "
                           "does not reproduce; record the run with the adapters (agentlog.record(program, ...) or "
                           "agentlog replay-test --record) and replay that recording", code="otel_source")
    return None


def _as_stored(original: Sequence[Mapping[str, Any]], docs: list[dict[str, Any]],
               settings: Settings | None) -> list[dict[str, Any]]:
    """The replay's events as the recording's were stored: redacted by the deployment's policy when the recording was.

    Both sides are then alike, as they are when the worker judges a published replay (the sequencer redacts it
    too): a redacted run replayed by an unchanged program is a ``match``. A recording that shows no redaction (no
    ``$redactions`` in any event: from before redaction, or a policy that found nothing) is compared as it is.
    """
    if not _shows_redaction(original):
        return docs
    redactor = load_redactor(settings or load_settings())
    return [redactor.stored(doc) for doc in docs]


def _shows_redaction(original: Sequence[Mapping[str, Any]]) -> bool:
    return any(isinstance(d.get("payload"), Mapping) and REDACTIONS in d["payload"] for d in original)


def _request_redaction(original: Sequence[Mapping[str, Any]],
                       settings: Settings | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """How the deployment redacts a model request, for a recording that shows redaction (None otherwise): a call
    whose input held a secret was keyed by the host over the original text, and is asked the redacted text."""
    return load_redactor(settings or load_settings()).request if _shows_redaction(original) else None


def _bindings(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    for doc in docs:
        if doc.get("type") == "run.started" and isinstance(doc.get("payload"), Mapping):
            return dict(doc["payload"].get("bindings") or {})
    return {}


def _run(program: Program, recorder: Recorder) -> None:
    out = program(recorder)
    if inspect.isawaitable(out):
        async def wait() -> None:
            await out

        asyncio.run(wait())


def _publish(settings: Settings, docs: Sequence[dict[str, Any]]) -> None:
    summary = asyncio.run(publish_docs(settings, list(docs)))
    if summary.rejected:
        first = summary.rejected[0]
        raise ReplayError(f"{len(summary.rejected)} event(s) of the run were not published "
                          f"(first: index {first.index}, {first.code}: {first.detail})")


def record(program: Program, *, run_id: str | None = None, bindings: Mapping[str, Any] | None = None,
           settings: Settings | None = None, input: Any = None) -> list[dict[str, Any]]:
    """Run ``program`` live (every call asks the model) and return its run's events; with ``settings``,
    publish them through the SDK, as a host records a run. ``input`` is what the program is asked
    (``recorder.input``, recorded as ``run.started`` ``payload.input``). What the program raises is re-raised."""
    recorder = Recorder(run_id or f"run-{uuid7()}", mode="live", bindings=bindings, input=input)
    try:
        _run(program, recorder)
    except BaseException as e:
        recorder.finish(e)
        if settings is not None:
            _publish(settings, recorder.docs)
        raise
    recorder.finish()
    if settings is not None:
        _publish(settings, recorder.docs)
    return recorder.docs


def replay_test(
    source: str | Path,
    program: Program,
    *,
    expect: str | None = "match",
    mode: Mode = "recorded",
    tools: ToolMode = "run",
    settings: Settings | None = None,
    results: RecordedResults | None = None,
    bindings: Mapping[str, Any] | None = None,
    publish: bool | None = None,
    run_id: str | None = None,
    strict: bool = False,
) -> ReplayTestResult:
    """Replay recorded run ``source`` (a run id, or a JSONL export) with ``program``; check the verdict.

    ``mode``: ``recorded`` answers every model call from the recording (a call it cannot answer
    ends the run, and the test reports it after the first divergence); ``live`` asks the models
    again; ``what-if`` answers the calls whose key is unchanged from the recording and asks the
    model for the others. ``tools``: ``run`` executes the program's tools again, so a tool whose code
    changed shows as a divergence at its result; ``recorded`` answers each tool call with the result
    recorded for the same tool and arguments at the same node, in order, and does not execute the tool
    (for tools with side effects, or that reach services the test cannot); a tool call the recording
    cannot answer ends the run as a model call does; a tool that delegated to another agent in the recording runs
    all the same (:func:`agentlog.replay.recorder.delegating_tools`), so that agent runs again. Tools are answered
    through the adapters' tool wrappers (:mod:`agentlog.replay.frameworks`); a tool the program does not wrap
    always runs.
    ``bindings`` are laid over the source's (other versions make the verdict
    ``what-if``). ``results``: where recorded results come from, when not from the recording itself
    (a worker's endpoint: :class:`~agentlog.replay.served.ServedResults`). The replay run is
    published when ``publish`` says so, by default when ``settings`` are given. ``expect=None``
    returns any verdict.

    Raises:
        ReplayTestFailed: the verdict is not ``expect``.
        ReplayError: the recording cannot be read or cannot be a replay's source (:func:`refusal`), or the replay
            cannot be published.
    """
    source_id, original = load_recorded(source, settings=settings)
    result = replay_recorded(source_id, original, program, mode=mode, tools=tools, settings=settings,
                             results=results, bindings=bindings, publish=publish, run_id=run_id, strict=strict)
    return result.check(expect) if expect is not None else result


def replay_recorded(
    source_id: str,
    original: Sequence[dict[str, Any]],
    program: Program,
    *,
    mode: Mode = "recorded",
    tools: ToolMode = "run",
    settings: Settings | None = None,
    results: RecordedResults | None = None,
    bindings: Mapping[str, Any] | None = None,
    publish: bool | None = None,
    run_id: str | None = None,
    strict: bool = False,
    tags: Sequence[str] = (),
) -> ReplayTestResult:
    """:func:`replay_test` of a recording already read (``original``: the run's events, opened), any verdict;
    ``tags`` go into the replay's ``run.started`` (a suite names its execution there).

    Raises:
        ReplayError: the recording cannot be a replay's source (:func:`refusal`: ``metrics_only``,
            ``otel_source``); the program is not run.
    """
    original = list(original)
    refused = refusal(source_id, original)
    if refused is not None:
        raise refused
    replay_id = run_id or f"{source_id}.replay-{uuid7()[-12:]}"
    session = results or MockReplaySession(ResultCache.from_events(original), source_id,
                                           _request_redaction(original, settings))
    asked, recorded = recorded_input(original)
    recorder = Recorder(replay_id, mode=mode, tools=tools, results=session,
                        bindings={**_bindings(original), **(bindings or {})},
                        replay_of=replay_of(source_id, 0, "live" if mode == "live" else "mock"),
                        input=asked if recorded else None,
                        delegating=delegating_tools(original) if tools == "recorded" else (), tags=tags)
    recorder.input = asked  # a run that recorded no input was asked its first user message
    miss: dict[str, Any] | None = None
    error: str | None = None
    trace: str | None = None
    try:
        _run(program, recorder)
    except ReplayCacheMiss as e:
        miss = e.diagnosis
        recorder.finish(e)
    except Exception as e:  # the program's own failure is part of what the replay did
        if recorder.missed is not None:  # a miss the framework wrapped in its own error
            miss = recorder.missed.diagnosis
            recorder.finish(recorder.missed)
        else:
            error = f"{type(e).__name__}: {e}"
            trace = traceback.format_exc()
            recorder.finish(e)
    else:
        recorder.finish()
        if recorder.missed is not None:  # a miss the framework turned into a result the program went on with
            miss = recorder.missed.diagnosis
    published = settings is not None if publish is None else publish
    if published:
        _publish(settings or load_settings(), recorder.docs)
    result = ReplayTestResult(
        source_run_id=source_id, replay_run_id=replay_id, mode=mode, tools=tools,
        comparison=compare_runs(original, _as_stored(original, recorder.docs, settings), strict=strict),
        docs=tuple(recorder.docs),
        served=recorder.served, asked=recorder.asked, tools_served=recorder.tools_served,
        tools_run=recorder.tools_run, miss=miss, error=error, traceback=trace, published=published)
    return result
