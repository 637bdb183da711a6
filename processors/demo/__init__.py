"""The guided tour (``agentlog demo``) on the real local stack."""

from agentlog.demo.tour import DemoSummary, run_demo, stop_demo, stop_worker

__all__ = ["DemoSummary", "run_demo", "stop_demo", "stop_worker"]
