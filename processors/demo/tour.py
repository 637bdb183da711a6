"""The guided tour (``agentlog demo``): the whole store working on one realistic multi-agent run.

Everything here goes through the public paths a user would take — the local stack from
``infra``, the worker as a real background process, events published with the SDK, the
replay verdicts the worker writes, the audit queries through the worker's HTTP endpoint —
so a demo that passes is evidence the product works, not a simulation of it. Nothing is
faked: a step whose machinery is too slow is reported as a fallback, with the reason.

The story: a planner asks an LLM for a plan and dispatches two workers. worker-1 is
dispatched, searches incidents with a tool, summarises with an LLM, completes and its
findings are harvested into the parent; worker-2's dispatch fails. The planner's request to
put customers' card data into the status update is refused by the model; the run completes.
Then the run is re-derived from a mid-run offset (match), and re-executed twice as new runs
that declare ``replayOf``: once with a changed tool output (``replay.diverged`` at the tool
result) and once where the model refuses the summary it answered before
(``replay.divergedAtRefusal``, error ``replay_diverged_at_refusal``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentlog.audit.migrations import migrate
from agentlog.audit.server import query_via_worker
from agentlog.audit.store import read_owner
from agentlog.core.checkpoint import public_key_path
from agentlog.core.sealing import seal_event
from agentlog.infra.kafka import local
from agentlog.replay import compare_runs, replay_run
from agentlog.replay.host import host_verdicts
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.schemas.errors import AgentlogError, InfraError
from agentlog.streams.admin import ensure_topics_sync
from agentlog.streams.keyring import load_keyring
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_topic
from agentlog.streams.settings import Settings, settings_env

__all__ = [
    "DemoSummary",
    "WorkerHandle",
    "console_url",
    "demo_worker",
    "ensure_stack",
    "ensure_worker",
    "play_run",
    "run_demo",
    "stop_demo",
    "stop_worker",
]

BINDINGS = {"engineVersion": "agentlog-demo-1", "modeVersion": "planner-v3", "configVersion": "c12",
            "policyVersion": "p4"}
MODEL = {"provider": "anthropic", "model": "claude-sonnet-4"}
WORKER_READY_S = 120.0
STEP_WAIT_S = 90.0
VERDICT_WAIT_S = 60.0

Say = Callable[[str], None]


class DemoError(AgentlogError):
    """A demo step did not finish in its bounded wait; the message names the log to read."""

    code = "demo_failed"


@dataclass
class DemoSummary:
    """What the demo established; ``to_dict`` is the ``--json`` output."""

    run_id: str = ""
    events: int = 0
    head_hash: str = ""
    head_verified: bool = False
    transitions: list[dict[str, Any]] = field(default_factory=list)
    violations: int = 0
    offset_replay: dict[str, Any] = field(default_factory=dict)
    replays: list[dict[str, Any]] = field(default_factory=list)
    queries: dict[str, dict[str, Any]] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)
    broker: dict[str, Any] = field(default_factory=dict)
    migrations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        """The tour established what it promises: the head hash recomputed, the offset replay matched,
        and the two re-executions diverged the way they were made to (tool output, then refusal)."""
        return (self.head_verified and self.offset_replay.get("status") == "match"
                and [r["verdict"] for r in self.replays] == ["diverged", "diverged_at_refusal"])


# ---------------------------------------------------------------------------------------------
# the stack: broker, topics, migrations


def _reachable(bootstrap: str) -> bool:
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=2.0).close()
        return True
    except (OSError, ValueError):
        return False


def ensure_stack(settings: Settings, say: Say) -> dict[str, Any]:
    """Make sure a broker answers at ``settings.kafka_bootstrap`` (starting the local one if needed)."""
    nodes = local.status(settings)
    if nodes and all(n.alive for n in nodes):
        say(f"Kafka already running at {local.bootstrap_servers(nodes)} (local stack in {local.kafka_home(settings)})")
        return {"bootstrap": local.bootstrap_servers(nodes), "started": False, "local": True}
    if not nodes and _reachable(settings.kafka_bootstrap):
        say(f"Kafka answers at {settings.kafka_bootstrap} (not managed by this home; using it as is)")
        return {"bootstrap": settings.kafka_bootstrap, "started": False, "local": False}
    say("starting the local Apache Kafka (KRaft) — the first run fetches the jars with Maven…")
    nodes = local.start(settings)
    return {"bootstrap": local.bootstrap_servers(nodes), "started": any(n.started for n in nodes), "local": True}


def _migrate(settings: Settings) -> list[str]:
    """Apply the ClickHouse migrations without keeping the store open in this process.

    chdb lets one process hold a directory, and the worker is about to be that process, so
    the embedded store is migrated in a short-lived child; a server is migrated directly.
    """
    if settings.clickhouse_url and not settings.clickhouse_url.startswith("chdb:"):
        return migrate(settings)
    if read_owner(settings):
        return []  # a live worker owns it and migrated it when it started
    code = ("import json; from agentlog.streams.settings import load_settings; "
            "from agentlog.audit.migrations import migrate; print(json.dumps(migrate(load_settings())))")
    env = {**os.environ, **settings_env(settings)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()]
        raise InfraError(f"ClickHouse migrations failed: {last[-1] if last else 'no output'}", code="store_error")
    applied: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])  # the child prints migrate()'s list
    return applied


# ---------------------------------------------------------------------------------------------
# the worker process


@dataclass(frozen=True)
class WorkerHandle:
    pid: int
    url: str
    log: str
    reused: bool


def _pid_file(settings: Settings) -> Path:
    return Path(settings.home) / "demo-worker.json"


def _is_our_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z" and b"agentlog" in cmdline and b"worker" in cmdline


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as resp:
            status: int = resp.status
            return status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_tail(path: Path, n: int = 8) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-600:]


def demo_worker(settings: Settings) -> WorkerHandle | None:
    """The demo worker of this home and prefix, if its process is alive."""
    try:
        record = json.loads(_pid_file(settings).read_text())
    except (OSError, ValueError):
        return None
    if (record.get("prefix") == settings.topic_prefix and isinstance(record.get("pid"), int)
            and _is_our_worker(record["pid"])):
        return WorkerHandle(record["pid"], record["url"], record["log"], reused=True)
    return None


def ensure_worker(settings: Settings, say: Say, *, ready_s: float = WORKER_READY_S) -> WorkerHandle:
    """Reuse the demo worker of this home, or start ``python -m agentlog worker --web`` in the background."""
    running = demo_worker(settings)
    if running is not None and _health(running.url):
        say(f"worker already running (pid {running.pid}, {running.url})")
        return running
    url = f"http://127.0.0.1:{settings.web_port}"
    if _health(url):
        raise InfraError(f"port {settings.web_port} already serves another worker; stop it or set AGENTLOG_WEB_PORT",
                         code="port_in_use")
    home = Path(settings.home)
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "demo-worker.log"
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentlog", "worker", "--role", "all", "--web",
             "--web-port", str(settings.web_port)],
            env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the demo command, like `agentlog infra up`'s broker
        )
    handle = WorkerHandle(proc.pid, url, str(log_path), reused=False)
    _pid_file(settings).write_text(json.dumps({"pid": proc.pid, "url": url, "log": str(log_path),
                                               "prefix": settings.topic_prefix}))
    say(f"worker started (pid {proc.pid}); log {log_path}")
    deadline = time.monotonic() + ready_s
    while not _health(url):
        if proc.poll() is not None:
            _pid_file(settings).unlink(missing_ok=True)
            raise InfraError(f"the worker exited during start-up (code {proc.returncode}); see {log_path}: "
                             f"{_log_tail(log_path)}", code="worker_start_failed")
        if time.monotonic() > deadline:
            raise InfraError(f"the worker did not answer {url}/health within {ready_s:.0f}s; see {log_path}",
                             code="worker_start_failed")
        time.sleep(0.5)
    return handle


def stop_worker(settings: Settings, *, timeout_s: float = 30.0) -> int | None:
    """Stop the demo worker of this home (SIGTERM, then SIGKILL); return its pid if one ran."""
    running = demo_worker(settings)
    _pid = running.pid if running else None
    if _pid is not None:
        os.kill(_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_our_worker(_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _is_our_worker(_pid):
            os.kill(_pid, signal.SIGKILL)
    _pid_file(settings).unlink(missing_ok=True)
    return _pid


def stop_demo(settings: Settings, say: Say) -> None:
    """``--stop``: the demo worker, then the local broker of this home (an external Kafka is left alone)."""
    pid = stop_worker(settings)
    say(f"worker stopped (pid {pid})" if pid else "no demo worker was running")
    before = local.stop(settings)
    say("local Kafka stopped" if any(n.alive for n in before) else "no local Kafka was running in this home")


# ---------------------------------------------------------------------------------------------
# the run, through the SDK


async def play_run(pub: Publisher, run_id: str, *, variant: str = "original",
                   replay_of: dict[str, Any] | None = None, pace: float = 1.0) -> list[dict[str, Any]]:
    """Publish the demo story as run ``run_id``; return the docs sent, in sequence order.

    ``variant``: ``original``; ``tool-changed`` (the incident search returns other data);
    ``refusal`` (the model refuses worker-1's summary it answered in the original).
    ``pace`` scales the simulated think/tool latencies (0 = as fast as possible).
    """
    run = pub.run(run_id, engine_version=BINDINGS["engineVersion"])
    docs: list[dict[str, Any]] = []

    async def emit(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        doc = await coro
        docs.append(doc)
        return doc

    async def think(seconds: float) -> None:
        if pace > 0:
            await asyncio.sleep(seconds * pace)

    def chain(phase: str, worker: str, cause: dict[str, Any], **extra: Any) -> Awaitable[dict[str, Any]]:
        payload = {"phase": phase, "workerId": worker, "parentRunId": run_id, **extra}
        return run.emit("core.workflowChain.event", payload, caused_by=cause, node_id="dispatcher")

    child = f"{run_id}.worker-1"
    started_payload: dict[str, Any] = {"bindings": dict(BINDINGS)}
    if replay_of:
        started_payload["replayOf"] = replay_of
    started = await emit(run.emit("run.started", started_payload, node_id="host"))
    goal = await emit(run.emit("variable.changed", {"name": "goal", "value": (
        "Triage last night's checkout incidents and post a customer status update")},
        caused_by=started, node_id="planner"))
    plan_req = await emit(run.llm_request({**MODEL, "messages": [
        {"role": "system", "content": "You are the planner. Split the task between worker-1 and worker-2."},
        {"role": "user", "content": goal["payload"]["value"]}], "temperature": 0, "maxOutputTokens": 512},
        node_id="planner", caused_by=goal))
    await think(0.35)
    plan = await emit(run.llm_response(plan_req, {"kind": "message", "text": (
        "worker-1: investigate checkout incidents since 18:00; worker-2: draft the status page entry.")},
        usage={"inputTokens": 812, "outputTokens": 143}))
    await emit(run.usage(MODEL["provider"], MODEL["model"], 812, 143, cost_cents=0.46, node_id="planner",
                         caused_by=plan))
    decided = await emit(run.emit("runOrchestrator.decided", {
        "agentId": "agent.planner", "iteration": 1,
        "decision": {"kind": "next-worker", "nextWorkerIds": ["worker-1", "worker-2"],
                     "outputMapping": {"worker-1": {"findings": "incidentFindings"}}}},
        caused_by=plan, node_id="planner"))
    began1 = await emit(chain("dispatch.began", "worker-1", decided))
    await think(0.08)
    ok1 = await emit(chain("dispatch.succeeded", "worker-1", began1, childRunId=child))
    began2 = await emit(chain("dispatch.began", "worker-2", decided))
    await think(0.25)
    failed2 = await emit(chain("dispatch.failed", "worker-2", began2,
                               error={"code": "worker_unavailable", "message": "worker-2 pool has no capacity"}))
    await emit(run.emit("channel.written", {"channel": "progress", "value": "worker-2 unavailable; worker-1 continues"},
                        caused_by=failed2, node_id="dispatcher"))
    call = await emit(run.tool_call("incidents.search", {"service": "checkout", "since": "18:00Z"},
                                    node_id="worker-1", caused_by=ok1))
    await think(0.3)
    incidents = [{"id": "INC-4211", "severity": "SEV2", "cause": "payment gateway timeouts"},
                 {"id": "INC-4214", "severity": "SEV3", "cause": "stale cart cache"}]
    if variant == "tool-changed":
        incidents = [{"id": "INC-4211", "severity": "SEV1", "cause": "payment gateway outage"}]
    ret = await emit(run.tool_result(call, {"incidents": incidents, "count": len(incidents)}))
    sum_req = await emit(run.llm_request({**MODEL, "messages": [
        {"role": "system", "content": "Summarise incidents for the parent run as JSON findings."},
        {"role": "user", "content": json.dumps(ret["payload"]["result"], sort_keys=True)}], "temperature": 0},
        node_id="worker-1", caused_by=ret))
    await think(0.4)
    if variant == "refusal":
        refused = await emit(run.llm_refusal(sum_req, "The model declined to summarise incident data in this context."))
        await emit(run.usage(MODEL["provider"], MODEL["model"], 640, 12, cost_cents=0.21, node_id="worker-1",
                             caused_by=refused))
        await emit(chain("child.failed", "worker-1", ok1, childRunId=child,
                         error={"code": "model_refused", "message": "summary refused"}))
        await emit(run.emit("run.failed", {"status": "failed", "error": {"code": "model_refused",
                                                                         "message": "worker-1 summary refused"}},
                            node_id="host"))
        await run.flush()
        return docs
    findings = {"incidents": 2, "worst": "INC-4211", "rootCause": "payment gateway timeouts"}
    summary = await emit(run.llm_response(sum_req, {"kind": "message", "json": findings},
                                          usage={"inputTokens": 640, "outputTokens": 96}))
    await emit(run.usage(MODEL["provider"], MODEL["model"], 640, 96, cost_cents=0.27, node_id="worker-1",
                         caused_by=summary))
    done1 = await emit(chain("child.completed", "worker-1", ok1, childRunId=child))
    await think(0.05)
    harvested = await emit(chain("output.harvested", "worker-1", done1, childRunId=child,
                                 harvestedKeys=["incidentFindings"]))
    await emit(run.emit("variable.changed", {"name": "incidentFindings", "value": findings},
                        caused_by=harvested, node_id="planner"))
    pii_req = await emit(run.llm_request({**MODEL, "messages": [
        {"role": "user",
         "content": "Write the status update and list each affected customer's email and card number."}],
        "temperature": 0}, node_id="planner", caused_by=harvested))
    await think(0.2)
    pii_refusal = await emit(run.llm_refusal(
        pii_req, "Refused: the request asks to disclose customers' payment card data."))
    await emit(run.usage(MODEL["provider"], MODEL["model"], 120, 9, cost_cents=0.04, node_id="planner",
                         caused_by=pii_refusal))
    update = await emit(run.emit("channel.written", {"channel": "status-page", "value": (
        "Checkout errors between 18:05 and 18:40 UTC were caused by payment gateway timeouts; resolved.")},
        caused_by=pii_refusal, node_id="planner"))
    await emit(run.emit("run.completed", {"status": "completed"}, caused_by=update, node_id="host"))
    await run.flush()
    return docs


# ---------------------------------------------------------------------------------------------
# reading back


async def _until(probe: Callable[[], Awaitable[Any]], *, timeout_s: float, what: str, log: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}; see the worker log {log}")
        await asyncio.sleep(0.5)


async def _records(settings: Settings, short: str, key: str) -> list[tuple[int, dict[str, Any]]]:
    return [(offset, value) async for _, offset, _, value in read_topic(settings, short, key=key)]


async def _committed(settings: Settings, run_id: str, n: int) -> list[tuple[int, dict[str, Any]]] | None:
    seen: dict[int, tuple[int, dict[str, Any]]] = {}
    for offset, value in await _records(settings, "log", run_id):
        doc = value.get("doc") or {}
        if doc.get("runId") == run_id and doc.get("sequence") not in seen:
            seen[doc["sequence"]] = (offset, value)
    return [seen[i] for i in range(n)] if len(seen) >= n and all(i in seen for i in range(n)) else None


async def _transitions(settings: Settings, run_id: str, n: int) -> list[dict[str, Any]] | None:
    out, seen = [], set()
    for _, t in await _records(settings, "transitions", run_id):
        ident = (t.get("dispatchId"), t.get("phase"))
        if t.get("parentRunId") == run_id and ident not in seen:
            seen.add(ident)
            out.append(t)
    return out if len(out) >= n else None


async def _verdict(settings: Settings, replay_run_id: str) -> dict[str, Any] | None:
    found = await host_verdicts(settings, replay_run_id)  # opened: a verdict's values are sealed like the run's
    return dict(found[-1]) if found else None


# ---------------------------------------------------------------------------------------------
# the tour


def _index(docs: list[dict[str, Any]], type_: str, node: str | None = None, nth: int = 0) -> int:
    hits: list[int] = [d["sequence"] for d in docs
                       if d["type"] == type_ and (node is None or d.get("nodeId") == node)]
    return hits[nth]


async def _offset_replay(settings: Settings, run_id: str,
                         committed: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    # ``committed`` is the whole run, and each record carries the state hash the replay compares with.
    mid = len(committed) // 2
    offset = committed[mid][0]
    result = await replay_run(settings, run_id, from_offset=offset)
    body = result.to_json_dict()
    return {"status": result.verdict, "fromOffset": offset, "fromSeq": result.from_seq,
            "snapshotUsed": result.snapshot_used, "compared": result.compared,
            "headHash": result.head_hash, "firstDivergence": body["firstDivergence"],
            "error": body.get("error"), "note": result.snapshot_note}


async def _host_replay(settings: Settings, pub: Publisher, source: list[dict[str, Any]], *, name: str,
                       variant: str, from_seq: int, expected_at: int, log: str) -> dict[str, Any]:
    replay_id = f"{source[0]['runId']}.{variant}-{uuid.uuid4().hex[:4]}"
    replay_of = {"sourceRunId": source[0]["runId"], "fromSeq": from_seq, "mode": "live"}
    docs = await play_run(pub, replay_id, variant=variant, replay_of=replay_of, pace=0)
    verdict_source = "worker verdict"
    try:
        verdict = await _until(lambda: _verdict(settings, replay_id), timeout_s=VERDICT_WAIT_S,
                               what=f"the worker's verdict for {replay_id}", log=log)
    except DemoError:
        committed = await _until(lambda: _committed(settings, replay_id, len(docs)), timeout_s=STEP_WAIT_S,
                                 what=f"committed log of {replay_id}", log=log)
        result = compare_runs(source, [c["doc"] for _, c in committed], from_seq=from_seq)
        body = result.to_json_dict()
        verdict = {"verdict": body["verdict"], "errorCode": body["errorCode"],
                   "firstDivergence": body["firstDivergence"], "events": body["events"]}
        verdict_source = f"compare_runs on the exported runs (no worker verdict in {VERDICT_WAIT_S:.0f}s)"
    first = verdict.get("firstDivergence") or {}
    events = verdict.get("events") or []
    return {
        "name": name, "replayRunId": replay_id, "fromSeq": from_seq, "expectedAt": expected_at,
        "verdict": verdict.get("verdict"), "errorCode": verdict.get("errorCode"),
        "atSequence": first.get("atSequence"), "kind": first.get("kind"), "path": first.get("path"),
        "expected": first.get("expected"), "actual": first.get("actual"),
        "event": events[0]["type"] if events else None, "eventPayload": events[0].get("payload") if events else None,
        "source": verdict_source,
    }


_QUERIES = ("run-timeline", "handoff-latency", "usage")


async def _queries(settings: Settings, worker: WorkerHandle, run_id: str,
                   n_events: int) -> dict[str, dict[str, Any]]:
    loop = asyncio.get_running_loop()

    def ask_worker(body: dict[str, Any]) -> dict[str, Any]:
        # The store's owner when it advertises its endpoint, else the worker this demo started (never None then).
        return query_via_worker(settings, body, worker_url=worker.url) or {}

    async def ask(name: str) -> dict[str, Any]:
        return await loop.run_in_executor(None, ask_worker, {"query": name, "params": {"run_id": run_id}})

    async def timeline_complete() -> dict[str, Any] | None:
        answer = await ask("run-timeline")
        return answer if len(answer.get("rows", [])) >= n_events else None

    out = {"run-timeline": await _until(timeline_complete, timeout_s=STEP_WAIT_S,
                                        what="the run in ClickHouse (audit sink)", log=worker.log)}
    for name in _QUERIES[1:]:
        async def nonempty(name: str = name) -> dict[str, Any] | None:
            answer = await ask(name)
            return answer if answer.get("rows") else None

        out[name] = await _until(nonempty, timeout_s=STEP_WAIT_S, what=f"rows from {name}", log=worker.log)
    return out


async def _tour(settings: Settings, worker: WorkerHandle, summary: DemoSummary, console: Console) -> None:
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    summary.run_id = run_id
    async with Publisher(settings) as pub:
        with console.status(f"publishing run {run_id} through the SDK…"):
            docs = await play_run(pub, run_id)
        summary.events = len(docs)
        console.print(f"[bold]1.[/] published [cyan]{run_id}[/]: {len(docs)} events "
                      f"(planner LLM call, 2 dispatches, tool call, refusal, variables, channels)")

        with console.status("waiting for the committed log and handoff transitions…"):
            committed = await _until(lambda: _committed(settings, run_id, len(docs)), timeout_s=STEP_WAIT_S,
                                     what="the committed log", log=worker.log)
            n_transitions = sum(1 for d in docs if d["type"] == "core.workflowChain.event")
            transitions = await _until(lambda: _transitions(settings, run_id, n_transitions),
                                       timeout_s=STEP_WAIT_S, what="handoff transitions", log=worker.log)
        # The log holds each doc with its content sealed under the run's key (deterministic), and chains that.
        keyring = await load_keyring(settings, [run_id])
        key = keyring.data_key(run_id)
        head = GENESIS
        for doc in docs:
            head = chain_hash(head, seal_event(doc, key) if key is not None else doc)
        summary.head_hash = committed[-1][1]["hash"]
        summary.head_verified = summary.head_hash == head
        summary.transitions = [{k: t.get(k) for k in ("workerId", "phase", "from", "to", "sequence", "timestamp",
                                                      "harvestedKeys", "derived")} for t in transitions]
        _print_transitions(console, transitions)
        console.print(f"   head hash [bold]{summary.head_hash}[/] "
                      + ("[green](recomputed from the docs sent, sealed under the run's key: equal)[/]"
                         if summary.head_verified
                         else "[red](differs from the hash recomputed from the docs sent!)[/]"))

        with console.status("re-deriving the run from a mid-run offset…"):
            summary.offset_replay = await _offset_replay(settings, run_id, committed)
        _print_offset_replay(console, summary.offset_replay)

        with console.status("re-executing the run twice as new runs (replayOf)…"):
            tool_at = _index(docs, "agent.toolReturned")
            summary.replays.append(await _host_replay(
                settings, pub, docs, name="changed tool output", variant="tool-changed",
                from_seq=_index(docs, "agent.toolCalled"), expected_at=tool_at, log=worker.log))
            refusal_at = _index(docs, "agent.invocation.completed", node="worker-1")
            summary.replays.append(await _host_replay(
                settings, pub, docs, name="model refuses", variant="refusal",
                from_seq=_index(docs, "agent.invocation.started", node="worker-1"), expected_at=refusal_at,
                log=worker.log))
        _print_replays(console, summary.replays)

    with console.status("querying the audit history through the worker…"):
        summary.queries = await _queries(settings, worker, run_id, len(docs))
    for name, answer in summary.queries.items():
        _print_query(console, name, answer)


# ---------------------------------------------------------------------------------------------
# printing


def _print_transitions(console: Console, transitions: list[dict[str, Any]]) -> None:
    table = Table(title="2. handoff transitions (read back from the transitions topic)", title_justify="left")
    for col in ("worker", "phase", "from → to", "seq", "detail"):
        table.add_column(col)
    for t in sorted(transitions, key=lambda t: (t.get("sequence") is None, t.get("sequence") or 0)):
        to = str(t.get("to"))
        colour = "red" if to in ("failed", "cancelled") else "green" if to in ("completed", "harvested") else "cyan"
        detail = ""
        if t.get("harvestedKeys"):
            detail = "harvested " + ", ".join(t["harvestedKeys"])
        elif t.get("error"):
            detail = str((t["error"] or {}).get("code", t["error"]))
        table.add_row(str(t.get("workerId")), str(t.get("phase")), f"{t.get('from')} → [{colour}]{to}[/]",
                      str(t.get("sequence")), detail)
    console.print(table)


def _print_offset_replay(console: Console, r: dict[str, Any]) -> None:
    status = r.get("status")
    colour = "green" if status == "match" else "red"
    line = (f"[bold]3.[/] re-derivation from log offset {r.get('fromOffset')} (sequence {r.get('fromSeq')}, "
            f"snapshot {r.get('snapshotUsed')}): [{colour}]{status}[/] over {r.get('compared')} indexes")
    if r.get("firstDivergence"):
        line += f"; first divergence {r['firstDivergence']}"
    if r.get("error"):
        line += f"; error {r['error']}"
    console.print(line)


def _print_replays(console: Console, replays: list[dict[str, Any]]) -> None:
    table = Table(title="4. host replays (new runs with run.started.replayOf)", title_justify="left")
    for col in ("scenario", "verdict", "error code", "at seq (expected)", "from"):
        table.add_column(col, no_wrap=col != "from")
    for r in replays:
        colour = "green" if r["verdict"] == "match" else "red"
        table.add_row(r["name"], f"[{colour}]{r['verdict']}[/]", str(r.get("errorCode")),
                      f"{r.get('atSequence')} ({r.get('expectedAt')})", r["source"])
    console.print(table)
    for r in replays:
        if r.get("kind") == "refusal":
            diff = f"envelope {r.get('expected')} → {r.get('actual')}"
        else:
            diff = (f"{r.get('kind')} at {r.get('path') or '(event)'}: {json.dumps(r.get('expected'))[:70]} → "
                    f"{json.dumps(r.get('actual'))[:70]}")
        console.print(f"   {r['name']}: [bold]{r.get('event')}[/] {json.dumps(r.get('eventPayload'))[:150]}")
        console.print(f"      field diff: {diff}")


def _print_query(console: Console, name: str, answer: dict[str, Any]) -> None:
    table = Table(title=f"5. agentlog query {name}", title_justify="left")
    columns = answer.get("columns", [])
    if name == "run-timeline" and {"sequence", "event_id", "causation_id", "event_time"} <= set(columns):
        answer, columns = _compact_timeline(answer), ["seq", "time", "type", "node", "caused by", "hash"]
    for col in columns:
        table.add_column(col, overflow="fold", max_width=40 if col in ("event_id", "causation_id", "hash") else None)
    for row in answer.get("rows", [])[:40]:
        table.add_row(*["" if v is None else (str(v)[:12] + "…" if len(str(v)) > 40 else str(v)) for v in row])
    console.print(table)


def _compact_timeline(answer: dict[str, Any]) -> dict[str, Any]:
    """The timeline with causation as the cause's sequence and short hashes, so it fits a terminal."""
    cols = answer["columns"]
    rows = [dict(zip(cols, row, strict=True)) for row in answer.get("rows", [])]
    seq_of = {r["event_id"]: r["sequence"] for r in rows}
    out = []
    for r in rows:
        cause = r.get("causation_id") or ""
        out.append([r["sequence"], str(r.get("event_time", ""))[11:23], r.get("type"), r.get("node_id"),
                    "" if not cause else f"#{seq_of[cause]}" if cause in seq_of else cause[:13],
                    str(r.get("hash", ""))[:12]])
    return {"columns": ["seq", "time", "type", "node", "caused by", "hash"], "rows": out}


def _print_next(console: Console, summary: DemoSummary, settings: Settings) -> None:
    r = summary.run_id
    console.rule("where to look next")
    for cmd, why in (
        (f"agentlog query run-timeline --param run_id={r}", "every committed event"),
        (f"agentlog query failures --param run_id={r}", "dispatch failures per worker"),
        ("agentlog query refusals", "refusal rate per model"),
        (f"agentlog query replay-verdicts --param source_run_id={r}", "the verdicts of the two re-executions"),
        (f"agentlog replay --run {r} --from-seq 5", "re-derive the run yourself"),
        (f"agentlog export --run {r} --checkpoints {r}.checkpoints.jsonl",
         "the run as RunEventDoc JSON lines; its signed checkpoints to a file"),
        (f"agentlog verify --run {r} --public-key {public_key_path(settings.signing_key_path)}",
         "check the worker's signatures over the run"),
        (f"agentlog report --run {r} --out {r}.html", "causation graph + handoff timeline as one HTML page"),
        ("agentlog capabilities --json", "what this store can prove, checked now"),
        (f"curl {summary.worker.get('url')}/metrics", "Prometheus metrics of the worker"),
        (f"{summary.worker.get('url')}/", "the web console: runs, this run's state at any index, replays"),
        ("agentlog demo --stop-only", "stop the demo worker and the local broker (what make down runs)"),
    ):
        console.print(f"  [cyan]{cmd}[/]  [dim]# {why}[/]")


# ---------------------------------------------------------------------------------------------
# entry point


def run_demo(settings: Settings, console: Console | None = None) -> DemoSummary:
    """Bring the stack up, play and replay the demo run, query it; return what was established.

    Raises:
        AgentlogError: a step failed or a bounded wait ran out (the message names the log).
    """
    console = console or Console()
    t0 = time.monotonic()
    summary = DemoSummary()

    def say(text: str) -> None:
        console.print(f"[dim]•[/] {text}")

    console.rule("agentlog demo")
    summary.broker = ensure_stack(settings, say)
    created = ensure_topics_sync(settings)
    say(f"topics ready under prefix '{settings.topic_prefix}' ({len(created)} created)")
    summary.migrations = _migrate(settings)
    say(f"ClickHouse {settings.store_url}: {len(summary.migrations)} migration(s) applied")
    worker = ensure_worker(settings, say)
    summary.worker = asdict(worker)
    asyncio.run(_tour(settings, worker, summary, console))
    _print_next(console, summary, settings)
    summary.wall_s = round(time.monotonic() - t0, 1)
    console.print(f"[bold green]demo finished in {summary.wall_s:.1f}s[/]")
    # The last line is where to look, in a browser.
    console.print(f"web console of the demo run: [bold cyan]{console_url(summary)}[/]", soft_wrap=True)
    return summary


def console_url(summary: DemoSummary) -> str:
    """The web console's page of the demo run (the worker serves it; README "Console")."""
    return f"{summary.worker.get('url')}/runs/{summary.run_id}"
