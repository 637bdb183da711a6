"""The public API at ``agentlog``: every exported name resolves, and importing the package stays cheap.

``agentlog`` re-exports its public names lazily (PEP 562), so ``import agentlog`` must load no engine
library and no agent framework; a name loads its module when it is read.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agentlog

REPO = Path(__file__).resolve().parents[2]
#: What a program that only imports agentlog must not pay for: the engines and the agent frameworks.
HEAVY = ("faust", "mode", "chdb", "clickhouse_connect", "aiokafka", "pydantic_ai", "agents", "langchain_core",
         "langgraph")
FRAMEWORK_ADAPTERS = {"pydantic_ai": "agentlog.replay.frameworks.pydantic_ai",
                      "agents": "agentlog.replay.frameworks.openai_agents",
                      "langchain_core": "agentlog.replay.frameworks.langchain"}


def _loaded_after(code: str, tmp_path: Path) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running ``code`` (outside the checkout)."""
    probe = f"{code}\nimport sys, json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_importing_agentlog_loads_no_engine_and_no_framework(tmp_path):
    assert _loaded_after("import agentlog", tmp_path) == []


def test_a_name_loads_its_module_when_it_is_read(tmp_path):
    """The probe above can see an import: reading ``Publisher`` loads the Kafka client it needs."""
    assert "aiokafka" in _loaded_after("from agentlog import Publisher", tmp_path)


def test_every_name_in_all_resolves():
    missing = [name for name in agentlog.__all__ if getattr(agentlog, name, None) is None]
    assert missing == []
    assert len(set(agentlog.__all__)) == len(agentlog.__all__)
    assert set(agentlog.__all__) <= set(dir(agentlog))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Publishr'"):
        agentlog.Publishr  # noqa: B018


def test_type_checkers_see_the_names_the_package_exports():
    """The ``if TYPE_CHECKING:`` imports (what mypy and IDEs read) name exactly ``__all__``."""
    tree = ast.parse(Path(agentlog.__file__).read_text("utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = [alias.asname or alias.name for node in ast.walk(block) if isinstance(node, ast.ImportFrom)
                for alias in node.names]
    assert sorted(imported) == sorted(agentlog.__all__)


def test_errors_are_rooted_at_agentlog_error():
    errors = [getattr(agentlog, name) for name in agentlog.__all__ if name.endswith(("Error", "Miss", "Failed"))]
    assert errors and all(issubclass(e, agentlog.AgentlogError) for e in errors)


def test_the_version_is_the_distributions():
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    assert agentlog.__version__ == project["version"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_ADAPTERS))
def test_each_framework_adapter_is_a_public_module_with_its_replay_model(framework):
    pytest.importorskip(framework)
    module = importlib.import_module(FRAMEWORK_ADAPTERS[framework])
    assert {"envelope_of", "request_of", "response_of"} <= set(module.__all__)
    assert any(name.startswith("Replay") for name in module.__all__)
    assert all(hasattr(module, name) for name in module.__all__)
