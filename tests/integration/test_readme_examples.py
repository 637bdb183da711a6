"""The README's Python examples run as written.

Every fenced ``python`` block of ``README.md`` is a program. Each runs in a fresh interpreter whose working
directory is an empty tmp dir (so ``agentlog`` is the installed package, not the checkout's folders) and whose
``AGENTLOG_*`` environment points at the session's broker under a topic prefix of this module's, where a worker
runs. A block that fails fails its test, named by the block's line in the README.

A block that cannot run alone says how it runs in an HTML comment on the line before its fence; a block without
one runs as it is:

* ``<!-- example: NAME -->`` names the block, so that another can continue it;
* ``<!-- example: continues NAME -->`` runs after the code of block NAME (and of what NAME continues), as one program;
* ``<!-- example: pytest, continues NAME -->`` is a pytest module (NAME's code, then this block's): it runs under
  pytest, and its tests must pass.

A comment the test does not understand, or that continues a block not above it, fails collection.

After each block, every run the examples published must be committed whole by the worker: each event of the ingest
topic at its ``(runId, sequence)`` on the log, and nothing on the rejections topic.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.worker.worker_proc import WorkerProcess, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"
_MARKER = re.compile(r"<!--\s*example:\s*(?P<clauses>.*?)\s*-->")
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
#: A guard against a hung example (a subprocess pytest-timeout cannot reach), not a measure of its speed.
_HANG_GUARD_S = 600


@dataclass(frozen=True)
class Block:
    """One fenced python block: where it starts (the fence's line), its code and how it runs."""

    line: int
    code: str
    name: str | None = None
    continues: Block | None = None
    pytest: bool = False

    @property
    def program(self) -> str:
        """The code that runs: what this block continues, then its own."""
        return (self.continues.program + "\n\n" if self.continues else "") + self.code


def _marker(lines: list[str], fence: int) -> str | None:
    """The marker's clauses on the nearest non-blank line above the fence (0-based index), if it is one."""
    above = fence - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    found = _MARKER.fullmatch(lines[above].strip()) if above >= 0 else None
    return found["clauses"] if found else None


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    """The python blocks of ``text`` in order, each with what its marker says.

    Raises:
        ValueError: a marker the test does not understand, or one that continues a block not above it.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    named: dict[str, Block] = {}
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{source}:{i + 1}: the python block has no closing fence")
        where = f"{source}:{i + 1}"
        name, continues, under_pytest = None, None, False
        for clause in (c.strip() for c in (_marker(lines, i) or "").split(",") if c.strip()):
            words = clause.split()
            if words == ["pytest"]:
                under_pytest = True
            elif len(words) == 2 and words[0] == "continues":
                if words[1] not in named:
                    raise ValueError(f"{where}: '{clause}' names no block above it (named: {sorted(named)})")
                continues = named[words[1]]
            elif len(words) == 1 and _NAME.fullmatch(words[0]):
                name = words[0]
            else:
                raise ValueError(f"{where}: the example marker says {clause!r}; it understands NAME, "
                                 "'continues NAME' and 'pytest'")
        block = Block(line=i + 1, code="\n".join(lines[i + 1:end]) + "\n", name=name, continues=continues,
                      pytest=under_pytest)
        if name is not None:
            if name in named:
                raise ValueError(f"{where}: a block above is already named {name!r}")
            named[name] = block
        blocks.append(block)
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text("utf-8"))


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    """Settings under a topic prefix of this module's, and a worker that commits what the examples publish."""
    from agentlog.streams.admin import ensure_topics
    from agentlog.streams.settings import load_settings

    home = tmp_path_factory.mktemp("readme")
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}", home=home,
                             clickhouse_url=f"chdb://{home / 'ch'}", replication_factor=1, partitions=2)
    asyncio.run(ensure_topics(settings))
    worker = WorkerProcess(settings).start()
    yield settings, worker
    worker.stop()


def _run(block: Block, settings, cwd: Path) -> subprocess.CompletedProcess[str]:
    from agentlog.streams.settings import settings_env

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, not the checkout
    env.update(settings_env(settings))
    if block.pytest:
        script = cwd / "test_readme_example.py"
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
    else:
        script = cwd / "readme_example.py"
        args = [sys.executable, script.name]
    script.write_text(block.program, encoding="utf-8")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=_HANG_GUARD_S)


async def _published_and_committed(settings) -> tuple[set, set, list]:
    """(``(runId, sequence)`` on ingest, the same on the log, the rejection records) under the settings' prefix."""
    from agentlog.streams.reader import read_topic

    ingest = {(v.get("runId"), v.get("sequence"))
              async for _, _, _, v in read_topic(settings, "ingest", skip_undecodable=True)}
    log = {(v["doc"]["runId"], v["doc"]["sequence"]) async for _, _, _, v in read_topic(settings, "log")}
    rejections = [v async for _, _, _, v in read_topic(settings, "rejections")]
    return ingest, log, rejections


@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_the_readme_example_runs_as_written(block: Block, stack, tmp_path):
    settings, worker = stack
    done = _run(block, settings, tmp_path)
    assert done.returncode == 0, (
        f"README.md:{block.line}: the python block{' (under pytest)' if block.pytest else ''} exited "
        f"{done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")

    async def committed_or_rejected():
        ingest, log, rejections = await _published_and_committed(settings)
        return (ingest, log, rejections) if rejections or ingest <= log else None

    ingest, log, rejections = asyncio.run(wait_until(committed_or_rejected, worker=worker,
                                                     what="the examples' events on the log"))
    assert rejections == [], f"README.md:{block.line}: the worker rejected events the examples published"
    assert ingest <= log


def test_the_readme_has_python_examples_and_each_marker_is_understood():
    """The parser the test relies on: a README without blocks, or a marker it misreads, would test nothing."""
    assert BLOCKS and any(b.continues for b in BLOCKS) and any(b.pytest for b in BLOCKS)
    text = "<!-- example: a -->\n```python\nx = 1\n```\n\n<!-- example: pytest, continues a -->\n```python\ny = x\n```\n"
    first, second = readme_blocks(text)
    assert (first.name, second.pytest, second.continues) == ("a", True, first)
    assert second.program == "x = 1\n\n\ny = x\n"
    with pytest.raises(ValueError, match=r"README.md:2: .*names no block above"):
        readme_blocks("<!-- example: continues b -->\n```python\n```\n")
    with pytest.raises(ValueError, match="understands NAME"):
        readme_blocks("<!-- example: run later -->\n```python\n```\n")
