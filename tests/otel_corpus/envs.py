"""An environment of its own for each framework whose pins conflict with the main venv's, for recording and live tests.

    python -m tests.otel_corpus.envs build crewai     # .venvs/crewai from tests/otel_corpus/requirements/crewai.txt
    python -m tests.otel_corpus.envs build --all      # every one, each timed
    python -m tests.otel_corpus.envs python strands   # the interpreter of one (built if missing or stale)

Strands requires OpenTelemetry 1.45 where the main venv's Google ADK allows 1.44 at most, and CrewAI brings a large
tree of its own, so CrewAI, LlamaIndex, smolagents, Strands and AutoGen each get ``.venvs/<name>`` (ignored by git),
built from the pinned list ``tests/otel_corpus/requirements/<name>.txt``. An environment holds the framework, its
instrumentations, the OpenTelemetry SDK and the OTLP exporters: the programs (``tests/otel_corpus/recorders/``) run
in it with the repository on ``PYTHONPATH`` and import nothing of agentlog's. A build records the list's SHA-256 in
the environment; a changed list builds it anew. The corpus unit tests read the recorded fixtures and need none of
these.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ENVS", "EnvUnavailable", "build", "ensure", "python"]

HERE = Path(__file__).parent
REPO = HERE.parents[1]
REQUIREMENTS = HERE / "requirements"
VENVS = REPO / ".venvs"
ENVS = ("crewai", "llama_index", "smolagents", "strands", "autogen")
_STAMP = "agentlog-requirements.sha256"


class EnvUnavailable(RuntimeError):
    """The environment could not be built (pip could not reach the index, or could not resolve the pins)."""


def _digest(name: str) -> str:
    return hashlib.sha256((REQUIREMENTS / f"{name}.txt").read_bytes()).hexdigest()


def python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def _current(name: str) -> bool:
    stamp = VENVS / name / _STAMP
    return python(name).exists() and stamp.exists() and stamp.read_text().strip() == _digest(name)


def build(name: str) -> float:
    """Build ``.venvs/<name>`` from its pinned list, anew; the seconds it took.

    Raises:
        EnvUnavailable: venv or pip failed (the message ends with pip's last lines).
    """
    if name not in ENVS:
        raise EnvUnavailable(f"no environment {name!r}; one of {', '.join(ENVS)}")
    began = time.monotonic()
    target = VENVS / name
    shutil.rmtree(target, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)  # a venv's python makes a venv of its base interpreter
    steps = ([base, "-m", "venv", str(target)],
             [str(python(name)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "-r", str(REQUIREMENTS / f"{name}.txt")])
    for cmd in steps:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-6:])
            raise EnvUnavailable(f"building .venvs/{name} failed ({' '.join(cmd[-3:])}):\n{tail}")
    (target / _STAMP).write_text(_digest(name) + "\n")
    return time.monotonic() - began


def ensure(name: str) -> Path:
    """The interpreter of ``.venvs/<name>``, built first when it is missing or its list changed."""
    if not _current(name):
        build(name)
    return python(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build environments anew, timed")
    b.add_argument("names", nargs="*", help=", ".join(ENVS))
    b.add_argument("--all", action="store_true")
    p = sub.add_parser("python", help="print an environment's interpreter (built if missing or stale)")
    p.add_argument("name", choices=ENVS)
    args = parser.parse_args()
    try:
        if args.command == "python":
            print(ensure(args.name))
            return
        for name in ENVS if args.all else args.names:
            print(f"{name}: built in {build(name):.0f} s ({os.path.relpath(python(name))})", flush=True)
    except EnvUnavailable as e:
        raise SystemExit(f"error[env_build]: {e}") from None


if __name__ == "__main__":
    main()
