"""Replay suites: recorded runs as a regression suite, replayed against a change, judged in one report.

A **suite** is a frozen selection of recorded runs: each run's id and the hash of the last event it had when the
suite was made (its head), so CI replays exactly the same set every time. Runs are chosen from the audit store by
query (:class:`Selection`: time window, node, status, run class, tag, bindings, a seeded sample) or named by id,
or given as exported files. Only root runs that are not themselves replays are selected: a program replays the
whole tree its root run started.

:func:`replay_suite` replays every run with one program (``module:function``, taking the recorder; it reads the
run's input as ``recorder.input``) in a pool of processes, each run as :func:`agentlog.replay.regression.replay_test`
would, and gathers a :class:`SuiteReport`: the verdict counts, the diverged runs grouped by their first divergence
(kind, event type, node, path) with one example each, the cache misses with their nearest recorded call, the
programs that raised with their tracebacks, and, outside ``recorded`` mode, the token, cost and duration deltas
against the recordings. A run that was erased, no longer exists, or no longer has the head the suite froze is
reported as such, never replayed; so is a run that cannot be a replay's source (``unsupported``: recorded through
OpenTelemetry, or stored metrics-only), with the reason.

The file format (JSON, ``format: agentlog.suite/1``)::

    {"format": "agentlog.suite/1", "name": "support-last-week", "createdAt": "2026-11-28T10:00:00Z",
     "selection": {"since": "...", "node": "planner", "sample": 200, "seed": 1},
     "runs": [{"runId": "run-1", "head": "<hash of its last event>", "events": 14},
              {"runId": "run-2", "file": "recorded/run-2.jsonl", "head": "sha256:<digest of the file>", "events": 9}]}
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import json
import multiprocessing
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from agentlog.replay.exported import read_jsonl
from agentlog.replay.mock import describe_miss
from agentlog.replay.recorder import Mode, ToolMode
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import ReplayError
from agentlog.streams.settings import Settings

__all__ = ["FORMAT", "Selection", "Suite", "SuiteReport", "SuiteRun", "execution_tags", "load_program", "point_in_time",
           "replay_suite", "select_runs"]

FORMAT = "agentlog.suite/1"

#: A run's status in a report beside the comparison's verdicts: the program raised; the run was erased; the
#: store holds no such run (or not up to its frozen head); the run's events up to the head differ from the suite's;
#: the run cannot be a replay's source (:func:`agentlog.replay.regression.refusal`: recorded through OpenTelemetry,
#: or stored metrics-only).
ERROR, ERASED, MISSING, CHANGED, UNSUPPORTED = "error", "erased", "missing", "changed", "unsupported"
#: Statuses of runs that were not replayed: reported, never counted as a failure of the change under test.
NOT_REPLAYED = (ERASED, MISSING, CHANGED, UNSUPPORTED)

#: Runs read from the store per query.
_CHUNK = 200


# --------------------------------------------------------------------------- the suite file


@dataclass(frozen=True)
class SuiteRun:
    """One run of a suite: its id, head and event count when frozen, and the file it came from (if any)."""

    run_id: str
    head: str
    events: int
    file: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runId": self.run_id, "head": self.head, "events": self.events}
        if self.file is not None:
            out["file"] = self.file
        return out


@dataclass(frozen=True)
class Suite:
    """A frozen selection of recorded runs (module docstring)."""

    name: str
    runs: tuple[SuiteRun, ...]
    selection: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "createdAt": self.created_at, "selection": dict(self.selection),
                "runs": [r.to_json() for r in self.runs]}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> Suite:
        """The suite in ``path``; a file that is not one is ``suite_invalid``, naming what is wrong."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ReplayError(f"cannot read suite {path}: {e.strerror or e}", code="suite_invalid") from e
        except ValueError as e:
            raise ReplayError(f"suite {path} is not JSON: {e}", code="suite_invalid") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReplayError(f"suite {path} is not an {FORMAT} file (its \"format\" is "
                              f"{data.get('format') if isinstance(data, dict) else None!r}); make one with "
                              "`agentlog suite create`", code="suite_invalid")
        runs = []
        for i, item in enumerate(data.get("runs") or []):
            ok = (isinstance(item, dict) and isinstance(item.get("runId"), str) and item["runId"]
                  and isinstance(item.get("head"), str) and isinstance(item.get("events"), int)
                  and isinstance(item.get("file", ""), str))
            if not ok:
                raise ReplayError(f"suite {path}: runs[{i}] must be {{runId, head, events[, file]}}, not {item!r}",
                                  code="suite_invalid")
            file = item.get("file")
            if file is not None and not Path(file).is_absolute():
                file = str(path.parent / file)
            runs.append(SuiteRun(item["runId"], item["head"], item["events"], file))
        if not runs:
            raise ReplayError(f"suite {path} names no run", code="suite_invalid")
        return cls(name=str(data.get("name") or path.stem), runs=tuple(runs),
                   selection=data.get("selection") or {}, created_at=str(data.get("createdAt") or ""))


def file_run(path: Path) -> tuple[SuiteRun, list[dict[str, Any]]]:
    """A suite run from an exported file (``agentlog export``): its root run, headed by a digest of its events."""
    docs = read_jsonl(path)
    if not docs:
        raise ReplayError(f"{path} holds no events", code="suite_invalid")
    root = str(docs[0].get("runId"))
    mine = [d for d in docs if d.get("runId") == root]
    return SuiteRun(root, _file_head(mine), len(mine), str(path)), mine


def _file_head(docs: Sequence[Mapping[str, Any]]) -> str:
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(jcs(doc))
    return f"sha256:{digest.hexdigest()}"


# --------------------------------------------------------------------------- selecting runs from the store


@dataclass(frozen=True)
class Selection:
    """Which recorded runs a suite holds: every filter given must hold; ``sample`` draws that many with ``seed``."""

    since: str | None = None
    until: str | None = None
    node: str | None = None
    status: str | None = None
    run_class: str | None = None
    tag: str | None = None
    bindings: Mapping[str, str] = field(default_factory=dict)
    run_ids: tuple[str, ...] = ()
    sample: int | None = None
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {"since": self.since, "until": self.until, "node": self.node, "status": self.status,
               "runClass": self.run_class, "tag": self.tag, "bindings": dict(self.bindings) or None,
               "runIds": list(self.run_ids) or None, "sample": self.sample,
               "seed": self.seed if self.sample is not None else None}
        return {k: v for k, v in out.items() if v is not None}


#: A span back from now: minutes, hours, days or weeks (``90m``, ``24h``, ``7d``, ``2w``).
_AGO = re.compile(r"(\d+)([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def point_in_time(text: str, *, option: str = "--since", now: datetime | None = None) -> str:
    """``text`` as the time a selection names: ISO 8601 as given (UTC if no offset), or a span back from ``now``
    (``7d``: a week ago) as the UTC time it names, so the suite file says which window it froze.

    Raises:
        ReplayError: neither (``bad_param``).
    """
    ago = _AGO.fullmatch(text.strip())
    if ago is not None:
        at = (now or datetime.now(UTC)) - timedelta(**{_UNITS[ago[2]]: int(ago[1])})
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ReplayError(f"{option} takes ISO 8601 (2026-11-21, 2026-11-21T10:00:00Z) or a span back from now "
                          f"(90m, 24h, 7d, 2w), not {text!r}", code="bad_param") from None
    return text


def _lit(value: Any) -> str:
    """``value`` as a ClickHouse literal (the read-only SQL endpoint binds no parameters)."""
    from clickhouse_connect.driver.binding import format_query_value

    return str(format_query_value(value))


def selection_sql(selection: Selection) -> str:
    """The read-only SQL that lists the selected runs: ``run_id, head, events, started`` (oldest first)."""
    started = ["type = 'run.started'",
               "JSONExtractRaw(payload, 'replayOf') = ''", "JSONExtractRaw(payload, 'parentRunId') = ''"]
    if selection.since:
        started.append(f"event_time >= parseDateTime64BestEffort({_lit(selection.since)}, 3, 'UTC')")
    if selection.until:
        started.append(f"event_time < parseDateTime64BestEffort({_lit(selection.until)}, 3, 'UTC')")
    if selection.run_class:
        started.append(f"JSONExtractString(payload, 'runClass') = {_lit(selection.run_class)}")
    if selection.tag:
        started.append(f"has(JSONExtract(payload, 'tags', 'Array(String)'), {_lit(selection.tag)})")
    for key, value in sorted(selection.bindings.items()):
        started.append(f"JSONExtractString(payload, 'bindings', {_lit(key)}) = {_lit(value)}")
    if selection.run_ids:
        started.append(f"run_id IN ({', '.join(_lit(r) for r in selection.run_ids)})")
    having = ""
    if selection.status:
        terminal = {"completed": "run.completed", "failed": "run.failed", "cancelled": "run.cancelled"}
        if selection.status not in terminal:
            raise ReplayError(f"--status must be one of {', '.join(terminal)}, not {selection.status!r}",
                              code="bad_param")
        having = f"HAVING countIf(type = {_lit(terminal[selection.status])}) > 0"
    node = f"AND run_id IN (SELECT run_id FROM events WHERE node_id = {_lit(selection.node)})" if selection.node \
        else ""
    return (f"SELECT run_id, argMax(hash, sequence) AS head, count() AS events, min(event_time) AS started\n"
            f"FROM events\n"
            f"WHERE run_id IN (SELECT run_id FROM events WHERE {' AND '.join(started)}) {node}\n"
            f"GROUP BY run_id {having}\n"
            f"ORDER BY started, run_id")


def select_runs(settings: Settings, selection: Selection) -> list[SuiteRun]:
    """The runs of the audit store that ``selection`` picks, frozen at their current heads."""
    rows = _sql(settings, selection_sql(selection))
    runs = [SuiteRun(str(r[0]), str(r[1]), int(r[2])) for r in rows]
    if selection.sample is not None and selection.sample < len(runs):
        keep = set(random.Random(selection.seed).sample(range(len(runs)), selection.sample))
        runs = [r for i, r in enumerate(runs) if i in keep]
    return runs


def _sql(settings: Settings, sql: str) -> list[list[Any]]:
    from agentlog.audit.server import answer_query

    rows: list[list[Any]] = answer_query(settings, {"sql": sql})["rows"]
    return rows


# --------------------------------------------------------------------------- reading the runs


@dataclass(frozen=True)
class Loaded:
    """A suite run read back: its events (opened), or why it cannot be replayed."""

    run: SuiteRun
    docs: tuple[dict[str, Any], ...] = ()
    status: str | None = None  # ERASED, MISSING or CHANGED; None when it can be replayed
    reason: str = ""


def load_runs(settings: Settings | None, runs: Sequence[SuiteRun]) -> Iterator[Loaded]:
    """Each run's events up to its frozen head: from its file, or from the audit store (opened with the keyring)."""
    stored = [r for r in runs if r.file is None]
    by_id: dict[str, Loaded] = {}
    if stored:
        if settings is None:
            raise ReplayError("the suite names runs in the store: give the store's settings (AGENTLOG_* "
                              "environment)", code="suite_invalid")
        for i in range(0, len(stored), _CHUNK):
            by_id.update((lo.run.run_id, lo) for lo in _load_stored(settings, stored[i:i + _CHUNK]))
    for run in runs:
        yield by_id[run.run_id] if run.file is None else _load_file(run)


def _load_file(run: SuiteRun) -> Loaded:
    assert run.file is not None
    try:
        now, docs = file_run(Path(run.file))
    except ReplayError as e:
        return Loaded(run, status=MISSING, reason=str(e))
    if now.head != run.head or now.run_id != run.run_id:
        return Loaded(run, status=CHANGED, reason=f"{run.file} no longer holds the run the suite froze "
                                                  f"({run.head[:19]}…, now {now.head[:19]}…)")
    return Loaded(run, tuple(docs))


def _load_stored(settings: Settings, runs: Sequence[SuiteRun]) -> list[Loaded]:
    from agentlog.streams.keyring import load_keyring

    ids = ", ".join(_lit(r.run_id) for r in runs)
    rows = _sql(settings, f"SELECT run_id, sequence, hash, doc FROM events WHERE run_id IN ({ids}) "
                          "ORDER BY run_id, sequence")
    events: dict[str, dict[int, tuple[str, str]]] = {}
    for run_id, sequence, head, doc in rows:
        events.setdefault(str(run_id), {}).setdefault(int(sequence), (str(head), str(doc)))
    keyring = asyncio.run(load_keyring(settings, [r.run_id for r in runs]))
    out = []
    for run in runs:
        found = events.get(run.run_id, {})
        upto = [found.get(seq) for seq in range(run.events)]
        if keyring.erased(run.run_id):
            out.append(Loaded(run, status=ERASED, reason=f"run {run.run_id} was erased (agentlog erase)"))
        elif not found or any(e is None for e in upto):
            have = len([e for e in upto if e is not None])
            out.append(Loaded(run, status=MISSING, reason=f"the audit store holds {have} of the run's {run.events} "
                                                          "frozen events" if found else
                              f"the audit store holds no event of run {run.run_id}"))
        elif upto[-1] is not None and upto[-1][0] != run.head:
            out.append(Loaded(run, status=CHANGED, reason=f"the run's event {run.events - 1} no longer has the head "
                                                          f"the suite froze ({run.head[:16]}…)"))
        else:
            docs = tuple(keyring.open(json.loads(e[1])) for e in upto if e is not None)
            out.append(Loaded(run, docs))
    return out


# --------------------------------------------------------------------------- replaying


def load_program(ref: str) -> Callable[..., Any]:
    """The program ``module:attribute`` (the current directory first on ``sys.path``, as pytest's rootdir)."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ReplayError(f"--program must be module:attribute, not {ref!r}", code="bad_program")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        target: Any = importlib.import_module(module)
        for name in attr.split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError) as e:
        raise ReplayError(f"cannot load program {ref!r}: {e}", code="bad_program") from e
    if not callable(target):
        raise ReplayError(f"program {ref!r} is not callable", code="bad_program")
    return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RunResult:
    """One run of a suite execution, as the report and the JUnit file need it."""

    run_id: str
    status: str  # a verdict (match, diverged, diverged_at_refusal, what-if), ERROR, or one of NOT_REPLAYED
    seconds: float = 0.0
    replay_run_id: str | None = None
    divergence: dict[str, Any] | None = None
    description: str = ""
    miss: dict[str, Any] | None = None
    error: str | None = None
    traceback: str | None = None
    deltas: dict[str, float] = field(default_factory=dict)
    docs: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # the replay run, for publishing

    def to_json(self) -> dict[str, Any]:
        out = {"runId": self.run_id, "status": self.status, "seconds": round(self.seconds, 3),
               "replayRunId": self.replay_run_id, "firstDivergence": self.divergence, "miss": self.miss,
               "error": self.error, "traceback": self.traceback, "deltas": self.deltas or None,
               "description": self.description or None}
        return {k: v for k, v in out.items() if v is not None}


def measures(docs: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """A run's tokens, cost and duration: ``provider.usage`` where the run has it, else the LLM calls' usage."""
    docs = list(docs)
    usage = [d["payload"] for d in docs if d.get("type") == "provider.usage" and isinstance(d.get("payload"), dict)]
    if not usage:
        usage = [d["payload"]["usage"] for d in docs if d.get("type") == "agent.invocation.completed"
                 and isinstance(d.get("payload"), dict) and isinstance(d["payload"].get("usage"), dict)]
    out = {"inputTokens": float(sum(u.get("inputTokens") or 0 for u in usage)),
           "outputTokens": float(sum(u.get("outputTokens") or 0 for u in usage)),
           "costCents": float(sum(u.get("costCents") or 0 for u in usage))}
    stamps = [_ms(d.get("timestamp")) for d in docs]
    known = [s for s in stamps if s is not None]
    out["durationMs"] = float(max(known) - min(known)) if known else 0.0
    return out


def _ms(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return None


_PROGRAMS: dict[str, Callable[..., Any]] = {}


def _replay_one(program: Callable[..., Any] | str, loaded: Loaded, mode: Mode, tools: ToolMode,
                bindings: Mapping[str, Any] | None, tags: Sequence[str] = ()) -> RunResult:
    """Replay one run (in a pool process, the program named by its ref, or in this one); never raises for what the
    program does."""
    from agentlog.replay.regression import refusal, replay_recorded

    run = loaded.run
    if loaded.status is not None:
        return RunResult(run.run_id, loaded.status, description=loaded.reason)
    refused = refusal(run.run_id, loaded.docs)
    if refused is not None:
        return RunResult(run.run_id, UNSUPPORTED, description=f"{refused.code}: {refused}")
    if isinstance(program, str):
        if program not in _PROGRAMS:
            _PROGRAMS[program] = load_program(program)
        program = _PROGRAMS[program]
    started = time.monotonic()
    result = replay_recorded(run.run_id, list(loaded.docs), program, mode=mode, tools=tools, bindings=bindings,
                             publish=False, tags=tags)
    d = result.first_divergence
    deltas: dict[str, float] = {}
    if mode != "recorded":
        before, after = measures(loaded.docs), measures(result.docs)
        deltas = {k: round(after[k] - before[k], 4) for k in before}
    return RunResult(
        run.run_id, ERROR if result.error is not None else result.verdict, time.monotonic() - started,
        replay_run_id=result.replay_run_id, divergence=None if d is None else {
            "atSequence": d.at_sequence, "kind": d.kind, "eventType": d.event_type, "nodeId": d.node_id,
            "path": d.path, "expected": d.expected, "actual": d.actual, "detail": d.detail or None},
        description=result.describe(), miss=result.miss, error=result.error, traceback=result.traceback,
        deltas=deltas, docs=result.docs)


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class SuiteReport:
    """A suite execution: every run's result, and the summary views of :func:`replay_suite`."""

    suite: str
    program: str
    mode: str
    tools: str
    expect: str
    results: tuple[RunResult, ...]
    seconds: float
    interrupted: bool = False
    total: int = 0
    execution: str = ""
    code_version: str = ""
    published: int = 0

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return dict(sorted(out.items()))

    @property
    def failed(self) -> list[RunResult]:
        """Runs replayed whose status is not the expected verdict."""
        return [r for r in self.results if r.status not in NOT_REPLAYED and r.status != self.expect]

    def groups(self) -> list[dict[str, Any]]:
        """Diverged runs grouped by first divergence (kind, event type, node, path), biggest group first."""
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in self.failed:
            if r.status == ERROR:
                key: tuple[Any, ...] = (ERROR, (r.error or "").split(":", 1)[0], None, None)
            elif r.divergence is None:
                key = (r.status, None, None, None)
            else:
                d = r.divergence
                key = (d.get("kind"), d.get("eventType"), d.get("nodeId"), d.get("path"))
            group = groups.setdefault(key, {"kind": key[0], "eventType": key[1], "nodeId": key[2], "path": key[3],
                                            "runs": [], "example": r.to_json()})
            group["runs"].append(r.run_id)
        return sorted(groups.values(), key=lambda g: (-len(g["runs"]), str(g["kind"]), str(g["path"])))

    def misses(self) -> list[dict[str, Any]]:
        return [{"runId": r.run_id, "miss": r.miss, "description": describe_miss(r.miss)}
                for r in self.results if r.miss is not None]

    def deltas(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.results:
            for k, v in r.deltas.items():
                out[k] = round(out.get(k, 0.0) + v, 4)
        return out

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "program": self.program, "mode": self.mode, "tools": self.tools,
                "execution": self.execution, "codeVersion": self.code_version, "published": self.published,
                "expect": self.expect, "runs": self.total or len(self.results), "ran": len(self.results),
                "interrupted": self.interrupted, "seconds": round(self.seconds, 3), "counts": self.counts,
                "ok": self.ok, "groups": self.groups(), "misses": self.misses(), "deltas": self.deltas(),
                "notReplayed": [r.to_json() for r in self.results if r.status in NOT_REPLAYED],
                "results": [r.to_json() for r in self.results]}

    def describe(self) -> str:
        """The report for people: counts, then each group with one example, misses, deltas."""
        lines = [f"suite {self.suite}: {len(self.results)} of {self.total or len(self.results)} run(s) replayed with "
                 f"{self.program} ({self.mode}, tools {self.tools}) in {self.seconds:.1f} s"
                 + (" — interrupted" if self.interrupted else ""),
                 "  " + ", ".join(f"{status} {n}" for status, n in self.counts.items())]
        for group in self.groups():
            where = " ".join(str(x) for x in (group["eventType"], group["nodeId"] and f"node {group['nodeId']}",
                                              group["path"]) if x)
            lines.append(f"\n{len(group['runs'])} run(s): {group['kind']}" + (f" at {where}" if where else ""))
            lines.append("  " + ", ".join(group["runs"][:10]) + (" …" if len(group["runs"]) > 10 else ""))
            example = group["example"]
            text = example.get("traceback") or example.get("description") or ""
            lines.extend("  | " + line for line in text.rstrip().splitlines()[-12:])
        skipped = [r for r in self.results if r.status in NOT_REPLAYED]
        if skipped:
            lines.append(f"\nnot replayed: {len(skipped)} run(s)")
            lines.extend(f"  {r.run_id}: {r.status} ({r.description})" for r in skipped[:20])
        if self.deltas():
            lines.append("\nagainst the recordings: " + ", ".join(f"{k} {v:+g}" for k, v in self.deltas().items()))
        return "\n".join(lines)

    def junit(self) -> bytes:
        """JUnit XML: one ``testcase`` per run (failure: another verdict; error: the program raised; skipped: not
        replayed), as CI servers read it."""
        cases = ElementTree.Element("testsuite", name=self.suite, tests=str(len(self.results)),
                                    failures=str(sum(r.status not in (ERROR, *NOT_REPLAYED) for r in self.failed)),
                                    errors=str(sum(r.status == ERROR for r in self.results)),
                                    skipped=str(sum(r.status in NOT_REPLAYED for r in self.results)),
                                    time=f"{self.seconds:.3f}")
        for r in self.results:
            case = ElementTree.SubElement(cases, "testcase", classname=f"agentlog.suite.{self.suite}",
                                          name=r.run_id, time=f"{r.seconds:.3f}")
            if r.status == ERROR:
                error = ElementTree.SubElement(case, "error", message=(r.error or "")[:500], type="error")
                error.text = r.traceback or r.description
            elif r.status in NOT_REPLAYED:
                ElementTree.SubElement(case, "skipped", message=f"{r.status}: {r.description}"[:500])
            elif r.status != self.expect:
                failure = ElementTree.SubElement(case, "failure", message=f"expected {self.expect}, got {r.status}",
                                                 type=r.status)
                failure.text = r.description
        root = ElementTree.Element("testsuites", name=self.suite, tests=cases.get("tests", "0"),
                                   failures=cases.get("failures", "0"), errors=cases.get("errors", "0"),
                                   skipped=cases.get("skipped", "0"), time=cases.get("time", "0"))
        root.append(cases)
        xml: bytes = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
        return xml


def execution_tags(suite: str, execution: str, code_version: str) -> list[str]:
    """The ``run.started`` tags of a suite execution's replay runs: what its history is queried by."""
    return [f"{SUITE_TAG}{suite}", f"{EXECUTION_TAG}{execution}"] + ([f"{CODE_TAG}{code_version}"] if code_version
                                                                      else [])


#: Tag prefixes of a suite execution's replay runs (``run.started`` ``payload.tags``, metadata).
SUITE_TAG, EXECUTION_TAG, CODE_TAG = "suite:", "suite-execution:", "code:"


def replay_suite(suite: Suite, program: str | Callable[..., Any], *, settings: Settings | None = None,
                 mode: Mode = "recorded", tools: ToolMode = "run", bindings: Mapping[str, Any] | None = None,
                 jobs: int = 1, expect: str = "match", publish: Settings | None = None, code_version: str = "",
                 progress: Callable[[RunResult, int, int], None] | None = None) -> SuiteReport:
    """Replay every run of ``suite`` with ``program`` (a callable, or ``module:attribute``) in ``jobs`` processes.

    A named program is loaded here first, so one that cannot be loaded is an error before any run
    (``bad_program``); pool processes import it by its name (a callable by its module and name). Runs are read
    from their files or the audit store; a KeyboardInterrupt stops the pool and returns what ran (``interrupted``).
    With ``publish`` the replay runs are published there once all ran, tagged with the suite, this execution and
    ``code_version`` (:func:`execution_tags`): a worker judges each against its source (the verdicts the console's
    suite pages and the ``suite-executions`` query read), and the audit store keeps the execution as history.
    """
    from agentlog.streams.publisher import uuid7

    execution = uuid7()
    tags = execution_tags(suite.name, execution, code_version) if publish is not None else []
    if isinstance(program, str):
        program_ref, program = program, load_program(program)
    else:
        program_ref = f"{program.__module__}:{program.__qualname__}"
    started = time.monotonic()
    results: list[RunResult] = []
    total = len(suite.runs)
    interrupted = False

    def done(result: RunResult) -> None:
        results.append(result)
        if progress is not None:
            progress(result, len(results), total)

    loaded = load_runs(settings, suite.runs)
    try:
        if jobs <= 1:
            for item in loaded:
                done(_replay_one(program, item, mode, tools, bindings, tags))
        else:
            with concurrent.futures.ProcessPoolExecutor(max_workers=jobs,
                                                        mp_context=multiprocessing.get_context("spawn")) as pool:
                pending = {pool.submit(_replay_one, program_ref, item, mode, tools, bindings, tags)
                           for item in loaded}
                try:
                    for future in concurrent.futures.as_completed(pending):
                        done(future.result())
                except KeyboardInterrupt:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    except KeyboardInterrupt:
        interrupted = True
    order = {r.run_id: i for i, r in enumerate(suite.runs)}
    results.sort(key=lambda r: order.get(r.run_id, len(order)))
    published = 0
    if publish is not None:
        published = _publish(publish, [d for r in results for d in r.docs])
    return SuiteReport(suite=suite.name, program=program_ref, mode=mode, tools=tools, expect=expect,
                       results=tuple(results), seconds=time.monotonic() - started, interrupted=interrupted,
                       total=total, execution=execution if publish is not None else "", code_version=code_version,
                       published=published)


def _publish(settings: Settings, docs: list[dict[str, Any]]) -> int:
    """Publish the replay runs through the SDK; the events accepted."""
    from agentlog.streams.publisher import publish_docs

    summary = asyncio.run(publish_docs(settings, docs))
    if summary.rejected:
        first = summary.rejected[0]
        raise ReplayError(f"{len(summary.rejected)} event(s) of the replay runs were not published (first: index "
                          f"{first.index}, {first.code}: {first.detail})", code="publish_failed")
    return int(summary.accepted)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
