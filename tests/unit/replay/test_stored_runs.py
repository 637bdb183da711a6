"""The streamed comparison (runs read back from their files, :class:`StoredRun`) says what the in-memory one says.

Every pair of the replay corpora, the golden files, the framework recordings and generated large runs is
judged both ways — lists in memory (:func:`compare_runs` of lists, :func:`group_runs`), and files read back
as the comparison walks (:func:`stored_tree`) — and the two results must be equal field for field: verdict,
every divergence (kind, index, path, expected, actual, detail), replay.* events, reordered events, child
pairs. The memory test measures what the streamed comparison of a 20,000-event run holds at its peak against
the run's serialized size, and a run's peak against the same run's with eight times the content.
"""

from __future__ import annotations

import copy
import json
import random
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentlog.replay.compare import StoredRun, compare_runs
from agentlog.replay.exported import read_jsonl
from agentlog.replay.tree import compare_tree, group_runs, stored_tree
from agentlog.schemas.errors import ReplayError
from tests.bench.bench_compare import realistic_tree, replay_tree
from tests.unit.replay.corpus import Case, concurrent_cases, sequential_cases
from tests.unit.replay.runs import index_of

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
RECORDED = HERE / "recorded"
CASES = sequential_cases() + concurrent_cases()
MODES = [{"strict": False}, {"strict": True}, {"strict": False, "collect_all": True},
         {"strict": True, "collect_all": True}]


def _write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs), encoding="utf-8")
    return path


@contextmanager
def _stored(path: Path) -> Iterator[StoredRun]:
    """The one run of a file, streamed."""
    with stored_tree(path) as (root, runs):
        assert len(runs) == 1
        yield runs[root]


def _both(tmp_path: Path, original: list[dict[str, Any]], replay: list[dict[str, Any]], **options: Any) -> None:
    in_memory = compare_runs(original, replay, **options)
    with _stored(_write(tmp_path / "o.jsonl", original)) as o, _stored(_write(tmp_path / "r.jsonl", replay)) as r:
        streamed = compare_runs(o, r, **options)
    assert streamed == in_memory
    assert streamed.to_json_dict() == in_memory.to_json_dict()


@pytest.mark.parametrize("options", MODES, ids=lambda o: "-".join(k for k, v in o.items() if v) or "lanes")
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_corpus_case_streamed_is_judged_as_in_memory(case: Case, options: dict[str, Any], tmp_path: Path) -> None:
    _both(tmp_path, case.original, case.replay, **options)


def test_events_in_any_order_in_the_file_are_judged_as_in_memory(tmp_path: Path) -> None:
    case = next(c for c in concurrent_cases(1) if "extra" in c.name)
    shuffled = list(case.replay)
    random.Random(3).shuffle(shuffled)
    _both(tmp_path, case.original, shuffled)
    _both(tmp_path, case.original, shuffled, collect_all=True)


def _golden_pairs() -> list[str]:
    return sorted(p.name.removesuffix(".original.jsonl") for p in GOLDEN.glob("*.original.jsonl"))


def _trees(original: Path, replay: Path, **options: Any) -> tuple[Any, Any]:
    o_root, o_runs = group_runs(read_jsonl(original))
    r_root, r_runs = group_runs(read_jsonl(replay))
    in_memory = compare_tree(o_runs, r_runs, original_root=o_root, replay_root=r_root, **options)
    with stored_tree(original) as (o_root, o_runs), stored_tree(replay) as (r_root, r_runs):
        streamed = compare_tree(o_runs, r_runs, original_root=o_root, replay_root=r_root, **options)
    return in_memory, streamed


@pytest.mark.parametrize("options", MODES, ids=lambda o: "-".join(k for k, v in o.items() if v) or "lanes")
@pytest.mark.parametrize("name", _golden_pairs())
def test_a_golden_tree_streamed_is_judged_as_in_memory(name: str, options: dict[str, Any]) -> None:
    in_memory, streamed = _trees(GOLDEN / f"{name}.original.jsonl", GOLDEN / f"{name}.replay.jsonl", **options)
    assert streamed == in_memory
    assert in_memory.result.verdict == ("match" if name == "match" else in_memory.result.verdict)


@pytest.mark.parametrize("name", ["langgraph", "openai_agents", "pydantic_ai"])
def test_a_framework_recording_streamed_is_judged_as_in_memory(name: str) -> None:
    recorded, divergent = RECORDED / f"{name}.recorded.jsonl", RECORDED / f"{name}.divergent.jsonl"
    for original, replay in ((recorded, divergent), (divergent, recorded), (recorded, recorded)):
        for options in MODES:
            in_memory, streamed = _trees(original, replay, **options)
            assert streamed == in_memory


def _large(events: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    original = realistic_tree("big-src", events)
    return original, replay_tree(original, "big-rep")


def _changed(replay: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The generated replay with one change each: a tool result, an LLM request, an event left out, two lanes
    interleaved the other way round, a child run's variable."""
    root = replay[0]["runId"]
    own = [d for d in replay if d["runId"] == root]
    children = [d for d in replay if d["runId"] != root]
    out: dict[str, list[dict[str, Any]]] = {}
    result = copy.deepcopy(own)
    result[index_of(result, "agent.toolReturned", 30)]["payload"]["result"]["hits"] = 4
    out["tool-result"] = result + children
    request = copy.deepcopy(own)
    request[index_of(request, "agent.invocation.started", 12)]["payload"]["request"]["temperature"] = 0.7
    out["request"] = request + children
    missing = [d for d in own if d["sequence"] != index_of(own, "channel.written", 40)]
    out["missing"] = missing + children
    swapped = copy.deepcopy(own)
    at = index_of(swapped, "agent.toolCalled", 50)  # research's tool call and the planner's usage after it
    at_usage = next(d["sequence"] for d in swapped[at:] if d["type"] == "provider.usage")
    swapped[at_usage - 1]["sequence"], swapped[at_usage]["sequence"] = at_usage, at_usage - 1
    out["interleaved"] = swapped + children
    child = copy.deepcopy(children)
    variable = next(d for d in child[len(child) // 2:] if d["type"] == "variable.changed")
    variable["payload"]["value"] = {"incidents": 4}
    out["child-variable"] = own + child
    return out


def test_generated_large_trees_streamed_are_judged_as_in_memory(tmp_path: Path) -> None:
    original, replay = _large(1_000)
    source = _write(tmp_path / "src.jsonl", original)
    verdicts = {}
    for name, changed in {"as-replayed": replay, **_changed(replay)}.items():
        target = _write(tmp_path / f"{name}.jsonl", changed)
        for options in MODES[:3]:
            in_memory, streamed = _trees(source, target, **options)
            assert streamed == in_memory, (name, options)
            verdicts[name, options.get("strict", False)] = in_memory.result
    # The changes are seen (else the equalities above would hold vacuously).
    assert verdicts["as-replayed", False].verdict == "match"
    assert verdicts["tool-result", False].first_divergence.path == "payload.result.hits"
    assert verdicts["request", False].verdict == "match"  # a changed request alone is no divergence
    assert verdicts["missing", False].verdict == "diverged"
    assert verdicts["interleaved", False].verdict == "match" and verdicts["interleaved", False].reordered
    assert verdicts["interleaved", True].verdict == "diverged"
    assert verdicts["child-variable", False].tree_path


def test_a_bad_run_in_a_file_is_the_same_error_as_in_memory(tmp_path: Path) -> None:
    original, _ = _large(40)
    root = [d for d in original if d["runId"] == original[0]["runId"]]
    twice = root + [root[5]]
    with pytest.raises(ReplayError) as in_memory:
        compare_runs(root, twice)
    with (_stored(_write(tmp_path / "o.jsonl", root)) as o, _stored(_write(tmp_path / "r.jsonl", twice)) as r,
          pytest.raises(ReplayError) as streamed):
        compare_runs(o, r)
    assert str(streamed.value) == str(in_memory.value) == (
        "replay run has two events at sequence 5; pass one run's committed log")
    unsequenced = [{**root[0], "sequence": "x"}, *root[1:]]
    with pytest.raises(ReplayError) as in_memory:
        compare_runs(unsequenced, root)
    with (_stored(_write(tmp_path / "u.jsonl", unsequenced)) as u, _stored(tmp_path / "o.jsonl") as o,
          pytest.raises(ReplayError) as streamed):
        compare_runs(u, o)
    assert str(streamed.value) == str(in_memory.value)


def _peak_of_streamed_compare(tmp_path: Path, events: int, content: int) -> tuple[int, int]:
    """(tracemalloc peak of comparing a generated run with its replay from files, the two files' bytes)."""
    original = realistic_tree("mem-src", events)
    for doc in original:
        if doc["type"] == "agent.invocation.completed":
            doc["payload"]["envelope"]["answer"] *= content
        elif doc["type"] == "agent.toolReturned":
            doc["payload"]["result"]["snippets"] *= content
    replay = replay_tree(original, "mem-rep")
    source, target = _write(tmp_path / "src.jsonl", original), _write(tmp_path / "rep.jsonl", replay)
    del original, replay
    size = source.stat().st_size + target.stat().st_size
    tracemalloc.start()
    try:
        with ExitStack() as stack:
            o_root, o_runs = stack.enter_context(stored_tree(source))
            r_root, r_runs = stack.enter_context(stored_tree(target))
            tree = compare_tree(o_runs, r_runs, original_root=o_root, replay_root=r_root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tree.result.verdict == "match"
    return peak, size


def test_the_streamed_comparison_holds_a_fraction_of_the_run_whatever_its_content(tmp_path: Path) -> None:
    peak, size = _peak_of_streamed_compare(tmp_path, 20_000, 8)
    assert peak < size / 2
    # What it holds grows with the events' count, not their content: eight times the answers and tool results,
    # some three times the bytes, and nearly the same peak.
    small_peak, small_size = _peak_of_streamed_compare(tmp_path, 5_000, 1)
    large_peak, large_size = _peak_of_streamed_compare(tmp_path, 5_000, 8)
    assert large_size > 2.5 * small_size
    assert large_peak < 1.25 * small_peak


def test_a_stored_run_against_a_list_is_judged_as_two_lists(tmp_path: Path) -> None:
    cases = [c for c in concurrent_cases(2) if "extra" in c.name or "result" in c.name]
    assert len(cases) == 4
    for case in cases:
        in_memory = compare_runs(case.original, case.replay)
        assert in_memory.verdict == "diverged"
        with _stored(_write(tmp_path / "o.jsonl", case.original)) as o:
            assert compare_runs(o, case.replay) == in_memory
        with _stored(_write(tmp_path / "r.jsonl", case.replay)) as r:
            assert compare_runs(case.original, r) == in_memory


@pytest.mark.parametrize("lines", [
    ['{"runId": "a", "sequence": 0}', '{"runId": "a", "sequence": 1'],
    ['{"runId": "a", "sequence": 0}', "", "[1, 2]"],
    ['{"runId": "a", "sequence": 0}', json.dumps({"checkpoint": {"runId": "a"}})],
], ids=["not-json", "not-an-object", "a-checkpoint"])
def test_a_bad_line_is_the_error_reading_the_export_whole_gives(lines: list[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ReplayError) as whole:
        read_jsonl(path)
    with pytest.raises(ReplayError) as streamed, stored_tree(path):
        pass
    assert str(streamed.value) == str(whole.value)
    assert str(whole.value).startswith(f"{path}:{len(lines)}: ")


def test_a_committed_event_line_is_read_as_its_doc(tmp_path: Path) -> None:
    case = sequential_cases()[0]
    wrapped = [{"doc": doc, "hash": f"h{n}", "prevHash": None} for n, doc in enumerate(case.replay)]
    _write(tmp_path / "w.jsonl", wrapped)
    with _stored(tmp_path / "w.jsonl") as r:
        assert list(r) == case.replay
        assert compare_runs(case.original, r) == compare_runs(case.original, case.replay)
