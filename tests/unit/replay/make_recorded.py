"""Re-record the replay-test pairs in ``recorded/`` (``python -m tests.unit.replay.make_recorded``).

Per corpus program (:mod:`tests.otel_corpus.programs`): ``<program>.recorded.jsonl``, the program as it
is, recorded live on its scripted models (the unchanged program replays it as a ``match``); and
``<program>.divergent.jsonl``, recorded when its tool answered something else (the unchanged program
replays it as ``diverged`` at that tool's result). Needs the frameworks (``pip install -e '.[replay]'``).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentlog.replay.regression import record
from tests.otel_corpus.programs import PROGRAMS

HERE = Path(__file__).parent / "recorded"
#: What the tool answered when the divergent recording was made, per program (its knob's name and value).
CHANGED_TOOL = {"pydantic_ai": {"lookup_result": "order 42: not found"},
                "openai_agents": {"lookup_result": "order 42: not found"},
                "langgraph": {"search_result": "no papers found"}}


def main() -> None:
    HERE.mkdir(exist_ok=True)
    for name, make in PROGRAMS.items():
        for kind, knobs in (("recorded", {}), ("divergent", CHANGED_TOOL[name])):
            docs = record(make(**knobs), run_id=f"{name}-{kind}")
            path = HERE / f"{name}.{kind}.jsonl"
            path.write_text("".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs),
                            encoding="utf-8")
            print(f"{path}: {len(docs)} events")


if __name__ == "__main__":
    main()
