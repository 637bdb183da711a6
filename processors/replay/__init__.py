"""Replay: one comparison engine, re-derivation from an offset, mock sessions, host-replay verdicts, replay tests.

Both replay jobs report what they find as one :class:`Divergence` (kinds: :data:`DivergenceKind`).
"""

from agentlog.replay.compare import ChildPair, ComparisonResult, compare_outcome, compare_runs, first_difference
from agentlog.replay.divergence import Divergence, DivergenceEngine, DivergenceKind
from agentlog.replay.host import host_replay_verdict, host_verdicts
from agentlog.replay.lanes import align, lane_of
from agentlog.replay.mock import MockReplaySession, ReplayCacheMiss, load_result_cache, open_mock_session
from agentlog.replay.recorder import Recorder
from agentlog.replay.rederive import RederivationResult, replay_run, replay_run_with_host_verdict
from agentlog.replay.regression import ReplayTestFailed, ReplayTestResult, record, replay_test
from agentlog.replay.served import ServedResults, results_answer
from agentlog.replay.tree import TreeComparison, compare_tree

__all__ = [
    # divergences (both jobs)
    "Divergence", "DivergenceEngine", "DivergenceKind",
    # comparison
    "ComparisonResult", "compare_outcome", "compare_runs", "first_difference",
    # lanes and run trees
    "ChildPair", "TreeComparison", "align", "compare_tree", "lane_of",
    # re-derivation
    "RederivationResult", "replay_run", "replay_run_with_host_verdict",
    # host replay
    "host_replay_verdict", "host_verdicts",
    # mock mode
    "MockReplaySession", "ReplayCacheMiss", "ServedResults", "load_result_cache", "open_mock_session",
    "results_answer",
    # replay tests (framework adapters: agentlog.replay.frameworks)
    "Recorder", "ReplayTestFailed", "ReplayTestResult", "record", "replay_test",
]
