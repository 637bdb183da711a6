"""Process-wide counters rendered as Prometheus text.

A tiny registry instead of a client library: the worker exposes a handful of
counters and gauges at ``/metrics``; label sets are small and fixed by the
stable reason/violation codes, so cardinality stays bounded.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

#: One sample a collector adds at render: (series name, labels, value).
Sample = tuple[str, Mapping[str, str], float]
Collector = Callable[[], Iterable[Sample]]

_HELP = {
    "agentlog_events_accepted_total": "Events appended to the committed log.",
    "agentlog_events_rejected_total": "Events rejected at ingest, by reason code.",
    "agentlog_duplicates_dropped_total": "Events dropped because their eventId was already committed.",
    "agentlog_redelivered_total": "Source records seen again after a restart (already committed; nothing appended).",
    "agentlog_violations_total": "Handoff violations, by code.",
    "agentlog_handoff_transitions_total": "Handoff transitions recorded, by phase and derived flag.",
    "agentlog_snapshots_total": "Run snapshots written.",
    "agentlog_checkpoints_signed_total": "Signed checkpoints sent.",
    "agentlog_sink_batches_total": "Batches inserted into ClickHouse, by table.",
    "agentlog_sink_rows_total": "Rows inserted into ClickHouse, by table.",
    "agentlog_sink_lag_seconds": "Age of the oldest record in the last sink batch, by table.",
    "agentlog_sink_errors_total": "Failed ClickHouse inserts, by table (the batch is retried).",
    "agentlog_sink_rejected_total": "Records the sink could not decode or map, by topic (stored in rejections).",
    "agentlog_sink_unproven_total": "Log records ClickHouse could not prove to be our writer's exact bytes (mapped in "
                                    "Python instead), by table.",
    "agentlog_sink_reseeks_total": "Times the sink read past its expected offset and seeked back, by topic.",
    "agentlog_sink_absent_offsets_total": "Offsets a re-read confirmed absent from a topic (compaction, "
                                          "transaction markers), by topic.",
    "agentlog_retention_runs_deleted_total": "Runs deleted from the audit store because their class's retention "
                                             "had passed (AGENTLOG_RETENTION).",
    "agentlog_sink_rollups_repaired_total": "Runs whose rollup lacked events after a crash (the events part landed, "
                                            "the views had not run), repaired by the sink, by rollup.",
    "agentlog_sink_dropped_tokens_total": "Re-formed inserts ClickHouse dropped as duplicates although their rows "
                                          "were missing (a token that outlived its part), by table.",
    "agentlog_batches_total": "Batches processed, by agent.",
    "agentlog_batch_events_total": "Events in those batches, by agent (divide by batches for the mean batch size).",
    "agentlog_worker_child_restarts_total": "Times an all worker with AGENTLOG_SINK_PROCESS started its process half "
                                            "again after it died.",
    "agentlog_batches_fenced_total": "Batches whose transaction the broker refused because another worker opened "
                                     "their partition's writer (their records are handled again there), by agent.",
    "replay_behavior_match_total": "Replay comparisons that matched, by aspect.",
    "replay_behavior_mismatch_total": "Replay comparisons that diverged, by aspect.",
    "agentlog_replay_verdicts_total": "Replay verdicts emitted, by verdict.",
    "agentlog_otlp_requests_total": "OTLP/HTTP trace export requests, by outcome (accepted, undecodable, unavailable).",
    "agentlog_otlp_spans_total": "Spans in OTLP requests, by outcome (accepted = durable in Kafka, rejected = named in "
                                 "partial_success).",
    "agentlog_otel_spans_published_total": "Held spans the span mapper mapped and passed on (their trace was due).",
    "agentlog_otel_duplicate_spans_total": "Spans the span mapper had already held or published (exporter re-sends).",
    "agentlog_otel_unmappable_traces_total": "Traces the span mapper could not map (their spans went to rejections).",
    "agentlog_otel_traces_expired_total": "Published traces the span mapper forgot (older than "
                                          "an hour).",
    "agentlog_otel_events_total": "Events the OTel run sequencer gave a sequence and sent to ingest.",
    "agentlog_otel_duplicate_events_total": "Re-emitted events the OTel run sequencer had already sequenced "
                                            "(nothing sent).",
    "agentlog_runs_in_flight": "Runs this worker holds state for (their head, index and state are in its tables).",
    "agentlog_state_cache_bytes": "Memory the tables' RocksDB block cache and write buffers use (bounded by "
                                  "AGENTLOG_STATE_CACHE_MB).",
    "agentlog_run_closes_asked_total": "Close requests sent for runs due to close, by reason (completed: the grace "
                                       "after its terminal event passed; expired: idle past the retention).",
    "agentlog_runs_closed_total": "Runs closed by the sequencer (their table entries deleted), by reason.",
}
_GAUGES = {"agentlog_sink_lag_seconds", "agentlog_runs_in_flight", "agentlog_state_cache_bytes"}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._collectors: list[Collector] = []

    def add_collector(self, collect: Collector) -> None:
        """Register ``collect() -> iterable of (name, labels: dict, value)``, added to the stored series at render.

        Other modules keep their own counters (the comparison engine's per-aspect
        counts); a collector sums them into the same series instead of copying
        them, so two sources of one series never overwrite each other.
        """
        self._collectors.append(collect)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items())) if labels else ()  # called several times per event
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[name][key] = value

    def get(self, name: str, **labels: str) -> float:
        return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def total(self, name: str) -> float:
        return sum(self._values.get(name, {}).values())

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
        for collect in self._collectors:
            for name, sample_labels, value in collect():
                key = tuple(sorted(sample_labels.items()))
                series = values.setdefault(name, {})
                series[key] = series.get(key, 0.0) + value
        for name in sorted(set(_HELP) | set(values)):
            lines.append(f"# HELP {name} {_HELP.get(name, name)}")
            lines.append(f"# TYPE {name} {'gauge' if name in _GAUGES else 'counter'}")
            for labels, value in sorted(values.get(name, {}).items()):
                if labels:
                    text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    lines.append(f"{name}{{{text}}} {value:g}")
                else:
                    lines.append(f"{name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> list[Sample]:
    """The samples of a text exposition as :meth:`Metrics.render` writes it (its inverse, escapes included).

    Lines that are not samples (``# HELP``/``# TYPE``, blank, malformed) are skipped. Used to fold a
    child process's series into this one's (:mod:`agentlog.worker.halves`).
    """
    samples: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


METRICS = Metrics()
