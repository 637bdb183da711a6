"""Records for a person fit the terminal: a table cut to its width, else one ``key: value`` block per record.

The layout rule (:mod:`agentlog.cli._output`) on its own, then the commands that print rows, run with
``CliRunner`` at ``COLUMNS=80`` and ``COLUMNS=200``: no line is wider than the terminal, and when the
rows are printed vertically every value is there whole.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentlog.audit.migrations import migrate
from agentlog.audit.store import open_store
from agentlog.cli import app
from agentlog.cli._output import fit_columns, print_records
from tests.unit.audit.data import audit_batches

GOLDEN = Path(__file__).resolve().parents[1] / "replay" / "golden"
#: The corners of Rich's default table box: present exactly when a table was printed.
TABLE_CORNERS = ("┏", "┗", "└")


def _printed(width: int, columns: list[str], rows: list[list[str]], title: str | None = None) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False)
    print_records(console, columns, rows, title=title)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def _is_table(text: str) -> bool:
    return any(corner in text for corner in TABLE_CORNERS)


def _rows_on_one_line(text: str) -> bool:
    """Every table row is one line: no row line has a blank first cell (a wrapped cell's continuation)."""
    rows = [line for line in text.splitlines() if line.startswith("│")]
    return bool(rows) and all(line[1:].split("│")[0].strip() for line in rows)


def _squashed(text: str) -> str:
    """The text without whitespace, so a value wrapped over lines still reads as one."""
    return re.sub(r"\s+", "", text)


# -- the layout rule ---------------------------------------------------------------------------


def test_columns_that_fit_keep_their_width() -> None:
    # 3 columns spend 3*3+1 = 10 characters on rules and padding: 70 are left at 80.
    assert fit_columns([10, 20, 40], 80) == [10, 20, 40]


def test_the_widest_columns_give_way_first() -> None:
    # 4 columns spend 13 characters: 67 are left at 80; 5 and 12 stay, the two wide ones share 50.
    assert fit_columns([5, 12, 90, 200], 80) == [5, 12, 25, 25]
    # At 77, 47 are left for the two wide ones: 23 each, and the spare character goes to the first.
    assert fit_columns([5, 12, 90, 30], 77) == [5, 12, 24, 23]


def test_a_table_that_needs_columns_narrower_than_the_minimum_does_not_fit() -> None:
    # 8 columns: 25 characters of rules and padding, 55 left, fewer than 8 * MIN_COLUMN.
    assert fit_columns([30] * 8, 80) is None
    # Short columns keep their own width and do not count for more.
    assert fit_columns([3] * 8, 80) == [3] * 8


def test_a_table_cuts_long_values_with_an_ellipsis_and_fits() -> None:
    long = "x" * 150
    out = _printed(80, ["id", "value"], [["a", long], ["b", "short"]], title="t")
    assert _is_table(out) and _widest(out) <= 80
    assert "…" in out and long not in out and "short" in out and _rows_on_one_line(out)


def test_a_table_that_fits_prints_every_value_whole() -> None:
    long = "y" * 150
    out = _printed(200, ["id", "value"], [["a", long]])
    assert _is_table(out) and _widest(out) <= 200 and long in out and "…" not in out


def test_too_many_columns_print_one_block_per_record_with_every_value() -> None:
    columns = [f"column_{i}" for i in range(9)]
    rows = [[f"r{r}c{i}-" + "v" * (40 + 30 * i) for i in range(9)] for r in range(3)]
    out = _printed(80, columns, rows, title="wide")
    assert not _is_table(out) and _widest(out) <= 80
    flat = _squashed(out)
    assert all(f"{name}:" in out for name in columns)
    assert all(value in flat for row in rows for value in row)
    assert out.index("r0c8") < out.index("r1c0") < out.index("r2c0")  # record by record


def test_values_are_text_not_markup() -> None:
    out = _printed(80, ["value"], [["[bold]not markup[/bold]"]])
    assert "[bold]not markup[/bold]" in out


# -- the commands ------------------------------------------------------------------------------


@pytest.fixture
def store_env(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    batches = audit_batches()
    with open_store(url) as store:
        migrate(store)
        for kind, records in batches.items():
            store.insert_records(kind, records)
    return {"AGENTLOG_CLICKHOUSE_URL": url, "AGENTLOG_HOME": str(tmp_path / "home")}, batches


def _run(args: list[str], width: int, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, args, env={**(env or {}), "COLUMNS": str(width)})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize("width", [80, 200])
def test_query_run_timeline_fits(store_env, width: int) -> None:
    env, batches = store_env
    result = _run(["query", "run-timeline", "--param", "run_id=run-1"], width, env)
    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= width
    records = [r for r in batches["committed"] if r["doc"]["runId"] == "run-1"]
    flat = _squashed(result.stdout)
    if width == 80:  # seven columns of ids and hashes: one block per event, nothing cut
        assert not _is_table(result.stdout)
        for r in records:
            assert r["hash"] in flat and r["doc"]["eventId"] in flat and r["doc"]["type"] in flat
    else:
        assert _is_table(result.stdout) and _rows_on_one_line(result.stdout)
        assert all(r["doc"]["type"] in result.stdout for r in records)
    assert f"{len(records)} rows" in result.stdout


#: Seven columns of at least MIN_COLUMN characters: wider than 80 even cut down, so printed vertically there.
WIDE_SQL = ("SELECT repeat('abc ', 60) AS text, "
            + ", ".join(f"'value-{c}-{c * 8}' AS {c}" for c in "abcdef"))


@pytest.mark.parametrize("width", [80, 200])
def test_query_runs_list_and_sql_fit(store_env, width: int) -> None:
    env, _ = store_env
    for args in (["query", "runs"], ["query", "--list"], ["sql", WIDE_SQL]):
        result = _run(args, width, env)
        assert result.exit_code == 0, (args, result.output)
        assert _widest(result.stdout) <= width, (args, result.stdout)
    if width == 80:
        assert not _is_table(result.stdout)
        flat = _squashed(result.stdout)
        assert "abc" * 60 in flat and all(f"value-{c}-{c * 8}" in flat for c in "abcdef")
    else:
        assert _is_table(result.stdout) and "value-a-aaaaaaaa" in result.stdout


@pytest.mark.parametrize("width", [80, 200])
def test_compare_divergence_table_fits(width: int) -> None:
    result = _run(["compare", str(GOLDEN / "refusal.original.jsonl"), str(GOLDEN / "refusal.replay.jsonl"),
                   "--all", "--strict"], width)
    assert result.exit_code == 1, result.output
    assert _is_table(result.stdout) and "divergences" in result.stdout
    assert _widest(result.stdout) <= width and _rows_on_one_line(result.stdout)


@pytest.mark.parametrize("width", [80, 200])
def test_capabilities_table_fits(width: int) -> None:
    result = _run(["capabilities"], width)
    assert result.exit_code == 0, result.output
    assert _is_table(result.stdout) and _widest(result.stdout) <= width and _rows_on_one_line(result.stdout)
