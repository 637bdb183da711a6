"""The sdist and the wheel, built as ``make dist`` builds them and installed in a fresh venv away from the checkout.

One build and one venv for the module (a tmp directory; no system site-packages): the wheel, ``pytest`` and
``pydantic-ai-slim``, every package at the version this test's own environment has (a constraints file), fetched
from the package index through pip's cache. Every command then runs from a folder outside the checkout with no
``PYTHONPATH``, so what it imports is what the wheel installed:

* the sdist holds every tracked file of the package folders, the wheel every one of them under ``agentlog/``
  (the license text in its ``.dist-info``) and no other top-level name;
* site-packages gains the import package ``agentlog`` and none of ``schemas``, ``streams``, ``processors``,
  ``infra``; ``agentlog --help`` runs;
* ``agentlog infra fetch`` and ``agentlog demo --json`` in a home of their own, the demo starting its own broker
  on free ports and its worker from the venv, then ``agentlog demo --stop-only``; the demo's migrations are the
  checkout's migration files and its verdicts the ones it provokes;
* a replay test, written into the tmp folder with a pydantic-ai program and its recording, passes through the
  ``agentlog_replay`` fixture of the installed pytest plugin.

A data file left out of the wheel (a migration, the Avro schema, ``pom.xml``, an upstream schema) fails the
wheel's file check, and the demo too where it reads the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from importlib.metadata import distributions, version
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.tools import free_port_range
from tests.unit.test_packaging import PROJECT, REPO, installed_path, license_files, tracked_package_files

# Building, and installing some hundred packages into a new venv, come before the first test's body.
pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(1800)]

VERSION = PROJECT["version"]
DIST_INFO = f"agentlog-{VERSION}.dist-info"
FOLDER_NAMES = ("schemas", "streams", "processors", "infra")
#: Copied into the replay test's folder: the corpus programs and the recording of the pydantic-ai one.
PROGRAM_FILES = ("tests/otel_corpus/__init__.py", "tests/otel_corpus/script.py", "tests/otel_corpus/programs.py")
RECORDING = REPO / "tests/unit/replay/recorded/pydantic_ai.recorded.jsonl"


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _installed() -> dict[str, str]:
    """Every distribution of this test's environment but agentlog, by name, at the version imported."""
    found: dict[str, str] = {}
    for d in distributions():
        name = canonicalize_name(d.metadata["Name"] or "")
        if name and name != "agentlog":
            found.setdefault(name, d.version)  # the first on sys.path is the one imported
    return found


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    root: Path
    site_packages: Path
    env: dict[str, str]
    #: A folder outside the checkout, the working directory of every command.
    outside: Path

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 300,
            **env: str) -> subprocess.CompletedProcess[str]:
        """``args[0]`` from the venv's bin folder (``python``, ``agentlog``), the rest as its arguments."""
        return subprocess.run([str(self.root / "bin" / args[0]), *args[1:]], cwd=cwd or self.outside,
                              env={**self.env, **env}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` (the sdist, then the wheel from it) on a copy of the tracked sources: the build writes its
    egg-info beside ``pyproject.toml``, which in the checkout would race another session's build, and a file that
    git does not track is not in a release either."""
    source = tmp_path_factory.mktemp("source")
    for path in ["pyproject.toml", "README.md", *tracked_package_files()]:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, source / path)
    out = tmp_path_factory.mktemp("dist")
    _ok(subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                       capture_output=True, text=True, timeout=900))
    return Dist(sdist=out / f"agentlog-{VERSION}.tar.gz", wheel=out / f"agentlog-{VERSION}-py3-none-any.whl")


@pytest.fixture(scope="module")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    root = tmp_path_factory.mktemp("venv")
    outside = tmp_path_factory.mktemp("elsewhere")
    assert not root.is_relative_to(REPO) and not outside.is_relative_to(REPO)
    _ok(subprocess.run([sys.executable, "-m", "venv", str(root)], capture_output=True, text=True, timeout=300))
    # Nothing of this session's environment that points at the checkout or configures agentlog.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTLOG_", "PYTHON", "PYTEST_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    constraints = outside / "constraints.txt"
    constraints.write_text("".join(f"{name}=={pinned}\n" for name, pinned in sorted(_installed().items())))
    _ok(subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints),
                        str(dist.wheel), f"pytest=={version('pytest')}",
                        f"pydantic-ai-slim=={version('pydantic-ai-slim')}"],
                       cwd=outside, env=env, capture_output=True, text=True, timeout=1500))
    purelib = _ok(subprocess.run([str(root / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 cwd=outside, env=env, capture_output=True, text=True)).stdout.strip()
    yield Venv(root=root, site_packages=Path(purelib), env=env, outside=outside)
    shutil.rmtree(root)  # a gigabyte (chdb, RocksDB); pytest keeps the last runs' tmp folders


def test_the_sdist_holds_the_sources_and_data_files(dist: Dist):
    with tarfile.open(dist.sdist) as sdist:
        names = {m.name.removeprefix(f"agentlog-{VERSION}/") for m in sdist.getmembers()}
    missing = sorted({*tracked_package_files(), "pyproject.toml", "README.md"} - names)
    assert missing == [], f"the sdist lacks {missing}"


def test_the_wheel_holds_one_import_package_its_files_and_metadata(dist: Dist):
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = Parser().parsestr(wheel.read(f"{DIST_INFO}/METADATA").decode("utf-8"))
        entry_points = wheel.read(f"{DIST_INFO}/entry_points.txt").decode("utf-8")
    assert {n.split("/")[0] for n in names} == {"agentlog", DIST_INFO}
    licenses = license_files()
    expected = {installed_path(p) for p in tracked_package_files() if p not in licenses}
    expected |= {f"{DIST_INFO}/licenses/{p}" for p in licenses}
    assert "agentlog/py.typed" in expected
    missing = sorted(expected - names)
    assert missing == [], f"the wheel lacks {missing}"

    assert (metadata["Name"], metadata["Version"]) == ("agentlog", VERSION)
    assert metadata["License-Expression"] == PROJECT["license"]
    assert metadata.get_all("License-File") == sorted(licenses)
    assert metadata.get_all("Classifier") == PROJECT["classifiers"]
    assert metadata.get_all("Project-URL") == [f"{k}, {v}" for k, v in PROJECT["urls"].items()]
    assert "agentlog = agentlog.cli:main" in entry_points
    assert "[pytest11]\nagentlog = agentlog.replay.pytest_plugin" in entry_points


def test_site_packages_gains_agentlog_and_none_of_the_folder_names(venv: Venv):
    top = {p.name.removesuffix(".py") for p in venv.site_packages.iterdir()}
    assert "agentlog" in top
    assert top.isdisjoint(FOLDER_NAMES), sorted(top & set(FOLDER_NAMES))
    record = (venv.site_packages / DIST_INFO / "RECORD").read_text("utf-8").splitlines()
    assert {row.split("/")[0] for row in record if not row.startswith("..")} == {"agentlog", DIST_INFO}

    for name in FOLDER_NAMES:
        imported = venv.run("python", "-c", f"import {name}")
        assert imported.returncode == 1 and f"No module named '{name}'" in imported.stderr, imported.stderr
    where = _ok(venv.run("python", "-c", "import agentlog; print(agentlog.__version__); print(agentlog.__file__)"))
    assert where.stdout.split() == [VERSION, str(venv.site_packages / "agentlog" / "__init__.py")]
    helped = _ok(venv.run("agentlog", "--help"))
    assert "demo" in helped.stdout and "replay-test" in helped.stdout


@pytest.fixture
def demo_env(venv: Venv, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A home of the demo's own and five free ports in a row: its broker's client and controller ports, its worker's
    web port, OTLP/gRPC and OTLP/HTTP. Afterwards the demo worker and the broker are stopped whatever the test did
    (as tests/integration/demo/ stops its worker)."""
    from agentlog.demo.tour import stop_worker
    from agentlog.infra.kafka import local
    from agentlog.streams.settings import load_settings, settings_env

    port = free_port_range(5)
    settings = load_settings(home=tmp_path / "home", kafka_bootstrap=f"127.0.0.1:{port}", web_port=port + 2,
                             otlp_port=port + 4)
    env = {k: settings_env(settings)[k] for k in ("AGENTLOG_HOME", "AGENTLOG_KAFKA_BOOTSTRAP", "AGENTLOG_WEB_PORT",
                                                 "AGENTLOG_OTLP_PORT")}
    try:
        yield env
    finally:
        stop_worker(settings)
        local.stop(settings)


def test_the_demo_runs_from_the_installed_package(venv: Venv, demo_env: dict[str, str]):
    from agentlog.infra.kafka import local
    from agentlog.streams.settings import load_settings

    fetched = json.loads(_ok(venv.run("agentlog", "infra", "fetch", "--json", timeout=900, **demo_env)).stdout)
    assert (Path(fetched["libs"]) / f"kafka_2.13-{fetched['kafkaVersion']}.jar").is_file()

    summary = json.loads(_ok(venv.run("agentlog", "demo", "--json", timeout=900, **demo_env)).stdout.splitlines()[-1])
    assert summary["broker"]["started"] and summary["broker"]["local"], summary["broker"]
    assert summary["migrations"] == sorted(Path(p).stem for p in tracked_package_files()
                                           if p.startswith("infra/clickhouse/migrations/0"))
    assert summary["head_verified"] and len(summary["head_hash"]) == 64
    assert summary["offset_replay"]["status"] == "match", summary["offset_replay"]
    assert [(r["verdict"], r["source"]) for r in summary["replays"]] == [
        ("diverged", "worker verdict"), ("diverged_at_refusal", "worker verdict")], summary["replays"]

    _ok(venv.run("agentlog", "demo", "--stop-only", timeout=120, **demo_env))
    settings = load_settings(home=demo_env["AGENTLOG_HOME"], kafka_bootstrap=demo_env["AGENTLOG_KAFKA_BOOTSTRAP"])
    assert not any(n.alive for n in local.status(settings))


REPLAY_TEST = '''\
from pathlib import Path

from tests.otel_corpus.programs import pydantic_ai_program

RECORDING = Path(__file__).parent / "pydantic_ai.recorded.jsonl"


def test_the_support_agent_still_behaves(agentlog_replay):
    assert agentlog_replay(RECORDING, pydantic_ai_program()).verdict == "match"


def test_a_changed_tool_result_diverges_at_it(agentlog_replay):
    result = agentlog_replay(RECORDING, pydantic_ai_program(lookup_result="order 42: lost in transit"),
                             expect="diverged")
    assert result.first_divergence.path == "payload.result"
'''


def test_a_replay_test_passes_with_the_installed_pytest_plugin(venv: Venv, tmp_path: Path):
    case = tmp_path / "case"
    for path in PROGRAM_FILES:
        (case / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, case / path)
    (case / "tests" / "__init__.py").touch()
    shutil.copyfile(RECORDING, case / RECORDING.name)
    (case / "test_support_replay.py").write_text(REPLAY_TEST)

    ran = venv.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_support_replay.py", cwd=case)
    assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-3000:]
