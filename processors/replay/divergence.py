"""The one divergence language of both replay jobs (SPEC §7).

Host-replay comparison (:mod:`agentlog.replay.compare`) and re-derivation from an offset
(:mod:`agentlog.replay.rederive`) each report where a run stops reproducing what it should,
as the same frozen :class:`Divergence`. Its ``kind`` is one :data:`DivergenceKind`:

* ``output`` — a compared field, the observable state or (as the cause of a divergence) an LLM request
  differs (comparison);
* ``missing`` / ``extra`` — an index only the reference / only the other side has
  (comparison: original vs replay); re-derivation reports ``missing`` where the committed log
  skips a sequence;
* ``type-mismatch`` — different event types at one index (comparison);
* ``refusal`` — a valid LLM envelope on one side, a refusal on the other (comparison, RFC 0041 §B);
* ``state`` — the refolded state hash differs from the one the log record carries (re-derivation);
* ``tampered`` — the hash chain is broken or a committed record was rewritten (re-derivation).

``expected`` is always the reference's value (the original run, or what was recorded) and
``actual`` the value found (the replay, or what was refolded from the log).

The JSON each engine has always emitted is a contract (verdict records, ``--json``, golden
files), and the two shapes differ, so :meth:`Divergence.to_dict` keeps both, chosen by
``engine``: a comparison divergence is
``{atSequence, kind, originalEventId, path, expected, actual}`` and a re-derivation one
``{atSequence, kind, path, expected, actual, logOffset, detail}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Divergence", "DivergenceEngine", "DivergenceKind"]

DivergenceKind = Literal["output", "missing", "extra", "type-mismatch", "refusal", "state", "tampered"]

#: Which job found the divergence; it decides the JSON shape (see the module docstring).
DivergenceEngine = Literal["comparison", "rederivation"]


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """One place where a run does not reproduce its reference.

    ``path`` locates the difference inside the event, state or record (``None`` for a whole
    missing/extra index). ``detail`` says why in words (and when a field is absent on one
    side, since ``expected``/``actual`` are then ``None``). ``aspect`` is the metric label the
    divergence counts under (``replay_behavior_mismatch_total{aspect}``).

    Comparison only: ``original_event_id``, ``node_id``, ``event_type``. Re-derivation only:
    ``log_offset`` (where in the run's log partition the divergent record sits).
    """

    engine: DivergenceEngine
    at_sequence: int
    kind: DivergenceKind
    path: str | None
    expected: Any
    actual: Any
    detail: str = ""
    aspect: str = "result"
    original_event_id: str | None = None
    node_id: str | None = None
    event_type: str | None = None
    log_offset: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON this divergence's engine emits (keys and order as they always were)."""
        if self.engine == "rederivation":
            return {"atSequence": self.at_sequence, "kind": self.kind, "path": self.path,
                    "expected": self.expected, "actual": self.actual, "logOffset": self.log_offset,
                    "detail": self.detail}
        return {"atSequence": self.at_sequence, "kind": self.kind, "originalEventId": self.original_event_id,
                "path": self.path, "expected": self.expected, "actual": self.actual}
