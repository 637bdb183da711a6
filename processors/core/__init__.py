"""The pure core: one fold, the handoff machine, the sequencing decision, the run-state step.

Nothing in this package does I/O or imports Kafka, ClickHouse or Faust
(``tests/unit/core/test_purity.py`` enforces it), so the live worker, replay and the
tests run the very same code, byte for byte.
"""

from agentlog.core.fold import FoldError, fold, fold_all, initial_state, observable, state_hash, states_by_index
from agentlog.core.handoff import HandoffError, derive_child_outcome, join
from agentlog.core.result_cache import ResultCache, tool_cache_key
from agentlog.core.runstate import TERMINAL_TYPES, advance, fold_next
from agentlog.core.sequencing import Accepted, Decision, Redelivered, Rejected, Source, decide, rejection_record
from agentlog.core.statehash import StateHasher

__all__ = [
    # fold
    "FoldError", "fold", "fold_all", "initial_state", "observable", "state_hash", "states_by_index",
    # handoff machine
    "HandoffError", "derive_child_outcome", "join",
    # sequencing
    "Accepted", "Decision", "Redelivered", "Rejected", "Source", "decide", "rejection_record",
    # run state
    "TERMINAL_TYPES", "StateHasher", "advance", "fold_next",
    # observable-result cache
    "ResultCache", "tool_cache_key",
]
