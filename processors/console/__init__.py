"""The web console: runs, a run with its state at any index, replay comparisons, analytics.

Pages are pure renderers (:mod:`processors.console.pages`, records in, HTML out); each page's
reads are one call in :mod:`processors.console.views` (an open store in, ``(status, html)`` out).
Nothing here imports Faust: the worker's routes live in :mod:`processors.worker.console`.
"""

from processors.console.pages import render_state_panel, run_href
from processors.console.state import StateView, state_at
from processors.console.views import (
    Page,
    analytics_view,
    chain_problem,
    compare_view,
    replays_view,
    run_view,
    runs_view,
    state_fragment,
)

__all__ = [
    # views: store + request parameters -> (status, html)
    "Page", "analytics_view", "compare_view", "replays_view", "run_view", "runs_view", "state_fragment",
    # pieces
    "StateView", "chain_problem", "render_state_panel", "run_href", "state_at",
]
