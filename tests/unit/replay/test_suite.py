"""Replay suites from exported runs: a real pydantic-ai program, varied inputs, one report (no broker).

Twelve runs of :mod:`tests.unit.replay.suite_program` are recorded live with their own inputs and exported, then
replayed as a suite with the program unchanged, with its prompt changed, with one tool changed, and with a program
that raises for one run. The expected runs and groups follow from the inputs (every third asks for a refund).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("pydantic_ai")
junitparser = pytest.importorskip("junitparser")

from agentlog.cli import app  # noqa: E402
from agentlog.replay.recorder import recorded_input  # noqa: E402
from agentlog.replay.regression import record  # noqa: E402
from agentlog.replay.suite import (  # noqa: E402
    CHANGED,
    ERROR,
    MISSING,
    Suite,
    SuiteRun,
    file_run,
    load_runs,
    replay_suite,
)
from agentlog.schemas.errors import ReplayError  # noqa: E402
from tests.unit.replay import suite_program  # noqa: E402

PROGRAM = "tests.unit.replay.suite_program"
N = 12
REFUNDS = [f"sup-{i}" for i in range(N) if i % 3 == 0]


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("suite")
    runs = []
    for i, asked in enumerate(suite_program.inputs(N)):
        docs = record(suite_program.support, run_id=f"sup-{i}", input=asked)
        path = out / f"sup-{i}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        runs.append(file_run(path)[0])
    Suite("support", tuple(runs)).write(out / "suite.json")
    return out


def _suite(suite_dir: Path) -> Suite:
    return Suite.read(suite_dir / "suite.json")


def test_a_recorded_input_reaches_the_replay_and_the_first_user_message_stands_in_for_one():
    docs = record(suite_program.support, run_id="in-1", input={"order": "7", "question": "Where is my order 7?"})
    assert docs[0]["payload"]["input"] == {"order": "7", "question": "Where is my order 7?"}
    assert recorded_input(docs) == ({"order": "7", "question": "Where is my order 7?"}, True)
    without = [{**docs[0], "payload": {"bindings": {}}}, *docs[1:]]
    assert recorded_input(without) == ("Where is my order 7?", False)


def test_an_unchanged_program_matches_every_run_in_one_process_or_two(suite_dir):
    for jobs in (1, 2):
        report = replay_suite(_suite(suite_dir), f"{PROGRAM}:support", jobs=jobs)
        assert report.counts == {"match": N} and report.ok and report.groups() == []
        assert [r.run_id for r in report.results] == [f"sup-{i}" for i in range(N)]


def test_a_changed_prompt_diverges_every_run_under_one_group(suite_dir):
    report = replay_suite(_suite(suite_dir), f"{PROGRAM}:support_prompt_v2")
    assert report.counts == {"diverged": N} and not report.ok
    [group] = report.groups()
    assert sorted(group["runs"]) == sorted(f"sup-{i}" for i in range(N))
    assert group["eventType"] == "agent.invocation.started" and group["nodeId"] == "planner"


def test_a_changed_tool_diverges_exactly_the_runs_that_call_it(suite_dir):
    report = replay_suite(_suite(suite_dir), f"{PROGRAM}:support_refund_v2", jobs=2)
    assert sorted(r.run_id for r in report.failed) == sorted(REFUNDS)
    [group] = report.groups()
    assert (group["kind"], group["eventType"], group["path"]) == ("output", "agent.toolReturned", "payload.result")
    assert "refund queued for review" in json.dumps(group["example"])
    assert report.counts == {"diverged": len(REFUNDS), "match": N - len(REFUNDS)}


def test_a_program_that_raises_is_that_runs_error_with_its_traceback_and_the_rest_go_on(suite_dir):
    report = replay_suite(_suite(suite_dir), f"{PROGRAM}:support_raises")
    [failed] = report.failed
    assert (failed.run_id, failed.status) == ("sup-5", ERROR)
    assert "RuntimeError: the order service is down" in (failed.traceback or "")
    assert report.counts == {ERROR: 1, "match": N - 1}


def test_the_junit_file_has_one_case_per_run_as_ci_reads_it(suite_dir, tmp_path):
    report = replay_suite(_suite(suite_dir), f"{PROGRAM}:support_refund_v2")
    path = tmp_path / "junit.xml"
    path.write_bytes(report.junit())
    xml = junitparser.JUnitXml.fromfile(str(path))
    [suite] = list(xml)
    cases = {case.name: case for case in suite}
    assert set(cases) == {f"sup-{i}" for i in range(N)} and suite.tests == N
    assert suite.failures == len(REFUNDS) and suite.errors == 0 and suite.skipped == 0
    for name, case in cases.items():
        results = list(case.result)
        assert (name in REFUNDS) == bool(results)
        if results:
            assert isinstance(results[0], junitparser.Failure) and "expected match, got diverged" in \
                results[0].message


def test_a_run_whose_file_changed_or_went_is_reported_not_replayed(suite_dir, tmp_path):
    suite = _suite(suite_dir)
    changed = tmp_path / "changed.jsonl"
    docs = [json.loads(line) for line in Path(suite.runs[1].file or "").read_text().splitlines()]
    docs[-1]["timestamp"] = "2030-01-01T00:00:00.000Z"
    changed.write_text("".join(json.dumps(d) + "\n" for d in docs))
    runs = (suite.runs[0], SuiteRun(suite.runs[1].run_id, suite.runs[1].head, suite.runs[1].events, str(changed)),
            SuiteRun("gone", "sha256:x", 3, str(tmp_path / "gone.jsonl")))
    report = replay_suite(Suite("partial", runs), f"{PROGRAM}:support")
    assert [r.status for r in report.results] == ["match", CHANGED, MISSING]
    assert report.ok  # runs that could not be replayed are reported, not failures of the program
    junit = junitparser.JUnitXml.fromstring(report.junit().decode())
    assert [s.skipped for s in junit] == [2]


def test_replay_suite_cli_prints_the_report_writes_junit_and_exits_by_verdict(suite_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[3])  # the program is imported from the checkout
    runner = CliRunner()
    same = runner.invoke(app, ["replay-suite", str(suite_dir / "suite.json"), "--program", f"{PROGRAM}:support",
                               "--json", "--junit", str(tmp_path / "j.xml")])
    assert same.exit_code == 0, same.output
    body = json.loads(same.stdout.strip().splitlines()[-1])
    assert body["counts"] == {"match": N} and body["ok"] and (tmp_path / "j.xml").exists()
    changed = runner.invoke(app, ["replay-suite", str(suite_dir / "suite.json"), "--program",
                                  f"{PROGRAM}:support_refund_v2"])
    assert changed.exit_code == 1 and f"{len(REFUNDS)} run(s): output at agent.toolReturned" in changed.stdout
    bad = runner.invoke(app, ["replay-suite", str(suite_dir / "suite.json"), "--program", "no.such:program"])
    assert bad.exit_code == 2 and "bad_program" in bad.output


def test_a_file_that_is_not_a_suite_is_refused_with_what_is_wrong(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "agentlog.suite/1", "runs": [{"runId": "r"}]}))
    with pytest.raises(ReplayError) as e:
        Suite.read(path)
    assert e.value.code == "suite_invalid" and "runs[0]" in str(e.value)
    path.write_text("{}")
    with pytest.raises(ReplayError, match="not an agentlog.suite/1 file"):
        Suite.read(path)


def test_the_pytest_fixture_makes_each_run_a_test_item_selectable_with_k(suite_dir, tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    test = tmp_path / "test_support_suite.py"
    test.write_text(
        "import pytest\n"
        "from tests.unit.replay import suite_program\n\n"
        f"@pytest.mark.agentlog_suite({str(suite_dir / 'suite.json')!r})\n"
        "def test_support(agentlog_suite_run):\n"
        "    agentlog_suite_run.replay(suite_program.support_refund_v2)\n")

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:cacheprovider",
                               "--rootdir", str(tmp_path), *args], cwd=repo, capture_output=True, text=True,
                              timeout=300)

    every = pytest_run("-rf")
    assert every.returncode == 1, every.stdout + every.stderr
    assert f"{len(REFUNDS)} failed, {N - len(REFUNDS)} passed" in every.stdout
    assert {f"test_support[{r}]" for r in REFUNDS} == {
        line.split("::")[1].split(" ")[0] for line in every.stdout.splitlines() if line.startswith("FAILED")}
    one = pytest_run("-k", "sup-1]")
    assert one.returncode == 0 and "1 passed" in one.stdout, one.stdout


def test_a_replay_tagged_with_its_suite_execution_still_matches(suite_dir):
    from agentlog.replay.regression import replay_recorded
    from agentlog.replay.suite import execution_tags

    [loaded] = load_runs(None, _suite(suite_dir).runs[:1])
    result = replay_recorded(loaded.run.run_id, list(loaded.docs), suite_program.support,
                             tags=execution_tags("support", "exec-1", "abc123"))
    assert result.docs[0]["payload"]["tags"] == ["suite:support", "suite-execution:exec-1", "code:abc123"]
    assert result.verdict == "match"


def test_ctrl_c_stops_the_suite_and_reports_what_ran(suite_dir):
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen([sys.executable, "-m", "agentlog", "replay-suite", str(suite_dir / "suite.json"),
                             "--program", f"{PROGRAM}:support_slow", "--json"], cwd=repo, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(repo)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "[2/" not in (line := proc.stderr.readline()) and line:
        pass  # the progress lines: stop once two runs are done
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    body = json.loads(out.strip().splitlines()[-1])
    assert body["interrupted"] and 2 <= body["ran"] < N and body["runs"] == N
    assert body["counts"] == {"match": body["ran"]}


def test_since_takes_iso_8601_or_a_span_back_from_now_and_refuses_anything_else(tmp_path):
    from datetime import UTC, datetime

    from agentlog.replay.suite import point_in_time

    now = datetime(2026, 11, 28, 10, 30, tzinfo=UTC)
    assert point_in_time("7d", now=now) == "2026-11-21T10:30:00Z"
    assert [point_in_time(t, now=now) for t in ("90m", "24h", "2w")] == [
        "2026-11-28T09:00:00Z", "2026-11-27T10:30:00Z", "2026-11-14T10:30:00Z"]
    assert point_in_time("2026-11-21T10:00:00Z") == "2026-11-21T10:00:00Z"  # as given
    with pytest.raises(ReplayError, match="--until takes ISO 8601") as e:
        point_in_time("last week", option="--until")
    assert e.value.code == "bad_param"
    done = CliRunner().invoke(app, ["suite", "create", "s", "--since", "7 days", "--out", str(tmp_path / "s.json")])
    assert done.exit_code == 2 and "error[bad_param]: --since takes ISO 8601" in done.output
    assert not (tmp_path / "s.json").exists()
