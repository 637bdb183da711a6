"""The pytest plugin (entry point ``pytest11``, name ``agentlog``): a replay test in one line.

    def test_support_agent_still_behaves(agentlog_replay):
        agentlog_replay("tests/recorded/support.jsonl", support_program)

Installed with agentlog, so a test needs no conftest import; loading it costs an import of this
module only (the replay machinery is imported when the fixture is used). ``--agentlog-mode``
replays every such test ``live`` or ``what-if`` instead of from the recording; ``--agentlog-tools``
answers every such test's tool calls from the recording (``recorded``) or runs the tools (``run``)
where the test does not say (``tools=``).

A suite (``agentlog suite create``) is one test item per recorded run, selectable with ``-k <run id>`` and
parallel under pytest-xdist::

    @pytest.mark.agentlog_suite("suites/support.json")
    def test_support_suite(agentlog_suite_run):
        agentlog_suite_run.replay(support_program)

``--agentlog-suite FILE`` names the suite for tests without the marker.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SuiteCase", "agentlog_replay"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--agentlog-mode", choices=("recorded", "live", "what-if"), default=None,
                     help="agentlog_replay: answer model calls from the recording (default), ask the models "
                          "again (live), or both (what-if)")
    parser.addoption("--agentlog-suite", default=None,
                     help="agentlog_suite_run: the suite file (agentlog suite create) for tests without the "
                          "agentlog_suite marker")
    parser.addoption("--agentlog-tools", choices=("run", "recorded"), default=None,
                     help="agentlog_replay: run the program's tools again (default) or answer each tool call "
                          "with its recorded result without running the tool (recorded)")


@pytest.fixture
def agentlog_replay(request: pytest.FixtureRequest) -> Any:
    """:func:`agentlog.replay.regression.replay_test`: replay a recorded run (a run id, or a JSONL export)
    with a program and fail with the first divergence (``expect=`` another verdict, ``settings=`` to read
    the run from the store and publish the replay, ``tools="recorded"`` to answer tool calls from the
    recording)."""
    from agentlog.replay.regression import replay_test

    mode = request.config.getoption("--agentlog-mode")
    tools = request.config.getoption("--agentlog-tools")

    def replay(source: Any, program: Any, **options: Any) -> Any:
        if mode is not None:
            options.setdefault("mode", mode)
        if tools is not None:
            options.setdefault("tools", tools)
        return replay_test(source, program, **options)

    return replay


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "agentlog_suite(path): run the test once per recorded run of the suite file "
                                       "(fixture agentlog_suite_run)")


class SuiteCase:
    """One recorded run of a suite, as a test item's parameter: :meth:`replay` replays it and checks the verdict."""

    def __init__(self, suite: Any, run: Any, mode: str | None, tools: str | None) -> None:
        self.suite, self.run, self._mode, self._tools = suite, run, mode, tools

    @property
    def run_id(self) -> str:
        return str(self.run.run_id)

    def replay(self, program: Any, *, expect: str = "match", settings: Any = None, **options: Any) -> Any:
        """Replay this run with ``program`` (``replay_test``'s options); a run erased or gone, or one that cannot be
        a replay's source (recorded through OpenTelemetry, stored metrics-only), skips the test with the reason."""
        from agentlog.replay.regression import refusal, replay_recorded
        from agentlog.replay.suite import load_runs
        from agentlog.streams.settings import load_settings

        if self.run.file is None and settings is None:
            settings = load_settings()
        [loaded] = load_runs(settings, [self.run])
        if loaded.status is not None:
            pytest.skip(f"{self.run_id}: {loaded.status} ({loaded.reason})")
        refused = refusal(self.run_id, loaded.docs)
        if refused is not None:
            pytest.skip(f"{self.run_id}: unsupported ({refused.code}: {refused})")
        if self._mode is not None:
            options.setdefault("mode", self._mode)
        if self._tools is not None:
            options.setdefault("tools", self._tools)
        result = replay_recorded(self.run_id, list(loaded.docs), program, publish=False, **options)
        return result.check(expect)

    def __repr__(self) -> str:
        return f"SuiteCase({self.suite.name!r}, {self.run_id!r})"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "agentlog_suite_run" not in metafunc.fixturenames:
        return
    from pathlib import Path

    from agentlog.replay.suite import Suite

    marker = metafunc.definition.get_closest_marker("agentlog_suite")
    name = marker.args[0] if marker is not None and marker.args else metafunc.config.getoption("--agentlog-suite")
    if not name:
        raise pytest.UsageError(f"{metafunc.definition.nodeid} uses agentlog_suite_run: mark it "
                                "@pytest.mark.agentlog_suite('<suite file>') or pass --agentlog-suite")
    path = Path(name)
    if not path.is_absolute():
        path = Path(metafunc.config.rootpath) / path
    suite = Suite.read(path)
    mode, tools = metafunc.config.getoption("--agentlog-mode"), metafunc.config.getoption("--agentlog-tools")
    metafunc.parametrize("agentlog_suite_run", [SuiteCase(suite, run, mode, tools) for run in suite.runs],
                         ids=[run.run_id for run in suite.runs])
