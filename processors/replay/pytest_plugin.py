"""The pytest plugin (entry point ``pytest11``, name ``agentlog``): a replay test in one line.

    def test_support_agent_still_behaves(agentlog_replay):
        agentlog_replay("tests/recorded/support.jsonl", support_program)

Installed with agentlog, so a test needs no conftest import; loading it costs an import of this
module only (the replay machinery is imported when the fixture is used). ``--agentlog-mode``
replays every such test ``live`` or ``what-if`` instead of from the recording; ``--agentlog-tools``
answers every such test's tool calls from the recording (``recorded``) or runs the tools (``run``)
where the test does not say (``tools=``).
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["agentlog_replay"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--agentlog-mode", choices=("recorded", "live", "what-if"), default=None,
                     help="agentlog_replay: answer model calls from the recording (default), ask the models "
                          "again (live), or both (what-if)")
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
