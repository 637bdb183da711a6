"""The web console: runs, a run with its state at any index, replay comparisons, analytics.

Pages are pure renderers (:mod:`agentlog.console.pages`, records in, HTML out); each page's
reads are one call in :mod:`agentlog.console.views` (an open store in, ``(status, html)`` out).
Nothing here imports Faust: the worker's routes live in :mod:`agentlog.worker.console`.
"""

from agentlog.console.pages import render_state_panel, run_href
from agentlog.console.state import StateView, state_at
from agentlog.console.views import (
    Opener,
    Page,
    analytics_view,
    chain_problem,
    compare_view,
    replays_view,
    run_head,
    run_view,
    runs_view,
    state_fragment,
    unsealed,
)

__all__ = [
    # views: store + request parameters -> (status, html)
    "Opener", "Page", "analytics_view", "compare_view", "replays_view", "run_head", "run_view", "runs_view",
    "state_fragment",
    "unsealed",
    # pieces
    "StateView", "chain_problem", "render_state_panel", "run_href", "state_at",
]
