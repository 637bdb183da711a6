"""CrewAI, LlamaIndex, smolagents, Strands and AutoGen programs exported live to a real worker, each instrumentation.

Each framework's pins conflict with the main venv's, so its program (``tests/otel_corpus/recorders/``) runs in the
framework's own environment, ``.venvs/<framework>``, which :func:`tests.otel_corpus.envs.ensure` builds from the
pinned list in ``tests/otel_corpus/requirements/`` or reuses (a build takes under a minute; README "Sending
OpenTelemetry traces"). Without a package index the test skips saying so, except where tools are required (CI
reaches PyPI, so there it builds). The program runs offline against the scripted OpenAI-compatible fake with the
SDK's ``OTLPSpanExporter`` configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables only, as a user's is,
and sends its spans with a token to an ``agentlog worker``; the runs read back from the committed log pass the
corpus unit tests' own checks (``tests/unit/core/test_otel_frameworks.py``), and the audit store holds the handoff's
transitions and the script's tokens. Every framework × instrumentation of the corpus, over gRPC or HTTP in turn.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.otel.test_frameworks_live import (
    QUICK,
    REPO,
    TOKEN,
    _check_equal,
    _committed_runs,
    _eventually,
    _grpc_export,
    _http_export,
    _otlp_port,
    _sql_rows,
    _usage,
)
from tests.integration.otel.test_otlp_ingest import _wait_for
from tests.integration.worker.worker_proc import WorkerProcess
from tests.otel_corpus import envs
from tests.otel_corpus import script_frameworks as fw
from tests.tools import REQUIRE_TOOLS_ENV, free_port
from tests.unit.core.test_otel_frameworks import (
    check_llm_calls,
    check_runs_and_the_handoff,
    check_tool_pairs,
    framework_runs,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

#: (framework, instrumentation, protocol): every framework × instrumentation the corpus records.
CASES = [
    ("crewai", "openinference", "http/protobuf"),
    ("llama_index", "openinference", "grpc"),
    ("smolagents", "openinference", "http/protobuf"),
    ("strands", "genai", "grpc"),
    ("strands", "openinference", "http/protobuf"),
    ("autogen", "genai", "http/protobuf"),
    ("autogen", "openinference", "grpc"),
]


def test_every_recorded_case_has_a_live_one():
    assert sorted((f, i) for f, i, _ in CASES) == sorted(fw.CASES)


def _environment(framework: str) -> str:
    """The framework's interpreter, its environment built or reused; skip (fail where tools are required) if it
    cannot be built here."""
    try:
        return str(envs.ensure(framework))
    except envs.EnvUnavailable as e:
        if os.environ.get(REQUIRE_TOOLS_ENV) or os.environ.get("CI"):
            pytest.fail(f"{e}", pytrace=False)
        pytest.skip(f"the {framework} environment cannot be built here (no package index?): "
                    f"{str(e).splitlines()[0]}")


@pytest.mark.parametrize("framework,instrumentation,protocol", CASES,
                         ids=[f"{f}-{i}-{'grpc' if p == 'grpc' else 'http'}" for f, i, p in CASES])
def test_a_live_program_arrives_as_its_runs(settings, framework, instrumentation, protocol):
    python = _environment(framework)
    port = _otlp_port()
    settings = settings.replace(otlp_port=port, web_port=free_port(), web_host="0.0.0.0", web_token=TOKEN)
    worker = WorkerProcess(settings, sink=True, web=True, log_name=f"live-{framework}-{instrumentation}",
                           constants=QUICK).start()
    try:
        if protocol == "grpc":
            pytest.importorskip("grpc", reason="pip install -e '.[grpc]' (make venv does)")
            _wait_for("the OTLP/gRPC receiver", lambda: _grpc_export(port - 1, b"", None) == "UNAUTHENTICATED")
            endpoint = f"http://127.0.0.1:{port - 1}"
        else:
            _wait_for("the OTLP/HTTP receiver", lambda: _http_export(port, b"", None) == 401)
            endpoint = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
               "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}"}
        out = subprocess.run([python, "-m", "tests.otel_corpus.record", "--live", f"{framework}.{instrumentation}"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]

        def arrived() -> tuple[dict[str, list[dict]], str, str]:
            runs = _committed_runs(settings)
            root, child = framework_runs(runs, framework)
            check_runs_and_the_handoff(framework, runs, root, child)
            check_llm_calls(framework, runs, root, child)
            check_tool_pairs(framework, instrumentation, runs, root, child)
            return runs, root, child

        _, root, child = _eventually("the program's runs, whole", arrived)

        def transitions() -> None:
            rows = _sql_rows(settings, f"SELECT phase, child_run_id FROM transitions WHERE parent_run_id = '{root}'")
            assert rows is not None and len(rows) == 3, rows
            assert sorted(r[0] for r in rows) == ["child.completed", "dispatch.began", "dispatch.succeeded"]
            assert {r[1] for r in rows if r[0] != "dispatch.began"} == {child}

        _eventually("the handoff transitions", transitions)
        calls = fw.CALLS[framework]
        expected = (sum(c[2] for c in calls), sum(c[3] for c in calls))
        _eventually("usage equal to the script's tokens", lambda: _check_equal(_usage(settings), expected))
        assert _sql_rows(settings, "SELECT count() FROM rejections") == [[0]]
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
