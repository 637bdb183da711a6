"""Repair of the rollups after a SIGKILL in the middle of a sink insert.

``usage_hourly`` and ``run_rollup`` are views over ``events``; ``handoff_steps``, ``worker_failures``
and ``worker_dispatches`` (migration 0005) are views over ``transitions``.

ClickHouse commits an insert's part in ``events`` first and only then runs the materialized views
into the rollups: a SIGKILL in between leaves the events stored and the rollups without them
(seen in 36 of 95 SIGKILLs of a chdb process inserting sink batches). The sink's
re-formed batch finds every event present and would insert nothing, so the rollups would stay
short for good.

So when the sink re-forms a range of the log, it calls :func:`repair` for the runs of that range.
What the rollup should hold for those runs is the view's own SELECT run over all their rows: the
SELECT is read from the migrations (:func:`agentlog.audit.migrations.migration_statements`), every
``FROM <source>`` in it reading the runs' rows of the source table instead of an inserted block (a
``merge()`` read of the whole table stays one), so the repair computes exactly what the view computes.
The migration text rather than the store's ``system.tables`` is the definition: applied migrations
never change (``migration_drift``), the text is ours rather than a server's reformatting of it, and it
reads the Distributed tables on a cluster (a cluster's views read the shard-local ones).
How the difference is written follows the rollup's columns:

* sums (a ``SimpleAggregateFunction(sum, …)`` column; ``usage_hourly``, ``run_rollup``): per key, what
  the view yields minus what the rollup holds, inserted where the rollup's ``count()`` column is short.
  The sums become exact; min, max and argMax columns take the full aggregate again, which merges to
  the same value. Nothing happens where the rollup already agrees, so repairing twice (a crash during
  the repair) is harmless. A rollup holding more than ``events`` is left alone.
* weights (a ``weight`` column; ``handoff_steps``): per row value, what the view yields minus what the
  rollup's weights sum to, so a step the view computed before an earlier transition of its dispatch
  arrived is corrected too.
* sets (only ``uniqExact``, min, max or argMax states; ``worker_failures``, ``worker_dispatches``):
  adding the same rows again changes nothing, so the view's rows are re-added every time, without a check.

``tests/unit/audit/test_rollups.py`` and ``test_query_rewrites.py`` check that a repaired rollup equals
the one the views build.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentlog.audit.migrations import migration_statements
from agentlog.audit.store import Store

__all__ = ["ROLLUP_SOURCES", "readd_sets", "repair"]

#: Tables whose inserts feed rollups, with the column naming the run a row belongs to.
ROLLUP_SOURCES = {"events": "run_id", "transitions": "parent_run_id"}

_RUNS = "{runs:Array(String)}"
# The views' SELECTs name columns the source computes at insert (events.provider, …): ``*`` must include them.
_SETTINGS = {"asterisk_include_materialized_columns": 1}

_VIEW = re.compile(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\n(.*)$", re.S)
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)\s*\((.*)\)\s*\nENGINE = ", re.S)
_DROP = re.compile(r"DROP (?:TABLE|VIEW) IF EXISTS (\w+)$")
_ORDER_BY = re.compile(r"\nORDER BY \(?([\w, ]+?)\)?\s*(?:\n|$)")
_FIRST_SOURCE = re.compile(r"\bFROM\s+(\w+)\b")
_COUNT = re.compile(r"\bcount\(\)\)?\s+AS\s+(\w+)")
_SUM = re.compile(r"SimpleAggregateFunction\(sum\b")
# Aggregates that a second copy of the same rows does not change.
_IDEMPOTENT = re.compile(r"(?:Simple)?AggregateFunction\((?:min|max|argMin|argMax|uniqExact|groupUniqArray)\b")
_WEIGHT = "weight"


@dataclass(frozen=True)
class _Repair:
    rollup: str
    source: str
    insert: str
    short: str | None  # counts the runs the rollup is short of; None: re-added without a check
    select: str  # the view's SELECT


def repair(store: Store, run_ids: list[str], *, source: str = "events") -> dict[str, int]:
    """Bring the rollups over ``source`` (``events`` or ``transitions``) of ``run_ids`` up to it.

    Returns, per rollup, how many runs were short (``worker_failures`` and ``worker_dispatches`` are
    re-added without a check and never counted).
    """
    if source not in ROLLUP_SOURCES:
        raise ValueError(f"no rollups over {source!r}; known: {', '.join(ROLLUP_SOURCES)}")
    runs = sorted(set(run_ids))
    short: dict[str, int] = {}
    if not runs:
        return short
    # no block-hash deduplication: a correction must never be dropped as a repeat of another
    insert_settings = {**_SETTINGS, "insert_deduplicate": 0}
    for r in _repairs():
        if r.source != source:
            continue
        if r.short is None:
            store.command(r.insert, {"runs": runs}, settings=insert_settings)
            continue
        n = int(store.query(r.short, {"runs": runs}, settings=_SETTINGS).rows[0][0])
        if n:
            store.command(r.insert, {"runs": runs}, settings=insert_settings)
            short[r.rollup] = n
    return short


def readd_sets(store: Store, source: str, column: str, values: list[str],
               *, delete: Callable[[str, str, dict[str, Any]], None]) -> list[str]:
    """Rebuild the rows of the set rollups over ``source`` (those :func:`repair` re-adds unchecked) whose key
    ``column`` is in ``values``: ``delete(rollup, where, params)`` removes them, then the view's SELECT over the
    ``source`` rows with that ``column`` adds them again. For what a set cannot do: forget deleted source rows
    (:mod:`agentlog.audit.retention`). Returns the rollups rebuilt.
    """
    done: list[str] = []
    if not values:
        return done
    params: dict[str, Any] = {"values": sorted(set(values))}
    for r in _repairs():
        if r.source != source or r.short is not None:
            continue
        if column not in _sorting_key(_create_of(r.rollup)):
            raise ValueError(f"rollup {r.rollup} is not keyed by {column}: its rows cannot be rebuilt by it")
        rows = re.sub(rf"\b(FROM|JOIN)(\s+){source}\b",
                      rf"\1\2(SELECT * FROM {source} WHERE {column} IN {{values:Array(String)}})", r.select)
        delete(r.rollup, f"{column} IN {{values:Array(String)}}", params)
        names = ", ".join(_columns(_create_of(r.rollup)))
        store.command(f"INSERT INTO {r.rollup} ({names})\nSELECT {names} FROM (\n{rows}\n)", params,
                      settings={**_SETTINGS, "insert_deduplicate": 0})
        done.append(r.rollup)
    return done


@functools.cache
def _creates() -> dict[str, str]:
    """Table → the ``CREATE TABLE`` statement the migrations leave for it."""
    tables: dict[str, str] = {}
    for stmt in migration_statements():
        if m := _TABLE.match(stmt):
            tables[m.group(1)] = stmt
        elif m := _DROP.match(stmt):
            tables.pop(m.group(1), None)
    return tables


def _create_of(table: str) -> str:
    return _creates()[table]


@functools.cache
def _repairs() -> tuple[_Repair, ...]:
    """One repair per materialized view the migrations leave, in the order they declare them."""
    views: dict[str, tuple[str, str]] = {}
    for stmt in migration_statements():
        if m := _VIEW.match(stmt):
            views[m.group(1)] = (m.group(2), m.group(3))
        elif m := _DROP.match(stmt):
            views.pop(m.group(1), None)
    return tuple(_repair_of(view, target, select, _create_of(target)) for view, (target, select) in views.items())


def _repair_of(view: str, rollup: str, select: str, create: str) -> _Repair:
    source = _FIRST_SOURCE.search(select)
    if source is None or source.group(1) not in ROLLUP_SOURCES:
        raise ValueError(f"view {view} reads {source and source.group(1)!r}, which the sink does not repair from: "
                         f"add it to ROLLUP_SOURCES")
    src = source.group(1)
    run = ROLLUP_SOURCES[src]
    rows = re.sub(rf"\b(FROM|JOIN)(\s+){src}\b", rf"\1\2(SELECT * FROM {src} WHERE {run} IN {_RUNS})", select)
    columns = _columns(create)
    names = ", ".join(columns)
    insert = f"INSERT INTO {rollup} ({names})\n"
    stored = f"FROM {rollup} WHERE {run} IN {_RUNS}"

    if _WEIGHT in columns:
        value = [c for c in columns if c != _WEIGHT]
        vals = ", ".join(value)
        diff = (f"SELECT {vals}, sum(w) AS {_WEIGHT}\nFROM (\n"
                f"    SELECT {vals}, toInt64({_WEIGHT}) AS w FROM (\n{rows}\n    )\n"
                f"    UNION ALL\n    SELECT {vals}, -{_WEIGHT} AS w {stored}\n)\n"
                f"GROUP BY {vals}\nHAVING {_WEIGHT} != 0")
        return _Repair(rollup, src, f"{insert}SELECT {names} FROM (\n{diff}\n)",
                       f"SELECT uniqExact({run}) FROM (\n{diff}\n)", select)

    key = _sorting_key(create)
    rest = {c: t for c, t in columns.items() if c not in key}
    sums = [c for c, t in rest.items() if _SUM.match(t)]
    odd = [f"{c} {t}" for c, t in rest.items() if c not in sums and not _IDEMPOTENT.match(t)]
    if odd:
        raise ValueError(f"rollup {rollup}: no repair for {', '.join(odd)} (neither a sum nor idempotent)")
    if not sums:
        return _Repair(rollup, src, f"{insert}SELECT {names} FROM (\n{rows}\n)", None, select)
    count = _COUNT.search(rows)
    if count is None or count.group(1) not in sums or run not in key:
        raise ValueError(f"rollup {rollup} sums, so its view must fill a column with count() and its key "
                         f"must hold {run}: that is how a short rollup is told")
    n = count.group(1)
    on = " AND ".join(f"t.{k} = c.{k}" for k in key)
    held = (f"SELECT {', '.join(key)}, {', '.join(f'sum({s}) AS {s}' for s in sums)}\n"
            f"    {stored}\n    GROUP BY {', '.join(key)}")
    joined = f"FROM (\n{rows}\n) AS t\nLEFT JOIN (\n    {held}\n) AS c ON {on}\nWHERE c.{n} < t.{n}"
    values = ", ".join(f"t.{c} - c.{c}" if c in sums else f"t.{c}" for c in columns)
    return _Repair(rollup, src, f"{insert}SELECT {values}\n{joined}", f"SELECT uniqExact(t.{run})\n{joined}",
                   select)


def _columns(create: str) -> dict[str, str]:
    """Column name → type (and anything after it) of a ``CREATE TABLE`` statement, in order."""
    m = _TABLE.match(create)
    assert m is not None
    out, depth, part = {}, 0, ""
    for ch in m.group(2) + ",":
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            name, _, kind = part.strip().partition(" ")
            if name not in {"INDEX", "PROJECTION", "CONSTRAINT"}:
                out[name] = kind.strip()
            part = ""
        else:
            part += ch
    return out


def _sorting_key(create: str) -> list[str]:
    m = _ORDER_BY.search(create)
    if m is None:
        raise ValueError(f"no ORDER BY in {create.splitlines()[0]}")
    return [c.strip() for c in m.group(1).split(",")]
