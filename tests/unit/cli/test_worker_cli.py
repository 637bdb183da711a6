"""``agentlog worker`` refuses flags that contradict its role before it starts anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentlog.cli import app


@pytest.mark.parametrize("args", [["--role", "process", "--sink-process"], ["--role", "sink", "--sink-process"]])
def test_sink_process_is_refused_for_a_worker_that_is_not_all(args):
    result = CliRunner().invoke(app, ["worker", *args])
    assert result.exit_code == 2
    assert "--sink-process splits a --role all worker in two" in result.output


def test_the_role_has_one_spelling():
    result = CliRunner().invoke(app, ["worker", "--no-sink"])
    assert result.exit_code == 2
    assert "No such option" in result.output
