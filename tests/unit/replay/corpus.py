"""Two corpora of replays with one known change each, for judging the lane comparison.

* :func:`sequential_cases` — four realistic run shapes (:func:`~tests.unit.replay.runs.llm_run`,
  :func:`~tests.unit.core.runs.realistic_run` in check and derive mode,
  :func:`~tests.unit.replay.runs.worker_child_run`), each replayed once per change: volatile fields
  only, a changed output, a removed event, an inserted event (among them an extra
  ``variable.changed`` in the main lane, ``dispatch``), a changed event type, a refusal either way,
  other bound versions. 56 cases.
* :func:`concurrent_cases` — 2 or 3 workers whose lanes the original and the replay interleave
  differently, one seed each: the interleaving only, one lane's tool result changed, one lane's
  event missing, one lane with an extra event. 10 seeds of each.

Every case carries its expected verdict, divergence kind and source sequence, written down from the
construction (the sequence that was changed, removed, or inserted before; in an interleaved replay, the
lane event an insertion displaced), and ``sources``: the
original sequence each replay position holds (``None`` for an inserted event), from which the
index-by-index (``--strict``) answer follows (:meth:`Case.strict_expectation`). Nothing here runs
the comparison engine.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.unit.core.runs import RunLog, realistic_run
from tests.unit.replay.runs import as_replay, index_of, interleave, llm_run, perturb_volatile, worker_child_run

__all__ = ["Case", "concurrent_cases", "sequential_cases"]

_ENVELOPES = ("agent.invocation.completed", "envelope.refusal")


@dataclass(frozen=True)
class Case:
    """One original/replay pair and what the lane comparison must say about it.

    ``at`` is the source sequence of the first divergence (``None`` for ``match``/``what-if``);
    ``sources[i]`` the original sequence of the replay's event ``i`` (``None`` for an inserted one);
    ``changed`` the source sequence whose event the replay changed in place.
    """

    name: str
    original: list[dict[str, Any]]
    replay: list[dict[str, Any]]
    verdict: str
    kind: str | None
    at: int | None
    sources: tuple[int | None, ...]
    changed: int | None = None

    def strict_expectation(self) -> tuple[str, str | None, int | None]:
        """(verdict, kind, sequence) index by index: the first index whose events are not the same event."""
        what_if = self.verdict == "what-if"
        for i in range(max(len(self.original), len(self.replay))):
            if i < len(self.sources) and self.sources[i] == i and i != self.changed:
                continue
            if i >= len(self.replay):
                kind = "missing"
            elif i >= len(self.original):
                kind = "extra"
            else:
                o_type, r_type = self.original[i]["type"], self.replay[i]["type"]
                if o_type != r_type and o_type in _ENVELOPES and r_type in _ENVELOPES:
                    kind = "refusal"
                elif o_type != r_type:
                    kind = "type-mismatch"
                else:
                    kind = "output"
            verdict = "what-if" if what_if else "diverged_at_refusal" if kind == "refusal" else "diverged"
            return verdict, kind, i
        return ("what-if" if what_if else "match"), None, None


# ---------------------------------------------------------------------------------------------
# Sequential runs: one change each


def _renumber(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for seq, doc in enumerate(docs):
        doc["sequence"] = seq
    return docs


def _refused(doc: dict[str, Any]) -> None:
    doc["type"] = "envelope.refusal"
    doc["payload"] = {"cacheKey": doc["payload"]["cacheKey"], "reason": "safety policy: dual-use"}


_Change = Callable[[list[dict[str, Any]], list[dict[str, Any]]], tuple[str, int | None, str]]


def _output(type_: str, nth: int, path: tuple[str, ...], value: Any) -> _Change:
    """Set ``path`` of the ``nth`` ``type_`` event of the replay to ``value``: ``output`` there."""
    def change(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
        seq = index_of(original, type_, nth)
        holder = replay[seq]
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        return "output", seq, f"output-{type_}-{'.'.join(path)}"
    return change


def _remove(type_: str, nth: int) -> _Change:
    def change(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
        seq = index_of(original, type_, nth)
        del replay[seq]
        return "missing", seq, f"missing-{type_}-{nth}"
    return change


def _insert(after: tuple[str, int], type_: str, payload: dict[str, Any], node: str) -> _Change:
    """An event the original does not have, right after the ``after`` event (caused by it)."""
    def change(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
        seq = index_of(original, *after) + 1
        extra = {"eventId": f"evt-extra-{seq}", "runId": replay[0]["runId"], "type": type_,
                 "payload": copy.deepcopy(payload), "timestamp": "2026-03-02T09:00:00.000Z", "sequence": seq,
                 "nodeId": node, "causationId": replay[seq - 1]["eventId"]}
        replay.insert(seq, extra)
        return "extra", seq, f"extra-{type_}-{node}-at-{seq}"
    return change


def _retype(type_: str, nth: int, new_type: str) -> _Change:
    def change(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
        seq = index_of(original, type_, nth)
        replay[seq]["type"] = new_type
        return "type-mismatch", seq, f"type-{type_}-to-{new_type}"
    return change


def _valid_to_refusal(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
    seq = index_of(original, "agent.invocation.completed")
    _refused(replay[seq])
    return "refusal", seq, "refusal-valid-to-refused"


def _refusal_to_valid(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
    seq = index_of(original, "agent.invocation.completed")
    _refused(original[seq])  # the original was refused; the replay's envelope is valid
    return "refusal", seq, "refusal-refused-to-valid"


def _volatile(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
    replay[:] = perturb_volatile(replay)
    return "match", None, "volatile-only"


def _rebind(original: list[dict[str, Any]], replay: list[dict[str, Any]]) -> tuple[str, int | None, str]:
    bindings = replay[0]["payload"].setdefault("bindings", {})
    bindings["engineVersion"] = "2.0.0"
    return "what-if", None, "version-change"


_PLANNER_USAGE = {"provider": "anthropic", "model": "claude-x", "inputTokens": 7, "outputTokens": 1}
_DRAFT = {"name": "draft", "value": "second thoughts"}

#: The changes both modes of the realistic run get besides their own outputs and removals.
_REALISTIC_RUN_CHANGES: list[_Change] = [
    _insert(("channel.written", 0), "variable.changed", _DRAFT, "dispatch"),  # the main lane
    _insert(("channel.written", 1), "channel.written", {"channel": "progress", "value": "closing"}, "end"),
    _insert(("provider.usage", 0), "provider.usage", _PLANNER_USAGE, "planner"),
    _insert(("variable.changed", 0), "variable.changed", {"name": "note", "value": "urgent"}, "start"),
    _retype("provider.usage", 0, "agent.reasoned"),
    _volatile, _rebind,
]

#: Per run shape: how to build the source run, and its changes.
_SHAPES: dict[str, tuple[Callable[[], list[dict[str, Any]]], list[_Change]]] = {
    "llm": (lambda: llm_run("seq-llm"), [
        _output("agent.toolReturned", 0, ("payload", "result", "hits"), 2),
        _output("variable.changed", 2, ("payload", "value"), {"incidents": 3, "worst": "INC-41"}),
        _output("provider.usage", 1, ("payload", "costCents"), 3),
        _remove("provider.usage", 0),
        _remove("channel.written", 0),
        _remove("node.retried", 0),
        _insert(("channel.written", 0), "variable.changed", _DRAFT, "dispatch"),  # the main lane
        _insert(("node.retried", 0), "channel.written", {"channel": "progress", "value": "retrying"}, "research"),
        _insert(("provider.usage", 0), "provider.usage", _PLANNER_USAGE, "planner"),
        _insert(("node.retried", 0), "node.retried", {"attempt": 2, "errorCode": "ERR_HTTP_503"}, "research"),
        _retype("provider.usage", 1, "agent.reasoned"),
        _valid_to_refusal, _refusal_to_valid, _volatile, _rebind,
    ]),
    "check": (lambda: realistic_run("seq-check", "check"), [
        _output("variable.changed", 1, ("payload", "value"), {"incidents": 4, "worst": "INC-42"}),
        _output("channel.written", 1, ("payload", "value"), "finished"),
        _output("provider.usage", 0, ("payload", "inputTokens"), 813),
        _remove("channel.written", 0),
        _remove("provider.usage", 0),
        _remove("runOrchestrator.decided", 1),
        *_REALISTIC_RUN_CHANGES,
    ]),
    "derive": (lambda: realistic_run("seq-derive", "derive"), [
        _output("variable.changed", 1, ("payload", "value"), {"incidents": 3, "worst": "INC-40"}),
        _output("channel.written", 0, ("payload", "value"), "worker-b dispatched"),
        _output("node.dispatched", 1, ("payload", "childStatus"), "running"),
        _remove("channel.written", 0),
        _remove("provider.usage", 0),
        _remove("node.dispatched", 2),
        *_REALISTIC_RUN_CHANGES,
    ]),
    "child": (lambda: worker_child_run("seq-child", "wa"), [
        _output("agent.toolReturned", 0, ("payload", "result", "hits"), 4),
        _output("variable.changed", 0, ("payload", "value"), 4),
        _output("agent.invocation.completed", 0, ("payload", "envelope", "answer"), "dispatch worker-b only"),
        _remove("agent.toolCalled", 0),
        _remove("agent.toolReturned", 0),
        _remove("variable.changed", 0),
        _insert(("agent.toolCalled", 0), "variable.changed", _DRAFT, "wa"),  # the main lane
        _insert(("agent.toolReturned", 0), "node.retried", {"attempt": 1, "errorCode": "ERR_HTTP_503"}, "wa"),
        _insert(("agent.invocation.completed", 0), "provider.usage", _PLANNER_USAGE, "wa"),
        _insert(("variable.changed", 0), "channel.written", {"channel": "progress", "value": "closing"}, "end"),
        _retype("variable.changed", 0, "agent.reasoned"),
        _valid_to_refusal, _refusal_to_valid, _volatile, _rebind,
    ]),
}


def sequential_cases() -> list[Case]:
    """The 56 sequential cases: the replay keeps the original's order except for its one change."""
    out = []
    for shape, (build, changes) in _SHAPES.items():
        for change in changes:
            original = build()
            replay = as_replay(original, replay_run_id=f"{original[0]['runId']}-r")
            kind, seq, label = change(original, replay)
            _renumber(replay)
            sources: list[int | None] = list(range(len(original)))
            changed = None
            if kind == "missing":
                del sources[seq]
            elif kind == "extra":
                sources.insert(seq, None)
            elif seq is not None:
                changed = seq
            verdict = {"match": "match", "what-if": "what-if", "refusal": "diverged_at_refusal"}.get(kind, "diverged")
            out.append(Case(name=f"{shape}/{label}", original=original, replay=replay, verdict=verdict,
                            kind=kind if verdict not in ("match", "what-if") else None, at=seq,
                            sources=tuple(sources), changed=changed))
    return out


# ---------------------------------------------------------------------------------------------
# Concurrent workers: lanes interleaved differently


def _workers_run(run_id: str, workers: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """A run whose workers run at once, laid out worker after worker; and each worker's chain.

    Worker ``x`` (``a``, ``b``, ``c``) is dispatched (lane ``dispatch/worker-x``), then works in node
    ``wx``: a search and its result, a variable, a fetch and its result, a variable. Each event is
    caused by the one before it in its chain, so any merge of the chains is a faithful schedule.
    Every worker writes variables of its own: the final state does not depend on the interleaving.
    """
    log = RunLog(run_id)
    log.add("run.started", {}, node="start")
    chains = []
    for n, x in enumerate("abc"[:workers]):
        node = f"w{x}"
        chain = [log.add("node.dispatched", {"childRunId": f"{run_id}.child-{x}", "childWorkflowId": f"worker-{x}"},
                         node="dispatch", cause=0)]
        steps: list[tuple[str, dict[str, Any]]] = [
            ("agent.toolCalled", {"callId": f"{run_id}:call-{x}1", "tool": "search", "args": {"q": f"incidents {x}"}}),
            ("agent.toolReturned", {"callId": f"{run_id}:call-{x}1", "result": {"hits": n + 2}}),
            ("variable.changed", {"name": f"{x}Hits", "value": n + 2}),
            ("agent.toolCalled", {"callId": f"{run_id}:call-{x}2", "tool": "fetch", "args": {"url": f"https://x/{x}"}}),
            ("agent.toolReturned", {"callId": f"{run_id}:call-{x}2", "result": {"pages": n + 1}}),
            ("variable.changed", {"name": f"{x}Pages", "value": n + 1}),
        ]
        for type_, payload in steps:
            chain.append(log.add(type_, payload, node=node, cause=chain[-1]))
        chains.append(chain)
    log.add("run.completed", {"status": "completed"}, node="end")
    return log.docs, chains


def _merge(chains: list[list[int]], rng: random.Random) -> list[int]:
    """A random interleaving of ``chains`` that keeps each one's order."""
    heads = [list(chain) for chain in chains if chain]
    out = []
    while heads:
        chain = rng.choice(heads)
        out.append(chain.pop(0))
        if not chain:
            heads.remove(chain)
    return out


def _restricted(chains: list[list[int]], keep: set[int]) -> list[list[int]]:
    return [[i for i in chain if i in keep] for chain in chains]


def concurrent_cases(seeds: int = 10) -> list[Case]:
    """``seeds`` cases of each concurrent scenario (2 workers for even seeds, 3 for odd ones)."""
    out = []
    for seed in range(seeds):
        for scenario in ("interleaved", "tool-result", "missing", "extra"):
            out.append(_concurrent_case(seed, scenario))
    return out


def _concurrent_case(seed: int, scenario: str) -> Case:
    rng = random.Random(f"{scenario}-{seed}")
    run_id = f"par-{scenario}-{seed}"
    canonical, chains = _workers_run(run_id, 2 + seed % 2)
    last = len(canonical) - 1
    o_order = [0, *_merge(chains, rng), last]
    original = interleave(canonical, o_order)
    source_of = {c: s for s, c in enumerate(o_order)}  # canonical index → source sequence
    replayed = as_replay(canonical, replay_run_id=f"{run_id}-r")
    chain = rng.choice(chains)
    at: int | None = None
    kind: str | None = None
    changed = None
    while True:
        r_order: list[int | None]
        if scenario == "extra":
            # After the j-th event of the worker's node (not its dispatch), before source sequence k:
            # the replay does the original's first k events, then the extra, then the rest, each
            # part in an interleaving of its own. k lies after the lane's j-th event and no later
            # than its next one; never the final run.completed (nothing of the source follows there).
            # The lanes interleave differently, so the extra departs at the lane event it displaced,
            # the lane's (j+1)-th; at the lane's end, where nothing of the lane is displaced, at k.
            j = rng.randrange(1, len(chain))
            low = source_of[chain[j]] + 1
            high = source_of[chain[j + 1]] if j + 1 < len(chain) else last - 1
            if low > high:
                continue
            k = rng.randint(low, high)
            before = {c for c, s in source_of.items() if s < k}
            r_order = [0, *_merge(_restricted(chains, before), rng), None,
                       *_merge(_restricted(chains, set(source_of) - before), rng), last]
            kind, at = "extra", source_of[chain[j + 1]] if j + 1 < len(chain) else k
        else:
            r_order = [0, *_merge(chains, rng), last]
        if [c for c in r_order if c is not None] != o_order:
            break
    if scenario == "tool-result":
        returned = rng.choice([c for c in chain if canonical[c]["type"] == "agent.toolReturned"])
        field = next(iter(replayed[returned]["payload"]["result"]))
        replayed[returned]["payload"]["result"][field] += 10
        kind, at = "output", source_of[returned]
        changed = at
    elif scenario == "missing":
        removed = rng.choice(chain[1:])
        r_order.remove(removed)
        kind, at = "missing", source_of[removed]
    replay = []
    for c in r_order:
        if c is None:
            predecessor = replayed[chain[j]]
            doc = {"eventId": f"evt-{run_id}-extra", "runId": predecessor["runId"], "type": "variable.changed",
                   "payload": {"name": f"{predecessor['nodeId'][1]}Note", "value": "again"},
                   "timestamp": "2026-03-02T09:00:00.000Z", "nodeId": predecessor["nodeId"],
                   "causationId": predecessor["eventId"]}
        else:
            doc = copy.deepcopy(replayed[c])
        replay.append(doc)
    _renumber(replay)
    sources = tuple(None if c is None else source_of[c] for c in r_order)
    verdict = "match" if scenario == "interleaved" else "diverged"
    return Case(name=f"concurrent/{scenario}/{seed}", original=original, replay=replay, verdict=verdict,
                kind=kind, at=at, sources=sources, changed=changed)
