"""Trees: a replay is judged on its whole run tree, not only the run that was replayed.

A handoff creates a child run, and a host replaying the parent re-creates the children under
new run ids. Comparing the parent alone pairs those ids (``childRunId`` through the id mapping)
but cannot see inside them, so a worker that behaved differently in its own run would be
invisible in the parent's verdict. :func:`compare_tree` follows every dispatch of the source run
to the replay's child for the same dispatch (:class:`agentlog.replay.compare.ChildPair`, the
replay event paired with the original's — per lane unless strict) and compares the two child
runs with the same engine, recursively.

The tree's verdict is its first divergence in source order: a run's own divergence at sequence
``d`` comes before a child dispatched at a later sequence, after a child dispatched earlier.
That divergence is reported with its ``tree_path`` — one hop per run boundary crossed
(``{sourceRunId, replayRunId, atSequence, worker, sourceChildRunId, replayChildRunId}``) —
so ``parent → worker-1 (child run) → sequence 7`` reads straight off the result. A child the
original dispatched but the replay did not create (no child named, or no events for it) is a
``missing`` divergence at sequence 0 of that child. A child whose *original* log is not among
the runs given cannot be compared; it is listed in ``unchecked`` rather than passed over in
silence (the CLI names it, the host replay waits for it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

from agentlog.replay.compare import ChildPair, ComparisonResult, StoredRun, compare_runs
from agentlog.replay.divergence import Divergence
from agentlog.replay.exported import export_object
from agentlog.schemas.canonical import loads_strict
from agentlog.schemas.errors import AgentlogError, ReplayError

__all__ = ["TreeComparison", "compare_tree", "group_runs", "stored_tree"]

#: A run's events: in memory, or a :class:`agentlog.replay.compare.StoredRun` read back as it is compared.
Events: TypeAlias = Sequence[Mapping[str, Any]] | StoredRun


@dataclass(frozen=True)
class TreeComparison:
    """The root's :class:`ComparisonResult` carrying the tree's verdict, and what could not be checked.

    ``unchecked`` are the hops to child runs whose original log was not available.
    """

    result: ComparisonResult
    unchecked: tuple[dict[str, Any], ...] = ()


def group_runs(events: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, list[Mapping[str, Any]]]]:
    """Events of several runs (an exported tree) by runId, with the first event's run as the root."""
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for doc in events:
        runs.setdefault(str(doc.get("runId")), []).append(doc)
    root = str(events[0].get("runId")) if events else ""
    return root, runs


@contextmanager
def stored_tree(path: Path) -> Iterator[tuple[str, dict[str, StoredRun]]]:
    """The runs of an export file (:func:`group_runs` of its events), each a :class:`StoredRun` read back from the
    file as the comparison goes: what the comparison holds does not grow with the events' content.

    The file is read once here, line by line, as :func:`agentlog.replay.exported.read_jsonl` reads it (a
    RunEventDoc or a CommittedEvent a line; blank lines skipped), and stays open until the block ends.

    Raises:
        ReplayError: the file cannot be read, a line is not a JSON object, or a line is a signed checkpoint.
    """
    try:
        file = path.open("rb")
    except OSError as e:
        raise ReplayError(f"cannot read {path}: {e}") from e
    with file:
        def read(position: int) -> Mapping[str, Any]:
            file.seek(position)
            return _event(loads_strict(file.readline().rstrip(_LINE_END)))

        runs: dict[str, StoredRun] = {}
        shared: dict[Any, Any] = {}  # what repeats from event to event, one object for the whole file
        root = ""
        for position, value in _export_objects(path, file):
            doc = _event(value)
            run_id = str(doc.get("runId"))
            if not runs:
                root = run_id
            runs.setdefault(run_id, StoredRun(read, shared=shared)).add(doc, position)
        yield root, runs


#: What ends a line; parsed without it, a JCS line (what `agentlog export` writes) is read on the strict reader's
#: fast path.
_LINE_END = b"\r\n"


def _export_objects(path: Path, file: Iterable[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(position, object)`` of every non-blank line, checked as
    :func:`agentlog.replay.exported.export_lines` checks them, with the same messages."""
    position = 0
    for number, raw in enumerate(file, start=1):
        at, position = position, position + len(raw)
        try:
            line = raw.rstrip(_LINE_END).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ReplayError(f"cannot read {path}: {e}") from e
        if not line.strip():
            continue
        try:
            value = loads_strict(line)
        except AgentlogError as e:
            raise ReplayError(f"{path}:{number}: {e}") from e
        yield at, export_object(path, number, value)


def _event(value: Any) -> dict[str, Any]:
    """A RunEventDoc, bare or out of its CommittedEvent."""
    if isinstance(value.get("doc"), dict) and "hash" in value:
        return value["doc"]  # type: ignore[no-any-return]
    return value  # type: ignore[no-any-return]


def compare_tree(
    original: Mapping[str, Events],
    replay: Mapping[str, Events],
    *,
    original_root: str,
    replay_root: str,
    from_seq: int | None = None,
    collect_all: bool = False,
    strict: bool = False,
) -> TreeComparison:
    """Compare the replay's run tree rooted at ``replay_root`` with the source tree at ``original_root``.

    ``from_seq`` applies to the roots; child runs are compared from their ``replayOf`` (else 0).

    Raises:
        ReplayError: as :func:`agentlog.replay.compare.compare_runs`, for any run of the tree.
    """
    unchecked: list[dict[str, Any]] = []
    result = _walk(original, replay, original_root, replay_root, from_seq, collect_all, strict, unchecked,
                   visited=set())
    return TreeComparison(result=result, unchecked=tuple(unchecked))


def _walk(
    original: Mapping[str, Events],
    replay: Mapping[str, Events],
    o_id: str,
    r_id: str,
    from_seq: int | None,
    collect_all: bool,
    strict: bool,
    unchecked: list[dict[str, Any]],
    visited: set[str],
) -> ComparisonResult:
    visited.add(o_id)
    result = compare_runs(original[o_id], replay[r_id], from_seq=from_seq, collect_all=collect_all, strict=strict)
    own_first = result.first_divergence.at_sequence if result.first_divergence else None
    for pair in result.child_pairs:
        if own_first is not None and pair.at_sequence > own_first:
            break  # this run's own divergence comes first in source order
        if pair.original_child in visited:
            continue
        hop = _hop(o_id, r_id, pair)
        if pair.original_child not in original:
            unchecked.append(hop)
            continue
        if pair.replay_child is None or not replay.get(pair.replay_child):
            child = _missing_child(original[pair.original_child], pair)
        else:
            child = _walk(original, replay, pair.original_child, pair.replay_child, None, collect_all, strict,
                          unchecked, visited)
            if child.reordered:
                result = replace(result, reordered=result.reordered + tuple(
                    {**r, "sourceRunId": pair.original_child} for r in child.reordered))
        if child.first_divergence is not None:
            return _carried(result, child, hop)
    return result


def _hop(o_id: str, r_id: str, pair: ChildPair) -> dict[str, Any]:
    return {"sourceRunId": o_id, "replayRunId": r_id, "atSequence": pair.at_sequence, "worker": pair.worker,
            "sourceChildRunId": pair.original_child, "replayChildRunId": pair.replay_child}


def _missing_child(original_child: Events, pair: ChildPair) -> ComparisonResult:
    first: Mapping[str, Any] = min(original_child, key=lambda d: d.get("sequence", 0)) if original_child else {}
    why = ("the replay's dispatch names no child run" if pair.replay_child is None
           else f"the replay's child run {pair.replay_child} has no events")
    d = Divergence(engine="comparison", at_sequence=0, kind="missing", path=None, expected=first.get("type"),
                   actual=None, detail=f"child run {pair.original_child} missing in the replay: {why}",
                   original_event_id=first.get("eventId"), event_type=first.get("type"))
    event = {"type": "replay.diverged", "payload": {
        "sourceRunId": pair.original_child, "atSequence": 0, **({"originalEventId": d.original_event_id}
                                                              if d.original_event_id else {}),
        "divergenceKind": "missing", "divergencePoint": first.get("type")}}
    return ComparisonResult(verdict="diverged", error_code="replay_diverged", first_divergence=d, divergences=(d,),
                            events=(event,), compared_through=-1, binding_diff={},
                            source_run_id=pair.original_child)


def _carried(parent: ComparisonResult, child: ComparisonResult, hop: dict[str, Any]) -> ComparisonResult:
    """The parent's result, judged by the child's first divergence (bindings still decide what-if)."""
    verdict = "what-if" if parent.binding_diff else child.verdict
    if verdict == "what-if" and not parent.binding_diff:
        verdict = "diverged_at_refusal" if child.error_code == "replay_diverged_at_refusal" else "diverged"
    return replace(parent, verdict=verdict, error_code=child.error_code, first_divergence=child.first_divergence,
                   divergences=child.divergences, events=child.events, tree_path=(hop,) + child.tree_path)
