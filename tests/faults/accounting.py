"""Where each record a fault test sent ended up, counted by its source position.

Every ingest record the sequencer handles lands as a committed log record or as a rejection, and
both carry the ``source`` (topic, partition, offset) of the ingest record they came from. So
"lost" and "duplicated" are counted, not assumed: for every (partition, offset) the test produced
to the ingest topic, look at what carries that source.

- **lost**: nothing in the log or the rejections carries it.
- **duplicated**: it landed as more than one *different* record (committed and rejected, committed
  twice with different contents, rejected for two reasons). Byte-identical copies are the
  at-least-once redeliveries readers absorb (dedup by ``(runId, sequence)`` or natural key); they
  are counted apart as ``redelivered_copies``.
- **unaccounted**: a record carries a source position the test never produced to.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Landing:
    committed: int = 0  # sent positions that landed in the log (and only there)
    rejected: int = 0  # sent positions that landed in the rejections (and only there)
    lost: int = 0
    duplicated: int = 0
    redelivered_copies: int = 0
    unaccounted: int = 0
    lost_at: list[tuple[int, int]] = field(default_factory=list)
    duplicated_at: list[tuple[int, int]] = field(default_factory=list)

    def to_extra(self) -> dict:
        """The ledger's extra fields (first few positions, for a failure to name)."""
        return {"log_redelivered_copies": self.redelivered_copies, "unaccounted": self.unaccounted,
                "lost_at": self.lost_at[:5], "duplicated_at": self.duplicated_at[:5]}


def landing(sent: Iterable[tuple[int, int]], log: Iterable[dict], rejections: Iterable[dict], topic: str) -> Landing:
    """Count lost / duplicated records among ``sent`` (partition, offset) positions of ``topic``.

    ``log`` are CommittedEvent records, ``rejections`` Rejection records (CONTRACT.md); records whose
    source is another topic are ignored.
    """
    outcomes: dict[tuple[int, int], list[str]] = {}
    for kind, records in (("log", log), ("rejection", rejections)):
        for rec in records:
            source = rec.get("source") or {}
            if source.get("topic") != topic:
                continue
            outcomes.setdefault((source["partition"], source["offset"]), []).append(
                kind + json.dumps(rec, sort_keys=True, separators=(",", ":")))
    out = Landing()
    sent_set = set(sent)
    for position in sorted(sent_set):
        landed = outcomes.get(position, [])
        distinct = set(landed)
        if not landed:
            out.lost += 1
            out.lost_at.append(position)
        elif len(distinct) > 1:
            out.duplicated += 1
            out.duplicated_at.append(position)
        elif landed[0].startswith("log"):
            out.committed += 1
        else:
            out.rejected += 1
        out.redelivered_copies += len(landed) - len(distinct)
    out.unaccounted = sum(1 for position in outcomes if position not in sent_set)
    return out
