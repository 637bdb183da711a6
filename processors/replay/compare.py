"""The replay comparison engine: does a replay reproduce its source run's observable output?

One engine serves both replay jobs of SPEC §7 (re-derivation and host replay, RFC 0041 §C).
It is pure — lists of RunEventDocs in, a frozen :class:`ComparisonResult` out — so the
replay processor, the CLI and the tests all get the same verdict from the same bytes.
State is never interpreted here: observable state at each index comes from
:mod:`agentlog.core.fold`, the one fold the live processors use.

Runs of any size: a side may instead be a :class:`StoredRun`, whose events stay in their file.
The engine needs across a run only what a compact record per event holds (type, node, ids, the
names of what the event is about, the minted ids it carries); it walks the indexes in order,
reading the two events of one index back, folding one state per side and comparing them there,
so every check runs on whole events, exactly as for lists, while what it holds grows with the
number of events, not with their content. The lanes read back the events of a lane only where a
replay changed that lane (their key is then kept as a digest); the whole state where lanes join
is a second fold of each run, keeping the states at the joins only.

How two runs are compared (events aligned by ``sequence``; ``fromSeq`` defaults to the replay's
``run.started.payload.replayOf.fromSeq``, else 0). At each index the checks run in this order and
the first that fails is that index's divergence:

1. presence — an index only the original has is ``missing``; only the replay, ``extra`` (per lane,
   also an event the replay inserted into a lane, at the index where the lane departs);
2. envelope kind — ``agent.invocation.completed`` on one side and ``envelope.refusal`` on the
   other (either direction) is a ``refusal`` divergence: RFC 0041 §B makes it its own verdict
   (``diverged_at_refusal``, error ``replay_diverged_at_refusal``, event
   ``replay.divergedAtRefusal``) and it is never folded into ``replay.diverged``;
3. event type — otherwise different types are a ``type-mismatch``;
4. observable state — ``status``, ``variables``, ``channels`` after the event must be
   byte-equivalent (JCS); the first differing path inside the state is reported (``variables.x``);
5. request — an ``agent.invocation.started`` that asks something else than the original, as its
   cache key sees it: the projection of the original's recipe (RFC 0041 §A) of both requests, so
   transport fields never count (without a request on either side, the recorded ``cacheKey``
   strings). Call bytes may differ as long as the observable result is the same (SPEC §7), so a
   changed request alone is no divergence; when the runs diverge, it is their cause and reported
   first, at its own index, before its consequences (a missing answer in a recorded replay, another
   result in a live one), as an ``output`` divergence with ``aspect`` ``request``, the differing
   fields named in its ``detail`` (the miss diagnosis's diff,
   :func:`agentlog.core.result_cache.request_diff`);
6. event fields — the event with volatile fields removed (``agentlog.schemas.stability``) must be
   byte-equivalent. Before ``fromSeq`` that is the whole rest of the event (RFC 0041 §C: the
   prefix is copied, so it must be identical, request bytes included). From ``fromSeq`` on, the
   call *bytes* may differ (RFC 0041 §C): ``agent.toolCalled.args`` and the LLM request as sent
   with its ``cacheKey``/``recipe`` are not compared field by field — what the request asks is
   check 5 — while the observable results (``agent.toolReturned.result``, the
   ``agent.invocation.completed`` envelope) and the AOS PIN-009 deterministic aspects (retry
   attempts, error codes, cost and tokens, side-effect type+target order) are;
7. references — the replay's ``causationId`` must be the replay eventId at the sequence the
   original's ``causationId`` points at (eventIds themselves are freshly minted, hence volatile);
   ids a replay mints afresh inside payloads (``parentRunId`` = its own run, ``childRunId``,
   tool ``callId``) must pair consistently with the original's (:data:`MINTED_ID_FIELDS`).

Minted ids never count anywhere in a payload: the pairs of ids the two runs minted (the
:data:`MINTED_ID_FIELDS`, and the tool-call ids of a model's response) are learned up front, and
every string of a replay payload equal to one of its minted ids is read as the original's id before
checks 5 and 6 — so a tool-call id a framework mints at random is the same id in the response
envelope, the tool events and every later request's messages.

Fields never compared per event: ``eventId``, ``runId``, ``timestamp`` and other volatile fields,
``sequence`` (the alignment key), ``causationId`` and minted ids (check 6), ``engineVersion`` and
``run.started.payload.bindings`` (the bindings check below), ``run.started.payload.replayOf``
(the replay's own marker), and the labels a run carries that say nothing of what it did:
``run.started.payload.tags`` and ``runClass`` (a suite execution tags its replays).

Bindings (MACP §3): when ``run.started`` binds different engine/mode/config/policy versions the
verdict is ``what-if`` — never ``match``, whatever else happened. Decision: what-if wins the
verdict; divergences found under other bindings are still listed (and still emit their replay.*
events) because they are the answer a what-if analysis asks for, and ``errorCode`` still says
``replay_diverged_at_refusal`` / ``replay_diverged`` when they exist (RFC 0041 §B requires the
refusal failure to be visible). A what-if whose behaviour is identical has no error code. A
changed request is the usual answer there (a new prompt version): it is listed first, at its
index, and the verdict stays ``what-if``.

Lanes (default; ``strict=True`` turns them off): the indices above are the original's. Each lane
of the replay is aligned with the original's as a sequence diff (:mod:`agentlog.replay.lanes`;
events are the same when every field compared from ``fromSeq`` on is, else when they have the
same identity), and the replay is re-laid — each paired replay event at the source sequence of
its partner — so cross-lane interleaving is reported in ``reordered`` instead of as a divergence
and every check above runs unchanged on the re-laid replay. An original event without a partner
is ``missing`` at its sequence; a replay event the diff calls inserted is ``extra`` at the source
sequence where its lane departs, and is left out of the re-laid state (its effect shows where
the lanes join). The whole observable state is additionally compared, in the replay's own order,
where lanes join and at the end. When the lanes change nothing the re-laid replay *is* the
replay and the comparison is exactly the strict one. Child runs are compared by
:mod:`agentlog.replay.tree` from ``child_pairs``.

Fail-fast by default: stop at the first divergence. ``collect_all=True`` walks every index and
reports at most one divergence per index besides the inserted events departing there; a state
difference identical to the one at the previous index is not reported again (one changed
variable would otherwise repeat at every later index).
"""

from __future__ import annotations

import copy
import hashlib
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from agentlog.core.fold import fold, observable
from agentlog.core.result_cache import request_diff
from agentlog.replay.divergence import Divergence, DivergenceEngine
from agentlog.replay.lanes import JOIN_TYPES, PAYLOAD_NAMES, Alignment, align
from agentlog.schemas.cachekey import RECIPE_IDS
from agentlog.schemas.canonical import jcs
from agentlog.schemas.content import REDACTIONS
from agentlog.schemas.errors import ReplayError
from agentlog.schemas.stability import (
    MISSING,
    WILDCARD,
    Segment,
    format_path,
    get_path,
    is_volatile,
    parse_path,
    strip_volatile,
)

__all__ = [
    "ASPECTS",
    "BINDING_KEYS",
    "ChildPair",
    "ComparisonResult",
    "MINTED_ID_FIELDS",
    "REPLAY_COUNTERS",
    "ReplayCounters",
    "StoredRun",
    "Verdict",
    "compare_outcome",
    "compare_runs",
    "first_difference",
    "record",
]

Verdict = Literal["match", "diverged", "diverged_at_refusal", "what-if"]

#: What a replay is judged on; one label value each of the match/mismatch metrics.
#: ``result`` is a compared event field from ``fromSeq`` on (tool result, envelope, retry
#: attempt, error code, cost); ``prefix`` the same before ``fromSeq``; ``request`` what an LLM
#: request asks, as its cache key sees it.
ASPECTS = ("prefix", "result", "request", "state", "type", "refusal", "causation", "bindings")

#: The versions a run binds at ``run.started`` (MACP §3).
BINDING_KEYS = ("engineVersion", "modeVersion", "configVersion", "policyVersion")

VALID = "agent.invocation.completed"
REFUSAL = "envelope.refusal"
STARTED = "agent.invocation.started"
_ENVELOPE_KIND = {VALID: "valid", REFUSAL: "refusal"}

#: Envelope fields that are either volatile or judged by a dedicated check.
#: ``run.started`` members never compared: the bindings (their own check), the replay's marker, and labels.
_RUN_LABELS = ("bindings", "replayOf", "tags", "runClass")
_NOT_FIELD_COMPARED = ("eventId", "runId", "timestamp", "sequence", "causationId", "engineVersion")

#: Payload fields holding ids a replay mints afresh — its own run id, its child runs, its tool
#: call ids. Like eventIds they cannot be equal across runs, so they are compared through the
#: original↔replay id mapping (seeded with the two runIds): an original id must always pair
#: with the same replay id, and no replay id may stand for two original ids.
MINTED_ID_FIELDS = ("parentRunId", "childRunId", "callId")

#: Where else a run's minted ids are learned from, by event type: the ids a model gives the tool
#: calls of its response (pydantic-ai mints a random one per call, carried again as the tool
#: events' ``callId`` and in later requests' ``tool_call_response`` parts; an output tool's call has
#: no tool events, so its id is learned here only).
_MINTED_ID_PATHS: dict[str, tuple[str, ...]] = {VALID: ("payload.envelope[*].parts[*].id",)}

#: RFC 0041 §C: bytes of the call itself, allowed to differ from ``fromSeq`` on.
_CALL_BYTES: dict[str, tuple[tuple[str, ...], ...]] = {
    "agent.toolCalled": (("payload", "args"),),
    STARTED: (("payload", "request"), ("payload", "cacheKey"), ("payload", "recipe")),
    VALID: (("payload", "cacheKey"), ("payload", "recipe")),
    REFUSAL: (("payload", "cacheKey"), ("payload", "recipe")),
}


@dataclass(frozen=True)
class ChildPair:
    """A child run the original dispatched and the replay's child for the same dispatch.

    ``replay_child`` is ``None`` when the paired replay event names no child (or there is no
    paired event). ``at_sequence`` is the source sequence of the first event naming the child.
    """

    at_sequence: int
    worker: str | None
    original_child: str
    replay_child: str | None


@dataclass(frozen=True, kw_only=True)
class ComparisonResult:
    """The verdict of one comparison, as data (a divergence is a result, not an exception).

    ``events`` are the replay.* events to publish, as ``{"type", "payload"}`` (the caller mints
    eventId, runId, sequence and timestamp). ``compared_through`` is the last index examined.
    ``strict`` says index semantics were used; otherwise ``reordered`` lists the events the
    replay interleaved differently (:mod:`agentlog.replay.lanes`). ``tree_path`` is set when
    the first divergence is inside a child run (:mod:`agentlog.replay.tree`): the hops from
    this run down to the run the divergence is in. ``child_pairs`` feeds that tree walk.
    """

    verdict: Verdict
    error_code: str | None
    first_divergence: Divergence | None
    divergences: tuple[Divergence, ...]
    events: tuple[dict[str, Any], ...]
    compared_through: int
    binding_diff: dict[str, dict[str, Any]]
    from_seq: int = 0
    source_run_id: str | None = None
    collect_all: bool = False
    strict: bool = True
    reordered: tuple[dict[str, Any], ...] = ()
    tree_path: tuple[dict[str, Any], ...] = ()
    child_pairs: tuple[ChildPair, ...] = ()

    @property
    def exhaustive(self) -> bool:
        """True when every index was examined (collect-all, or fail-fast that found nothing)."""
        return self.collect_all or self.first_divergence is None

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "errorCode": self.error_code,
            "firstDivergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "events": [copy.deepcopy(e) for e in self.events],
            "comparedThrough": self.compared_through,
            "fromSeq": self.from_seq,
        }
        if self.binding_diff:
            out["bindingDiff"] = copy.deepcopy(self.binding_diff)
        if self.collect_all:
            out["divergences"] = [d.to_dict() for d in self.divergences]
        if not self.strict:
            out["reordered"] = [dict(r) for r in self.reordered]
        if self.tree_path:
            out["path"] = [dict(hop) for hop in self.tree_path]
        return out


# ---------------------------------------------------------------------------------------------
# Structural diff


class _Absent:
    """Marks a field present on one side only (rendered as ``None`` in a Divergence)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def first_difference(
    expected: Any,
    actual: Any,
    path: str = "",
    *,
    ignore: Callable[[str], bool] | None = None,
    memo: dict[tuple[int, int], tuple[Any, Any]] | None = None,
    ids: Mapping[str, str] | None = None,
) -> tuple[str, Any, Any] | None:
    """The first path (JCS key order) where two JSON values differ, with both values there.

    Paths use the :mod:`agentlog.schemas.stability` syntax (``payload.items[0]["a.b"]``). Equality is
    byte-equality of the JCS form, so ``1`` equals ``1.0`` but never ``True``. A list length
    difference is reported at ``<path>.length`` after the common elements. A difference at a
    path for which ``ignore(path)`` is true is skipped (the search goes on).

    ``memo`` remembers container pairs already proven equal (holding references, so their ids
    cannot be reused). The fold's states share every unchanged sub-object with their
    predecessor, so with one memo per run pair each index costs what changed, not the whole state.

    ``ids`` maps ids minted on the ``actual`` side to the ``expected`` side's: a string of ``actual``
    that maps to the string of ``expected`` at the same place is no difference.
    """
    start = parse_path(path) if path else ()
    skip = (lambda at: ignore(format_path(at))) if ignore is not None else None
    found = _first_difference(expected, actual, start, skip, memo, ids or None)
    if found is None:
        return None
    segments, e, a = found
    return format_path(segments), e, a


def _first_difference(
    expected: Any,
    actual: Any,
    at: tuple[Segment, ...],
    skip: Callable[[tuple[Segment, ...]], bool] | None,
    memo: dict[tuple[int, int], tuple[Any, Any]] | None,
    ids: Mapping[str, str] | None = None,
) -> tuple[tuple[Segment, ...], Any, Any] | None:
    if expected is actual:
        return None
    pair = (id(expected), id(actual))
    if isinstance(expected, dict) and isinstance(actual, dict):
        if memo is not None and pair in memo:
            return None
        for key in _ordered_keys(expected.keys() | actual.keys()):
            sub = at + (key,)
            if key not in expected or key not in actual:
                if skip is None or not skip(sub):
                    return sub, expected.get(key, ABSENT), actual.get(key, ABSENT)
                continue
            found = _first_difference(expected[key], actual[key], sub, skip, memo, ids)
            if found:
                return found
    elif isinstance(expected, list) and isinstance(actual, list):
        if memo is not None and pair in memo:
            return None
        # The lengths may differ: the common elements first, then the length below.
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            found = _first_difference(e, a, at + (i,), skip, memo, ids)
            if found:
                return found
        if len(expected) != len(actual):
            sub = at + ("length",)
            # A list whose every element is volatile (``x[*]``) has a volatile length too.
            if skip is None or not (skip(sub) or skip(at + (WILDCARD,))):
                return sub, len(expected), len(actual)
    elif _same(expected, actual) or (skip is not None and skip(at)) or _same_id(expected, actual, ids):
        return None
    else:
        return at, expected, actual
    if memo is not None:
        memo[pair] = (expected, actual)
    return None


def _same_id(expected: Any, actual: Any, ids: Mapping[str, str] | None) -> bool:
    """True when ``actual`` is an id the replay minted for the original's ``expected``."""
    return ids is not None and isinstance(actual, str) and ids.get(actual) == expected


def _ordered_keys(keys: Iterable[str]) -> list[str]:
    ordered = sorted(keys)
    if all(key.isascii() for key in ordered):
        return ordered  # code-point order is UTF-16 order for ASCII
    return sorted(ordered, key=_jcs_key_order)


def _jcs_key_order(key: str) -> list[int]:
    # RFC 8785 §3.2.3 orders keys by their UTF-16 code units.
    units = key.encode("utf-16-be")
    return [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]


_EXACT_SCALARS = (str, int, bool, type(None))


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is type(b) and type(a) in _EXACT_SCALARS:
        equal: bool = a == b  # same JCS bytes exactly when equal, without serialising
        return equal
    return jcs(a) == jcs(b)


def _plain(value: Any) -> Any:
    return None if value is ABSENT else value


def _absence_note(expected: Any, actual: Any) -> str:
    if expected is ABSENT:
        return "field absent in the original"
    if actual is ABSENT:
        return "field absent in the replay"
    return ""


# ---------------------------------------------------------------------------------------------
# Run comparison


def compare_runs(
    original: Sequence[Mapping[str, Any]] | StoredRun,
    replay: Sequence[Mapping[str, Any]] | StoredRun,
    *,
    from_seq: int | None = None,
    collect_all: bool = False,
    strict: bool = False,
) -> ComparisonResult:
    """Compare a replay run with its source run (see the module docstring for the rules).

    Args:
        original: the source run's events (any order; aligned by ``sequence``), or a :class:`StoredRun`,
            whose events stay where they are stored and are read back one at a time.
        replay: the replay run's events, or a :class:`StoredRun`.
        from_seq: first index the replay re-executed; default ``replayOf.fromSeq`` of the
            replay's ``run.started``, else 0.
        collect_all: examine every index instead of stopping at the first divergence.
        strict: compare index by index (RFC 0041 §C conformance); by default events are
            aligned per lane and cross-lane interleaving is reported as ``reordered``.

    Raises:
        ReplayError: a side is empty, or holds two events with the same sequence.
    """
    orig, rep = _run(original, "original"), _run(replay, "replay")
    without = _compare(orig, rep, from_seq=from_seq, collect_all=collect_all, strict=strict, requests=False)
    if not without.divergences and not without.binding_diff:
        return without  # call bytes may differ as long as the observable result is the same (SPEC §7)
    return _compare(orig, rep, from_seq=from_seq, collect_all=collect_all, strict=strict, requests=True)


def _compare(
    orig: _Run,
    rep: _Run,
    *,
    from_seq: int | None,
    collect_all: bool,
    strict: bool,
    requests: bool,
) -> ComparisonResult:
    """:func:`compare_runs`, with changed requests reported (``requests``) or not."""
    if from_seq is None:
        from_seq = _replay_from_seq(rep)
    if from_seq < 0:
        raise ReplayError(f"fromSeq must be >= 0, got {from_seq}")
    source_run_id = orig.run_id
    binding_diff = _binding_diff(orig, rep)
    alignment = None if strict else align(orig.index, rep.index, key=_lane_key(orig, rep))
    reordered: list[dict[str, Any]] = []
    inserted: dict[int, tuple[int, ...]] = {}
    own_rep = rep
    if alignment is not None and not alignment.identity:
        reordered = alignment.reordered(orig.index, rep.index)
        inserted = alignment.inserted()
        rep = _RelaidRun(own_rep, alignment.relaid_sequences(orig.index))
    # The states are folded as the walk goes, one per side: only the current one is held.
    o_state: Any = None
    r_state: Any = None
    state_memo = _RecentMemo()

    divergences: list[Divergence] = []
    previous_state_diff: tuple[str, bytes, bytes] | None = None
    ids = _IdMap(source_run_id, rep.run_id)
    minted = _MintedIds.learned(orig, rep, source_run_id, rep.run_id)
    compared_through = -1
    for i in range(max(max(orig.index), max(rep.index)) + 1):
        o_seen, r_seen = orig.index.get(i), rep.index.get(i)
        if o_seen is None and r_seen is None:
            continue
        compared_through = i
        departing = [_extra(i, own_rep.index[r_seq], "the replay inserted this event into its lane before this "
                            f"sequence (replay sequence {r_seq})") for r_seq in inserted.get(i, ())]
        divergences.extend(departing)
        if departing and not collect_all:
            break
        o = orig.doc(i) if o_seen is not None else None
        r = rep.doc(i) if r_seen is not None else None
        if o is not None:
            o_state, _outputs = fold(o_state, o)
        if r is not None:
            r_state, _outputs = fold(r_state, r)
        state_diff = None
        if o is not None and r is not None:
            state_diff = first_difference(observable(o_state), observable(r_state), memo=state_memo)
            state_memo.advance()
        id_issue = ids.observe(o, r) if o is not None and r is not None else None
        found = _divergence_at(i, o, r, state_diff, previous_state_diff, id_issue, from_seq, orig, rep, minted,
                               requests)
        previous_state_diff = _diff_identity(state_diff)
        if found is not None:
            divergences.append(found)
            if not collect_all:
                break
    if alignment is not None and not alignment.identity:
        divergences = _with_join_divergences(divergences, _join_divergences(orig, own_rep, alignment), collect_all)

    has_refusal = any(d.kind == "refusal" for d in divergences)
    if binding_diff:
        verdict: Verdict = "what-if"
    elif has_refusal:
        verdict = "diverged_at_refusal"
    elif divergences:
        verdict = "diverged"
    else:
        verdict = "match"
    if has_refusal:
        error_code: str | None = "replay_diverged_at_refusal"
    elif divergences:
        error_code = "replay_diverged"
    else:
        error_code = None
    return ComparisonResult(
        verdict=verdict,
        error_code=error_code,
        first_divergence=divergences[0] if divergences else None,
        divergences=tuple(divergences),
        events=tuple(_replay_event(d, source_run_id, orig, rep) for d in divergences),
        compared_through=compared_through,
        binding_diff=binding_diff,
        from_seq=from_seq,
        source_run_id=source_run_id,
        collect_all=collect_all,
        strict=strict,
        reordered=tuple(reordered),
        child_pairs=_child_pairs(orig.index, rep.index),
    )


def _join_divergences(orig: _Run, own_rep: _Run, alignment: Alignment) -> list[Divergence]:
    # Where lanes meet (and at the end) the whole state must not depend on the interleaving:
    # compare it in the replay's own order, not the re-laid one.
    checks = [(o, alignment.pairs[o]) for o, doc in orig.index.items()
              if doc.get("type") in JOIN_TYPES and o in alignment.pairs]
    checks.append((max(orig.index), max(own_rep.index)))
    o_states = _observables_at(orig, {o_seq for o_seq, _ in checks})
    r_states = _observables_at(own_rep, {r_seq for _, r_seq in checks})
    out: list[Divergence] = []
    seen: set[int] = set()
    for o_seq, r_seq in checks:
        if o_seq in seen:
            continue
        seen.add(o_seq)
        diff = first_difference(o_states[o_seq], r_states[r_seq])
        if diff is None:
            continue
        path, expected, actual = diff
        o = orig.index[o_seq]
        out.append(Divergence(
            engine="comparison", at_sequence=o_seq, kind="output", original_event_id=o.get("eventId"),
            node_id=_node_id(o), event_type=o.get("type"), path=path, expected=_plain(expected),
            actual=_plain(actual), aspect="state",
            detail=f"whole observable state differs where the lanes join (replay sequence {r_seq})",
        ))
    return out


def _observables_at(run: _Run, sequences: set[int]) -> dict[int, dict[str, Any]]:
    """The observable state after each of ``sequences``: the shared fold over the run, the states asked for kept."""
    out: dict[int, dict[str, Any]] = {}
    last = max(sequences)
    state = None
    for seq in run.index:
        if seq > last:
            break
        state, _outputs = fold(state, run.doc(seq))
        if seq in sequences:
            out[seq] = observable(state)
    return out


def _with_join_divergences(found: list[Divergence], joins: list[Divergence], collect_all: bool) -> list[Divergence]:
    at = {d.at_sequence for d in found}
    merged = sorted(found + [d for d in joins if d.at_sequence not in at], key=lambda d: d.at_sequence)
    return merged if collect_all else merged[:1]


def _child_pairs(
    orig: Mapping[int, Mapping[str, Any]], rep: Mapping[int, Mapping[str, Any]]
) -> tuple[ChildPair, ...]:
    # The dispatch pairing: the replay event at the same (re-laid) index names the replay's child.
    out: dict[str, ChildPair] = {}
    for seq, o in orig.items():
        child = o.get("payload", {}).get("childRunId") if isinstance(o.get("payload"), Mapping) else None
        if not isinstance(child, str) or child in out or child == o.get("runId"):
            continue
        r = rep.get(seq)
        r_payload = r.get("payload") if r is not None and r.get("type") == o.get("type") else None
        r_child = r_payload.get("childRunId") if isinstance(r_payload, Mapping) else None
        worker = next((o["payload"][k] for k in ("workerId", "childWorkflowId")
                       if isinstance(o["payload"].get(k), str)), None)
        out[child] = ChildPair(seq, worker, child, r_child if isinstance(r_child, str) else None)
    return tuple(out.values())


def _extra(i: int, r: Mapping[str, Any], detail: str) -> Divergence:
    return Divergence(
        engine="comparison", at_sequence=i, kind="extra", original_event_id=None, path=None,
        expected=None, actual=r.get("type"), node_id=_node_id(r), aspect="type",
        event_type=r.get("type"), detail=detail,
    )


class _Common(TypedDict):
    """The Divergence arguments every check of one index shares."""

    engine: DivergenceEngine
    at_sequence: int
    original_event_id: str | None
    node_id: str | None
    event_type: str | None


def _divergence_at(
    i: int,
    o: Mapping[str, Any] | None,
    r: Mapping[str, Any] | None,
    state_diff: tuple[str, Any, Any] | None,
    previous_state_diff: tuple[str, bytes, bytes] | None,
    id_issue: tuple[str, Any, Any, str] | None,
    from_seq: int,
    orig: _Run,
    rep: _Run,
    minted: _MintedIds,
    requests: bool,
) -> Divergence | None:
    if r is None:
        assert o is not None
        return Divergence(
            engine="comparison", at_sequence=i, kind="missing", original_event_id=o.get("eventId"), path=None,
            expected=o.get("type"), actual=None, node_id=_node_id(o), aspect="type",
            event_type=o.get("type"), detail="the replay has no event at this sequence",
        )
    if o is None:
        return _extra(i, r, "the original has no event at this sequence")
    o_type, r_type = o.get("type"), r.get("type")
    common: _Common = {"engine": "comparison", "at_sequence": i, "original_event_id": o.get("eventId"),
                       "node_id": _node_id(o) or _node_id(r), "event_type": o_type}
    if o_type != r_type and o_type in _ENVELOPE_KIND and r_type in _ENVELOPE_KIND:
        refusal = r if r_type == REFUSAL else o
        reason = _refusal_reason(refusal)
        return Divergence(
            kind="refusal", path="envelopeKind", expected=_ENVELOPE_KIND[o_type],
            actual=_ENVELOPE_KIND[r_type], aspect="refusal",
            detail=f"{_ENVELOPE_KIND[o_type]} envelope became {_ENVELOPE_KIND[r_type]}"
            + (f": {reason}" if reason else ""),
            **common,
        )
    if o_type != r_type:
        return Divergence(kind="type-mismatch", path="type", expected=o_type, actual=r_type,
                          aspect="type", **common)
    if state_diff is not None and _diff_identity(state_diff) != previous_state_diff:
        path, expected, actual = state_diff
        return Divergence(
            kind="output", path=path, expected=_plain(expected), actual=_plain(actual),
            aspect="state", detail=_absence_note(expected, actual) or "observable state differs",
            **common,
        )
    if o_type == STARTED and requests:
        changed_request = _request_divergence(o, r, minted, common)
        if changed_request is not None:
            return changed_request
    in_suffix = i >= from_seq
    field_diff = first_difference(
        _compared_view(o, in_suffix), _compared_view(r, in_suffix), ignore=_volatile_for(o_type), ids=minted.ids
    )
    if field_diff is not None:
        path, expected, actual = field_diff
        detail = _absence_note(expected, actual)
        if isinstance(actual, str) and actual in minted.ids:
            detail = f"the replay's minted id {actual} stands for the original's {minted.ids[actual]}"
        return Divergence(
            kind="output", path=path, expected=_plain(expected), actual=_plain(actual),
            aspect="result" if in_suffix else "prefix", detail=detail, **common,
        )
    causation = _causation_mismatch(o, r, orig, rep)
    if causation is not None:
        expected, actual, detail = causation
        return Divergence(kind="output", path="causationId", expected=expected, actual=actual,
                          aspect="causation", detail=detail, **common)
    if id_issue is not None:
        path, expected, actual, detail = id_issue
        return Divergence(kind="output", path=path, expected=expected, actual=actual,
                          aspect="causation", detail=detail, **common)
    return None


class _IdMap:
    """The original↔replay pairing of minted ids, learned in sequence order."""

    def __init__(self, original_run: Any, replay_run: Any) -> None:
        self._forward: dict[Any, Any] = {}
        self._backward: dict[Any, Any] = {}
        if isinstance(original_run, str) and isinstance(replay_run, str):
            self._forward[original_run] = replay_run
            self._backward[replay_run] = original_run

    def observe(self, o: Mapping[str, Any], r: Mapping[str, Any]) -> tuple[str, Any, Any, str] | None:
        """Learn the pairs ``o``/``r`` carry; the first inconsistent one as (path, expected, actual, why)."""
        o_payload, r_payload = o.get("payload"), r.get("payload")
        if not isinstance(o_payload, Mapping) or not isinstance(r_payload, Mapping):
            return None
        problem = None
        for name in MINTED_ID_FIELDS:
            o_id, r_id = o_payload.get(name, ABSENT), r_payload.get(name, ABSENT)
            found = self._pair(o_id, r_id)
            if found is not None and problem is None:
                problem = (f"payload.{name}",) + found
        return problem

    def _pair(self, o_id: Any, r_id: Any) -> tuple[Any, Any, str] | None:
        if o_id is ABSENT and r_id is ABSENT:
            return None
        if o_id is ABSENT or r_id is ABSENT or not isinstance(o_id, str) or not isinstance(r_id, str):
            if _identity_bytes(o_id) == _identity_bytes(r_id):
                return None
            return _plain(o_id), _plain(r_id), _absence_note(o_id, r_id) or "id of another kind"
        if o_id == r_id:
            return None  # reproduced verbatim (a copied prefix, a fixed id): trivially consistent
        if o_id in self._forward:
            if self._forward[o_id] == r_id:
                return None
            return self._forward[o_id], r_id, f"original id {o_id} was replayed as {self._forward[o_id]} before"
        if r_id in self._backward:
            return None, r_id, f"replay id {r_id} already stands for original id {self._backward[r_id]}"
        self._forward[o_id] = r_id
        self._backward[r_id] = o_id
        return None


class _MintedIds:
    """Each id the replay minted, with the original's id it stands for (:attr:`ids`, replay id → original id).

    Learned before the comparison from every index where both runs have an event of one type: the
    :data:`MINTED_ID_FIELDS` and :data:`_MINTED_ID_PATHS` of the two, paired in sequence order (the
    first pairing of an id holds). A model's tool-call id is minted in its response, before any tool
    event names it, so it cannot be learned as the comparison walks. Every string of a replay payload
    equal to a minted id then stands for the original's id, wherever it is (an envelope, a later
    request's messages), so ids never count. Whether the pairing is consistent is :class:`_IdMap`'s check.
    """

    def __init__(self, original_run: Any, replay_run: Any) -> None:
        self.ids: dict[str, str] = {}
        self._taken: set[str] = set()
        self._pair(original_run, replay_run)

    @classmethod
    def learned(cls, orig: _Run, rep: _Run, original_run: Any, replay_run: Any) -> _MintedIds:
        ids = cls(original_run, replay_run)
        for seq, o in orig.index.items():
            r = rep.index.get(seq)
            if r is None or r.get("type") != o.get("type"):
                continue
            o_ids, r_ids = orig.minted(seq), rep.minted(seq)
            if o_ids is None or r_ids is None:
                continue
            for o_id, r_id in zip(o_ids[0], r_ids[0], strict=True):
                ids._pair(o_id, r_id)
            for o_found, r_found in zip(o_ids[1], r_ids[1], strict=True):
                if len(o_found) == len(r_found):
                    for o_id, r_id in zip(o_found, r_found, strict=True):
                        ids._pair(o_id, r_id)
        ids.ids = {r_id: o_id for r_id, o_id in ids.ids.items() if r_id != o_id}
        return ids

    def _pair(self, o_id: Any, r_id: Any) -> None:
        if not isinstance(o_id, str) or not isinstance(r_id, str):
            return
        if r_id in self.ids or o_id in self._taken:
            return
        self.ids[r_id] = o_id
        self._taken.add(o_id)

    def translated(self, value: Any) -> Any:
        """``value`` with every minted id in it replaced by the original's (``value`` itself when none is)."""
        return _replaced(value, self.ids) if self.ids else value


def _replaced(value: Any, table: Mapping[str, str]) -> Any:
    """``value`` with each string that is a key of ``table`` replaced; untouched branches are shared."""
    if isinstance(value, str):
        return table.get(value, value)
    if isinstance(value, dict):
        changed: dict[str, Any] | None = None
        for key, item in value.items():
            new = _replaced(item, table)
            if new is not item:
                changed = changed if changed is not None else dict(value)
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        items: list[Any] | None = None
        for n, item in enumerate(value):
            new = _replaced(item, table)
            if new is not item:
                items = items if items is not None else list(value)
                items[n] = new
        return value if items is None else items
    return value


#: At most this many differing request fields are named in the detail of a divergence with aspect ``request``.
_REQUEST_FIELDS_NAMED = 5


def _request_divergence(o: Mapping[str, Any], r: Mapping[str, Any], minted: _MintedIds,
                        common: _Common) -> Divergence | None:
    """A changed LLM request, judged by what its cache key sees (the original's recipe's projection).

    The replay's request is read through the minted-id pairing. Requests equal but for volatile
    fields are the same request, found without projecting them; only requests that differ are
    projected and diffed (naming the fields costs a JCS text per value). Without a request on
    either side the recorded cache keys are all there is to compare.
    """
    o_payload, r_payload = o.get("payload"), r.get("payload")
    if not isinstance(o_payload, Mapping) or not isinstance(r_payload, Mapping):
        return None
    o_request, r_request = o_payload.get("request"), r_payload.get("request")
    recipe: str = o_payload["recipe"] if isinstance(o_payload.get("recipe"), str) else "v2"
    if not isinstance(o_request, dict) or not isinstance(r_request, dict):
        o_key, r_key = o_payload.get("cacheKey"), r_payload.get("cacheKey")
        if not isinstance(o_key, str) or not isinstance(r_key, str) or o_key == r_key:
            return None
        return Divergence(kind="output", path="payload.cacheKey", expected=o_key, actual=r_key, aspect="request",
                          detail="another request: the cache keys differ (no request recorded to say where)",
                          **common)
    if _same(o_request, r_request) or first_difference(
            o_request, r_request, "payload.request", ignore=_volatile_for(STARTED), ids=minted.ids) is None:
        return None
    diff = request_diff(_without_volatile_request(o_request),
                        _without_volatile_request(minted.translated(r_request)), recipe)
    if not diff:
        return None
    named = [_request_path(d["path"], recipe) for d in diff[:_REQUEST_FIELDS_NAMED]]
    more = f" and {len(diff) - len(named)} more" if len(diff) > len(named) else ""
    first = diff[0]
    return Divergence(
        kind="output", path=named[0], expected=first.get("recorded"), actual=first.get("requested"),
        aspect="request", detail=f"another request: its cache key ({recipe}) differs at {', '.join(named)}{more}",
        **common,
    )


def _without_volatile_request(request: dict[str, Any]) -> Any:
    return strip_volatile({"type": STARTED, "payload": {"request": request}})["payload"]["request"]


def _request_path(projected: str, recipe: str) -> str:
    """A path into the recipe's projection (``request.messages[0]`` under v2) as a path into the event."""
    try:
        segments = parse_path(projected)
    except ValueError:  # "(whole request)"
        return "payload.request"
    if recipe in ("v2", RECIPE_IDS["v2"]) and segments[:1] == ("request",):
        segments = segments[1:]
    return format_path(("payload", "request", *segments))


def _diff_identity(diff: tuple[str, Any, Any] | None) -> tuple[str, bytes, bytes] | None:
    if diff is None:
        return None
    path, expected, actual = diff
    return path, _identity_bytes(expected), _identity_bytes(actual)


def _identity_bytes(value: Any) -> bytes:
    return b"\x00absent" if value is ABSENT else jcs(value)


def _compared_view(doc: Mapping[str, Any], in_suffix: bool) -> dict[str, Any]:
    # Volatile fields are not stripped here but skipped where they differ (_volatile_for): the
    # same judgement as comparing strip_volatile() of both sides — a difference at or beneath a
    # volatile path never counts, a container present on one side only still does — without
    # rewriting every event. Shallow copies suffice: only top- and payload-level keys go.
    view = dict(doc)
    for name in _NOT_FIELD_COMPARED:
        view.pop(name, None)
    payload = view.get("payload")
    if isinstance(payload, dict):
        payload = view["payload"] = dict(payload)
        for name in MINTED_ID_FIELDS:
            payload.pop(name, None)
        # The store's note of what redaction did to the event as published, not what the program did: a replay
        # served a recorded (already redacted) result publishes nothing to redact. The content is compared as
        # stored on both sides, redacted alike (agentlog.replay.regression applies the policy to a local replay).
        payload.pop(REDACTIONS, None)
    if doc.get("type") == "run.started" and isinstance(payload, dict):
        for name in _RUN_LABELS:
            payload.pop(name, None)
    if in_suffix:
        for parent, name in _CALL_BYTES.get(doc.get("type", ""), ()):
            holder = view.get(parent)
            if isinstance(holder, dict):
                holder.pop(name, None)
    return view


def _alignment_key(doc: Mapping[str, Any]) -> bytes:
    # What the lanes take for one event: every field the comparison from fromSeq on compares, as
    # JCS — volatile fields, call bytes, references and minted ids left out, as they are there.
    return jcs(strip_volatile(_compared_view(doc, in_suffix=True)))


def _volatile_for(event_type: Any) -> Callable[[str], bool]:
    kind = str(event_type)
    return lambda path: is_volatile(kind, path)


def _causation_mismatch(
    o: Mapping[str, Any], r: Mapping[str, Any], orig: _Run, rep: _Run
) -> tuple[Any, Any, str] | None:
    o_cause, r_cause = o.get("causationId"), r.get("causationId")
    if o_cause is None and r_cause is None:
        return None
    o_seq = orig.sequence_of(o_cause)
    if o_seq is None:
        # Points outside the run (another host) or nowhere: only the same id reproduces it.
        if o_cause == r_cause:
            return None
        return o_cause, r_cause, "original causation is not an event of the run; ids must be equal"
    expected = rep.index.get(o_seq, {}).get("eventId")
    if r_cause == expected and expected is not None:
        return None
    r_seq = rep.sequence_of(r_cause)
    where = "nothing in the replay" if r_seq is None else f"sequence {r_seq}"
    return expected, r_cause, f"original is caused by sequence {o_seq}; the replay by {where}"


# ---------------------------------------------------------------------------------------------
# Runs as the comparison reads them


class _Run:
    """One run's events by sequence, as the comparison reads them.

    :attr:`index` holds, by sequence and in sequence order, what the checks look up across the run:
    the event itself for a run given as a list, a :class:`_Compact` record for a :class:`StoredRun`.
    :meth:`doc` gives the whole event at one sequence, :meth:`minted` the minted ids it carries, and
    :attr:`key` is the lanes' alignment key of an :attr:`index` value.
    """

    index: Mapping[int, Mapping[str, Any]]
    key: Callable[[Any], Hashable]

    def __init__(self) -> None:
        self._ids: dict[Any, int] | None = None

    def doc(self, seq: int) -> Mapping[str, Any]:
        raise NotImplementedError

    def minted(self, seq: int) -> _Candidates:
        raise NotImplementedError

    def sequence_of(self, event_id: Any) -> int | None:
        """The sequence of the event with ``event_id`` (the last, should two share it)."""
        if not isinstance(event_id, str):
            return None
        if self._ids is None:
            self._ids = {doc.get("eventId"): seq for seq, doc in self.index.items()}
        return self._ids.get(event_id)

    @property
    def run_id(self) -> Any:
        return next(iter(self.index.values())).get("runId")

    def started(self) -> Mapping[str, Any] | None:
        """The first ``run.started`` in sequence order."""
        seq = next((seq for seq, doc in self.index.items() if doc.get("type") == "run.started"), None)
        return None if seq is None else self.doc(seq)


class _ListedRun(_Run):
    """A run given as its events in memory."""

    def __init__(self, events: Iterable[Mapping[str, Any]], side: str) -> None:
        super().__init__()
        out: dict[int, Mapping[str, Any]] = {}
        for doc in events:
            seq = doc.get("sequence") if isinstance(doc, Mapping) else None
            if type(seq) is not int or seq < 0:
                raise ReplayError(_BAD_SEQUENCE.format(side=side, seq=seq))
            if seq in out:
                raise ReplayError(_TWO_AT.format(side=side, seq=seq))
            out[seq] = doc
        if not out:
            raise ReplayError(_NO_EVENTS.format(side=side))
        self.index = dict(sorted(out.items()))
        self.key = _alignment_key

    def doc(self, seq: int) -> Mapping[str, Any]:
        return self.index[seq]

    def minted(self, seq: int) -> _Candidates:
        return _minted_candidates(self.index[seq])


_BAD_SEQUENCE = "{side} run has an event without a valid sequence: {seq!r}"
_TWO_AT = "{side} run has two events at sequence {seq}; pass one run's committed log"
_NO_EVENTS = "{side} run has no events; nothing to compare"


class StoredRun(_Run):
    """A run whose events stay where they are stored (an export file), read back one at a time.

    :meth:`add` takes each event as it is read, with the position ``read`` gives it back from; the
    run keeps a :class:`_Compact` record per event — its type, node, ids and the names of what it is
    about, never its content — so comparing two runs holds what the records take plus the events of
    one index, however large the events are. The comparison reads each event once in sequence order;
    the lanes read again only the events of the lanes a replay changed.
    """

    def __init__(self, read: Callable[[int], Mapping[str, Any]], *, shared: dict[Any, Any] | None = None) -> None:
        super().__init__()
        self._read = read
        self._records: dict[int, _Compact] = {}
        self._positions = array("q")  # every event's, in the order added, those of a run with a problem too
        self._problem: str | None = None
        self._shared: dict[Any, Any] = {} if shared is None else shared
        self.key = _stored_key

    def add(self, doc: Mapping[str, Any], position: int) -> None:
        """One event of the run, readable again at ``position``; a problem with its sequence is kept for
        the comparison to report (a run that is never compared has none to report)."""
        seq = doc.get("sequence")
        self._positions.append(position)
        if self._problem is not None:
            return
        if type(seq) is not int or seq < 0:
            self._problem = _BAD_SEQUENCE.format(side="{side}", seq=seq)
        elif seq in self._records:
            self._problem = _TWO_AT.format(side="{side}", seq=seq)
        else:
            self._records[seq] = _Compact(doc, position, self._read, self._shared)

    def checked(self, side: str) -> StoredRun:
        """This run, ready to compare as ``side``.

        Raises:
            ReplayError: as :func:`compare_runs` for a list of these events.
        """
        if self._problem is not None:
            raise ReplayError(self._problem.replace("{side}", side, 1))
        if not self._records:
            raise ReplayError(_NO_EVENTS.format(side=side))
        if getattr(self, "index", None) is not self._records:
            self._records = dict(sorted(self._records.items()))
            self.index = self._records
        return self

    def __len__(self) -> int:
        return len(self._positions)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        """The run's events in the order added, each read back as it is handed over."""
        for position in self._positions:
            yield self._read(position)

    def doc(self, seq: int) -> Mapping[str, Any]:
        return self._read(self._records[seq].position)

    def minted(self, seq: int) -> _Candidates:
        return self._records[seq].minted


def _stored_key(record: _Compact) -> Hashable:
    # Only lanes whose events differ in identity need the key: read back then, and kept as a digest.
    if record.key is None:
        record.key = _digest(_alignment_key(record.read(record.position)))
    return record.key


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def _lane_key(orig: _Run, rep: _Run) -> Callable[[Any], Hashable]:
    """The alignment key both sides are read with: their own when it is one, else the digest of each event's."""
    if orig.key is rep.key:
        return orig.key
    return lambda value: _stored_key(value) if isinstance(value, _Compact) else _digest(_alignment_key(value))


class _RelaidRun(_Run):
    """The replay laid out in the original's order (:meth:`agentlog.replay.lanes.Alignment.relaid_sequences`)."""

    def __init__(self, own: _Run, sequences: Mapping[int, int]) -> None:
        super().__init__()
        self._own, self._sequences = own, sequences
        if isinstance(own, _ListedRun):  # as the list the run came as: copies with the new sequence
            self.index = {seq: {**own.index[r_seq], "sequence": seq} for seq, r_seq in sequences.items()}
        else:
            self.index = {seq: own.index[r_seq] for seq, r_seq in sequences.items()}
        self.key = own.key

    def doc(self, seq: int) -> Mapping[str, Any]:
        if isinstance(self._own, _ListedRun):
            return self.index[seq]
        return {**self._own.doc(self._sequences[seq]), "sequence": seq}

    def minted(self, seq: int) -> _Candidates:
        return self._own.minted(self._sequences[seq])


def _run(events: Sequence[Mapping[str, Any]] | StoredRun, side: str) -> _Run:
    return events.checked(side) if isinstance(events, StoredRun) else _ListedRun(events, side)


#: The minted ids one event carries (:class:`_MintedIds`): its :data:`MINTED_ID_FIELDS`, then what each of
#: :data:`_MINTED_ID_PATHS` finds; ``None`` when its payload is no object. Only strings can be ids: any other
#: value is kept as ``None``, so lists keep their lengths.
_Candidates = tuple[tuple[str | None, ...], tuple[tuple[str | None, ...], ...]] | None


def _minted_candidates(doc: Mapping[str, Any]) -> _Candidates:
    payload = doc.get("payload")
    if not isinstance(payload, Mapping):
        return None
    fields = tuple(v if isinstance(v := payload.get(name), str) else None for name in MINTED_ID_FIELDS)
    found = tuple(tuple(v if isinstance(v, str) else None for v in get_path(doc, path))
                  for path in _MINTED_ID_PATHS.get(str(doc.get("type")), ()))
    return fields, found


#: The payload fields a :class:`_Compact` keeps (string values only): what lanes, child pairs and node ids read.
_NAMED_FIELDS = tuple(dict.fromkeys((*PAYLOAD_NAMES, "nodeId", "childRunId")))


class _Compact(Mapping[str, Any]):
    """What the comparison looks up across a stored run for one event.

    ``type``, ``nodeId``, ``eventId``, ``runId`` and a ``payload`` of only the names in it
    (:data:`_NAMED_FIELDS`); where the event is stored and how to read it back; the minted ids it
    carries; once a lane needs it, its alignment key. Values that repeat from event to event (types,
    nodes, runs, names) are shared, not kept once per event.
    """

    __slots__ = ("event_id", "key", "minted", "names", "node_id", "position", "read", "run_id", "type")

    #: The event fields a record answers, by the slot that holds each.
    _SLOTS = {"type": "type", "nodeId": "node_id", "eventId": "event_id", "runId": "run_id", "payload": "names"}

    def __init__(self, doc: Mapping[str, Any], position: int, read: Callable[[int], Mapping[str, Any]],
                 shared: dict[Any, Any]) -> None:
        payload = doc.get("payload")
        names: dict[str, str] | None = None
        if isinstance(payload, Mapping):
            names = {name: _shared(shared, value) for name in _NAMED_FIELDS
                     if isinstance(value := payload.get(name), str)}
        self.type = _shared(shared, doc.get("type"))
        self.node_id = _shared(shared, doc.get("nodeId"))
        self.event_id = doc.get("eventId")
        self.run_id = _shared(shared, doc.get("runId"))
        self.names = _shared(shared, names)
        self.minted: _Candidates = _shared(shared, _minted_candidates(doc))
        self.position, self.read = position, read
        self.key: Hashable | None = None

    def __getitem__(self, name: str) -> Any:
        slot = self._SLOTS.get(name)
        value = None if slot is None else getattr(self, slot)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name, slot in self._SLOTS.items() if getattr(self, slot) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return True  # a record stands for an event, as a doc does, even one without these fields


def _shared(table: dict[Any, Any], value: Any) -> Any:
    """``value``, or an equal one seen before (one object for all the events that repeat it)."""
    if isinstance(value, dict):
        key: Any = ("dict", *value.items())
        return table.setdefault(key, value)
    if isinstance(value, tuple):  # its strings shared; itself only when it holds no id, which would not repeat
        value = tuple(_shared(table, v) for v in value)
        if any(isinstance(v, str) for v in value):
            return value
        return table.setdefault(("tuple", value), value)
    try:
        return table.setdefault(value, value)
    except TypeError:  # not hashable (a malformed event): kept as it is
        return value


class _RecentMemo(dict[tuple[int, int], tuple[Any, Any]]):
    """A :func:`first_difference` memo that remembers the pairs proven equal at the last comparison only.

    The fold's states share every unchanged sub-object with their predecessor, so the pairs the last
    index proved equal are the ones this index meets again; older ones would hold states the walk has
    left behind. :meth:`advance` after each comparison.
    """

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[int, int], tuple[Any, Any]] = {}

    def __contains__(self, pair: object) -> bool:
        if dict.__contains__(self, pair):
            return True
        held = self._last.get(pair)  # type: ignore[call-overload]
        if held is None:
            return False
        self[pair] = held  # type: ignore[index]
        return True

    def advance(self) -> None:
        self._last = dict(self)
        self.clear()


def _replay_from_seq(rep: _Run) -> int:
    started = rep.started()
    payload = started.get("payload") if started else None
    replay_of = payload.get("replayOf") if isinstance(payload, Mapping) else None
    value = replay_of.get("fromSeq") if isinstance(replay_of, Mapping) else None
    return value if type(value) is int and value >= 0 else 0


def _bindings(run: _Run) -> dict[str, Any]:
    started = run.started()
    if started is None:
        return {}
    payload = started.get("payload")
    declared = payload.get("bindings") if isinstance(payload, Mapping) else None
    out = {k: declared[k] for k in BINDING_KEYS if isinstance(declared, Mapping) and k in declared}
    if "engineVersion" not in out and started.get("engineVersion") is not None:
        out["engineVersion"] = started["engineVersion"]
    return out


def _binding_diff(orig: _Run, rep: _Run) -> dict[str, dict[str, Any]]:
    o, r = _bindings(orig), _bindings(rep)
    return {
        key: {"expected": o.get(key), "actual": r.get(key)}
        for key in BINDING_KEYS
        if (key in o or key in r) and not (key in o and key in r and _same(o[key], r[key]))
    }


def _node_id(doc: Mapping[str, Any]) -> str | None:
    node = doc.get("nodeId")
    if node is None and isinstance(doc.get("payload"), Mapping):
        node = doc["payload"].get("nodeId")
    return node if isinstance(node, str) else None


def _refusal_reason(doc: Mapping[str, Any]) -> str | None:
    payload = doc.get("payload")
    if not isinstance(payload, Mapping):
        return None
    for key in ("reason", "refusalText", "safetyCategory"):
        if isinstance(reason := payload.get(key), str):
            return reason
    return None


def _replay_event(d: Divergence, source_run_id: str | None, orig: _Run, rep: _Run) -> dict[str, Any]:
    payload: dict[str, Any] = {"sourceRunId": source_run_id, "atSequence": d.at_sequence}
    if d.kind == "refusal":
        payload["originalEnvelopeKind"] = d.expected
        payload["replayEnvelopeKind"] = d.actual
        if d.original_event_id is not None:
            payload["originalEventId"] = d.original_event_id
        if d.node_id is not None:
            payload["nodeId"] = d.node_id
        refusal = rep.doc(d.at_sequence) if d.actual == "refusal" else orig.doc(d.at_sequence)
        reason = _refusal_reason(refusal)
        if reason is not None:
            payload["refusalReason"] = reason
        return {"type": "replay.divergedAtRefusal", "payload": payload}
    if d.original_event_id is not None:
        payload["originalEventId"] = d.original_event_id
    payload["divergenceKind"] = d.kind
    if d.kind == "extra":  # the inserted event, not the source event it departs before
        payload["divergencePoint"] = d.actual
    else:
        point = orig.index.get(d.at_sequence) or rep.index.get(d.at_sequence) or {}
        payload["divergencePoint"] = point.get("type")
    return {"type": "replay.diverged", "payload": payload}


# ---------------------------------------------------------------------------------------------
# AOS structured outcomes


def compare_outcome(
    original: Mapping[str, Any],
    replay: Mapping[str, Any],
    *,
    deterministic_fields: Mapping[str, Any] | Sequence[str],
    ignored_fields: Sequence[str],
    at_sequence: int = 0,
) -> list[Divergence]:
    """Compare two AOS StructuredOutcomes on their declared deterministic fields (PIN-009).

    Only ``deterministic_fields`` (a list of paths, or the fixture's path → example-value map)
    are compared: the field-stability table is the contract, so a field it does not declare
    compared cannot diverge. Paths are dotted, with ``[*]`` for every list element and a
    trailing ``.length`` for a list's length. ``ignored_fields`` must not overlap the
    deterministic ones — a field declared both ways is a broken table, not a judgement call.

    Raises:
        ReplayError: a path is declared both deterministic and ignored.
    """
    paths = list(deterministic_fields)
    overlap = sorted(set(paths) & set(ignored_fields))
    if overlap:
        raise ReplayError(f"fields declared both deterministic and ignored: {', '.join(overlap)}")
    out: list[Divergence] = []
    for path in paths:
        expected, actual = _outcome_value(original, path), _outcome_value(replay, path)
        if _identity_bytes(expected) != _identity_bytes(actual):
            out.append(Divergence(
                engine="comparison", at_sequence=at_sequence, kind="output", original_event_id=None, path=path,
                expected=_plain(expected), actual=_plain(actual), aspect="result",
                detail=_absence_note(expected, actual),
            ))
    return out


def _outcome_value(doc: Mapping[str, Any], path: str) -> Any:
    if path.endswith(".length"):
        value = _outcome_value(doc, path[: -len(".length")])
        return len(value) if isinstance(value, list) else ABSENT
    value = get_path(doc, path)
    return ABSENT if value is MISSING else value


# ---------------------------------------------------------------------------------------------
# Metrics


class ReplayCounters:
    """Per-aspect match/mismatch counts (AOS ``replay_behavior_{match,mismatch}_total{aspect}``).

    A fail-fast comparison that stopped early counts only what it established: the bindings
    (checked up front) and the aspect that diverged; the aspects it never reached count neither way.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._match: Counter[str] = Counter()
        self._mismatch: Counter[str] = Counter()

    def record(self, result: ComparisonResult) -> None:
        mismatched = {d.aspect for d in result.divergences}
        if result.binding_diff:
            mismatched.add("bindings")
        matched = set(ASPECTS) - mismatched if result.exhaustive else {"bindings"} - mismatched
        with self._lock:
            self._mismatch.update(mismatched)
            self._match.update(matched)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{"match": {aspect: n}, "mismatch": {aspect: n}}`` over every aspect (zeros included)."""
        with self._lock:
            return {
                "match": {a: self._match[a] for a in ASPECTS},
                "mismatch": {a: self._mismatch[a] for a in ASPECTS},
            }

    def reset(self) -> None:
        with self._lock:
            self._match.clear()
            self._mismatch.clear()


#: The process-wide counters the worker exports.
REPLAY_COUNTERS = ReplayCounters()


def record(result: ComparisonResult, counters: ReplayCounters | None = None) -> None:
    """Count one comparison into ``counters`` (default: the process-wide :data:`REPLAY_COUNTERS`)."""
    (counters or REPLAY_COUNTERS).record(result)

