"""The worker's sequencer on its runtime of Kafka transactions against bare aiokafka, in the same run.

``bench_process``'s realistic paths:

- ``ours``: ``agentlog worker --role process`` (:mod:`agentlog.worker.txruntime`): each batch's outputs, changelog
  records and ingest offsets in one transaction; its log read committed only;
- ``bare`` and ``bare_tx``: aiokafka consume → produce copying the bytes, without and with transactions
  (``bench_process._bare``, ``bench_runtime._tx_loop``);
- ``faust``: Faust's own pass-through (:mod:`tests.bench.passthrough_faust`: an agent forwarding each record, no
  work), the ceiling of any Faust agent.

Throughput = N / (last log record's broker timestamp − first one's), as in ``bench_process``. ``ours`` against
``bare`` is the ratio of the runtime issue's goal (≥ 0.35×).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.bench import PASSTHROUGH_ARGS, BenchContext
from tests.bench.bench_process import _run_subprocess
from tests.bench.bench_runtime import baselines, variants

REPO = Path(__file__).resolve().parents[2]
WORKER = ["-m", "agentlog", "worker", "--role", "process", "--no-web"]


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    home = REPO / ".agentlog" / "bench" / f"txprocess-{uuid.uuid4().hex[:6]}"
    variant = variants(ctx, home, "benchtxp", n)

    bare, bare_tx = baselines(variant, n)
    ours_cpu: dict = {}
    ours = n / _run_subprocess(variant("ours"), WORKER, n, home / "ours.log", cpu=ours_cpu,
                               isolation_level="read_committed")
    faust = n / _run_subprocess(variant("faust"), PASSTHROUGH_ARGS, n, home / "faust.log")
    return {
        "ours": ours,
        "baseline": bare,
        "unit": "events/s (realistic runs)",
        "goal_ratio": 0.35,
        "details": {"events": n, "bare_events_per_s": bare, "bare_tx_events_per_s": bare_tx,
                    "ours_events_per_s": ours, "faust_passthrough_events_per_s": faust,
                    "ours_vs_bare": ours / bare, "ours_vs_bare_tx": ours / bare_tx, "ours_vs_faust_passthrough": ours / faust,
                    "faust_passthrough_vs_bare": faust / bare, "ours_cpu": ours_cpu},
    }
