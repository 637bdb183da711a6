"""Replay: one comparison engine, re-derivation from an offset, mock sessions, host-replay verdicts.

Both replay jobs report what they find as one :class:`Divergence` (kinds: :data:`DivergenceKind`).
"""

from processors.replay.compare import ComparisonResult, compare_outcome, compare_runs, first_difference
from processors.replay.divergence import Divergence, DivergenceEngine, DivergenceKind
from processors.replay.host import host_replay_verdict, host_verdicts
from processors.replay.mock import MockReplaySession, load_result_cache, open_mock_session
from processors.replay.rederive import RederivationResult, replay_run, replay_run_with_host_verdict

__all__ = [
    # divergences (both jobs)
    "Divergence", "DivergenceEngine", "DivergenceKind",
    # comparison
    "ComparisonResult", "compare_outcome", "compare_runs", "first_difference",
    # re-derivation
    "RederivationResult", "replay_run", "replay_run_with_host_verdict",
    # host replay
    "host_replay_verdict", "host_verdicts",
    # mock mode
    "MockReplaySession", "load_result_cache", "open_mock_session",
]
