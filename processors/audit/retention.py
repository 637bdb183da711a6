"""Retention by run class: a run leaves the audit store whole (every table and rollup) once its class's time is up.

A run's class is ``run.started`` ``payload.runClass`` (``ci``, ``dev``, ``prod``, …); a run that names none takes
its parent's (``payload.parentRunId``, else the handoff that started it). The
retention is ``AGENTLOG_RETENTION``, one duration per class and ``*`` for every other run (and runs with no class)::

    AGENTLOG_RETENTION="ci=2h,dev=7d,prod=forever,*=90d"

A duration is a whole number of seconds, minutes, hours or days (``90s``, ``30m``, ``2h``, ``7d``) or ``forever``;
unset (or empty) keeps every run forever. A run expires when its class's duration has passed since the last event
(``event_time``) of its run tree, the root run and every run under it: a tree leaves at once, never a parent without
its children.

The audit sink sweeps (:func:`sweeping`) every tenth of the shortest duration (at least every second, at most every
minute, unless finding took long: see :data:`SWEEP_SHARE`): it finds the expired runs from ``run_rollup`` and the
``run.started`` rows, then deletes their rows from every table that holds rows of a run (:data:`RUN_TABLES`: the
events, the rollups keyed by run, transitions, verdicts, snapshots, checkpoints, …) with lightweight ``DELETE``s,
which hide the rows from the next query at once.
The two rollups that count distinct values per worker (``worker_failures``, ``worker_dispatches``) cannot subtract a
run: their rows for the workers the expired runs touched are deleted and added again from the transitions left
(:func:`agentlog.audit.rollups.readd_sets`). So the console, the named queries and the rollups lose an expired run
in the same sweep, and the rollups still equal what their views compute over what is left.

Why a sweep and not a ClickHouse TTL: a row TTL sees one row, so it can neither follow a run's class to its child
runs nor wait for the run's last event (a long run would lose its first events first), and ClickHouse applies TTLs
in merges, hours late by default (``merge_with_ttl_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentlog.audit.migrations import ON_CLUSTER_CLAUSE
from agentlog.audit.rollups import readd_sets
from agentlog.audit.store import Store
from agentlog.metrics import METRICS
from agentlog.schemas.errors import ConfigError
from agentlog.schemas.payloads import RUN_CLASS

__all__ = ["RUN_TABLES", "Retention", "drop_runs", "expired_runs", "parse_retention", "sweeping"]

log = logging.getLogger(__name__)

#: Every table holding rows of a run, with the columns naming it: an expired run's rows leave all of them.
#: ``worker_failures``/``worker_dispatches`` hold no run column (counts per worker): see :func:`drop_runs`.
RUN_TABLES: Mapping[str, tuple[str, ...]] = {
    "run_rollup": ("run_id",),
    "usage_hourly": ("run_id",),
    "events": ("run_id",),
    "transitions": ("parent_run_id",),
    "handoff_steps": ("parent_run_id",),
    "violations": ("run_id",),
    "rejections": ("run_id",),
    "snapshots": ("run_id",),
    "checkpoints": ("run_id",),
    "replay_verdicts": ("source_run_id", "replay_run_id"),
}

_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^(\d+)([smhd])$")
#: A sweep waits at least this many times as long as the last one took to find the expired runs, so sweeping a
#: large store takes at most ~5% of a core: finding reads every run's class and last event (5.9 s for 1M runs and
#: 25M events, ``bench_retention``).
SWEEP_SHARE = 20
#: How many runs one DELETE names.
_CHUNK = 10_000


@dataclass(frozen=True)
class Retention:
    """How long runs are kept, per class: milliseconds, or None for forever."""

    classes: Mapping[str, int | None] = field(default_factory=dict)
    default_ms: int | None = None

    def ttl_ms(self, run_class: str) -> int | None:
        return self.classes.get(run_class, self.default_ms) if run_class else self.default_ms

    @property
    def finite(self) -> list[int]:
        return [ms for ms in (*self.classes.values(), self.default_ms) if ms is not None]

    @property
    def sweep_s(self) -> float | None:
        """Seconds between sweeps (a tenth of the shortest duration, 1 s to 60 s); None when nothing expires."""
        finite = self.finite
        return None if not finite else min(60.0, max(1.0, min(finite) / 10_000))


def parse_retention(text: str) -> Retention:
    """``AGENTLOG_RETENTION``: ``class=duration`` pairs separated by commas, ``*`` for every other run.

    Raises:
        ConfigError: ``bad_retention``, naming the entry and what it must be.
    """
    classes: dict[str, int | None] = {}
    default: int | None = None
    seen: set[str] = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, eq, value = (s.strip() for s in entry.partition("="))
        if not eq or not (name == "*" or RUN_CLASS.fullmatch(name)):
            raise ConfigError(f"AGENTLOG_RETENTION entry {entry!r}: write <class>=<duration> (a class of letters, "
                              "digits, '_', '.', '-'; '*' for every other run)", code="bad_retention")
        if value == "forever":
            ms = None
        elif (m := _DURATION.match(value)) and int(m.group(1)) > 0:
            ms = int(m.group(1)) * _UNITS[m.group(2)]
        else:
            raise ConfigError(f"AGENTLOG_RETENTION entry {entry!r}: {value!r} is not a duration (90s, 30m, 2h, 7d "
                              "or forever)", code="bad_retention")
        if name in seen:
            raise ConfigError(f"AGENTLOG_RETENTION names {name!r} twice", code="bad_retention")
        seen.add(name)
        if name == "*":
            default = ms
        else:
            classes[name] = ms
    return Retention(classes, default)


# The runs the store knows (run_rollup), each with its own class, its parent and its last event.
_RUNS_SQL = """
SELECT r.run_id, s.cls, if(s.parent != '', s.parent, l.parent), toUnixTimestamp64Milli(r.ended)
FROM (SELECT run_id, max(ended_at) AS ended FROM run_rollup GROUP BY run_id) AS r
LEFT JOIN (
    SELECT run_id, any(JSONExtractString(payload, 'runClass')) AS cls,
           any(JSONExtractString(payload, 'parentRunId')) AS parent
    FROM events WHERE type = 'run.started' GROUP BY run_id
) AS s ON s.run_id = r.run_id
LEFT JOIN (
    SELECT child_run_id, any(parent_run_id) AS parent FROM transitions WHERE child_run_id != ''
    GROUP BY child_run_id
) AS l ON l.child_run_id = r.run_id
"""


def expired_runs(store: Store, retention: Retention, now_ms: int) -> list[str]:
    """The runs whose class's duration has passed, at ``now_ms``, since the last event of their run tree (the run,
    its root and every run under that root), so a tree leaves at once."""
    if not retention.finite:
        return []
    rows = store.query(_RUNS_SQL).rows
    own = {str(r[0]): str(r[1] or "") for r in rows}
    parent = {str(r[0]): str(r[2] or "") for r in rows}
    ended = {str(r[0]): int(r[3]) for r in rows}

    def lineage(run: str) -> list[str]:
        """``run``, its parent, … up to its root (a cycle, which a store should never hold, ends it)."""
        chain: list[str] = []
        while run and run not in chain:
            chain.append(run)
            run = parent.get(run, "")
        return chain

    lines = {run: lineage(run) for run in ended}
    tree_last: dict[str, int] = {}
    for run, line in lines.items():
        tree_last[line[-1]] = max(tree_last.get(line[-1], 0), ended[run])
    out = []
    for run, line in lines.items():
        ttl = retention.ttl_ms(next((own[r] for r in line if own.get(r)), ""))
        if ttl is not None and tree_last[line[-1]] + ttl <= now_ms:
            out.append(run)
    return sorted(out)


def _deletes_on_cluster(store: Store) -> bool:
    """Whether the store is a cluster's (its tables Distributed over ``<t>_local``), where a DELETE runs on the
    shards' local tables."""
    engine = store.query("SELECT engine FROM system.tables WHERE database = currentDatabase() "
                         "AND name = 'events'").rows
    return bool(engine) and engine[0][0] == "Distributed"


def drop_runs(store: Store, runs: Iterable[str]) -> int:
    """Delete every row of ``runs`` from the audit store, keeping the rollups equal to their views. Returns the
    number of events deleted. Idempotent: a sweep cut short is finished by the next one."""
    runs = sorted(set(runs))
    local = f"_local {ON_CLUSTER_CLAUSE}" if _deletes_on_cluster(store) else ""

    def delete(table: str, where: str, params: dict[str, Any]) -> None:
        store.command(f"DELETE FROM {table}{local} WHERE {where}", params)

    deleted = 0
    for i in range(0, len(runs), _CHUNK):
        chunk = {"runs": runs[i:i + _CHUNK]}
        deleted += int(store.query("SELECT count() FROM events WHERE run_id IN {runs:Array(String)}", chunk).rows[0][0])
        workers = [str(r[0]) for r in store.query(
            "SELECT DISTINCT worker_id FROM transitions WHERE parent_run_id IN {runs:Array(String)}", chunk).rows]
        for table, columns in RUN_TABLES.items():
            where = " OR ".join(f"{c} IN {{runs:Array(String)}}" for c in columns)
            delete(table, where, chunk)
        readd_sets(store, "transitions", "worker_id", workers, delete=delete)
    return deleted


async def sweeping(store: Store, retention: Retention, *,
                   shred: Callable[[list[str]], Awaitable[list[str]]] | None = None) -> None:
    """Sweep every :attr:`Retention.sweep_s` on a connection of its own, until cancelled: find the expired runs,
    ``shred`` their keys (the worker's keyring: :func:`agentlog.streams.erasure.shred_keys`), then delete their rows.

    Keys first: a sweep cut short between the two finds the same runs in the store next time and finishes; the
    other order would leave keys no later sweep finds. A failed sweep is logged and the next one tries again
    (both steps are idempotent): the audit sink goes on.
    """
    every = retention.sweep_s
    if every is None:
        return
    own = store.fork()
    loop = asyncio.get_running_loop()
    wait = every
    try:
        while True:
            await asyncio.sleep(wait)
            started = time.monotonic()
            try:
                runs = await loop.run_in_executor(None, expired_runs, own, retention, int(time.time() * 1000))
                wait = max(every, SWEEP_SHARE * (time.monotonic() - started))
                if not runs:
                    continue
                shredded = await shred(runs) if shred is not None else []
                events = await loop.run_in_executor(None, drop_runs, own, runs)
            except Exception as e:  # noqa: BLE001 - the next sweep retries; the audit sink must not stop for it
                log.warning("retention: a sweep failed (the next one, in %.0f s, tries again): %r", wait, e)
                continue
            METRICS.inc("agentlog_retention_runs_deleted_total", len(runs))
            log.info("retention: %d expired run(s) left the audit store (%d events), %d key(s) deleted",
                     len(runs), events, len(shredded))
    finally:
        await loop.run_in_executor(None, own.close)
