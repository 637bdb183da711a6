"""Replay: one comparison engine, re-derivation from an offset, mock sessions, host-replay verdicts."""

from processors.replay.compare import ComparisonResult, Divergence, compare_outcome, compare_runs, first_difference
from processors.replay.host import host_replay_verdict, host_verdicts
from processors.replay.mock import MockReplaySession, load_result_cache, open_mock_session
from processors.replay.rederive import RederivationResult, replay_run

__all__ = [
    # comparison
    "ComparisonResult", "Divergence", "compare_outcome", "compare_runs", "first_difference",
    # re-derivation
    "RederivationResult", "replay_run",
    # host replay
    "host_replay_verdict", "host_verdicts",
    # mock mode
    "MockReplaySession", "load_result_cache", "open_mock_session",
]
