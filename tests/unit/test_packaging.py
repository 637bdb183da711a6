"""What the wheel holds, read from pyproject.toml without building it.

* ``[tool.setuptools] packages`` names exactly the folders that hold an ``__init__.py`` under the four package
  folders, named as ``package-dir`` maps them;
* every tracked file under those folders that is not Python matches a ``package-data`` pattern, expanded the way
  setuptools expands it (a ``glob`` from the package's folder), or is the license text: nothing the code reads is
  left out of the wheel;
* the version is the changelog's newest release and what ``agentlog.__version__`` reads.

``tests/integration/packaging/test_wheel.py`` builds the wheel and installs it away from the checkout.
"""

from __future__ import annotations

import glob
import re
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
PROJECT = PYPROJECT["project"]
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
#: import package -> repository folder (``processors`` is ``agentlog``, ``schemas`` is ``agentlog.schemas``, ...)
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
CHANGELOG = REPO / "processors" / "CHANGELOG.md"


def package_folder(package: str) -> str:
    """The repository folder of an import package: its nearest ``package-dir`` ancestor's folder, then the rest."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = ".".join(parts[:cut])
        if mapped in PACKAGE_DIR:
            return "/".join([PACKAGE_DIR[mapped], *parts[cut:]])
    raise AssertionError(f"{package} is under no package-dir entry")


def installed_path(path: str) -> str:
    """Where a file of the repository's package folders lands in site-packages: ``processors/cli/x.py`` is
    ``agentlog/cli/x.py``, ``schemas/avro/run_event.avsc`` is ``agentlog/schemas/avro/run_event.avsc``."""
    package, folder = max(((p, f) for p, f in PACKAGE_DIR.items() if path.startswith(f + "/")),
                          key=lambda item: len(item[1]))
    return "/".join([*package.split("."), path.removeprefix(folder + "/")])


def tracked_package_files() -> list[str]:
    """The files git tracks under the package folders, relative to the repository."""
    out = subprocess.run(["git", "ls-files", "--", *sorted(PACKAGE_DIR.values())], cwd=REPO,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip("not a git checkout")
    return out.stdout.split()


def package_data_files() -> set[str]:
    """Every file the ``package-data`` patterns match, relative to the repository: setuptools joins each pattern
    (the package's own and those of ``"*"``) to the package's folder and expands it with ``glob``."""
    patterns = SETUPTOOLS["package-data"]
    found: set[str] = set()
    for package in SETUPTOOLS["packages"]:
        folder = REPO / package_folder(package)
        for pattern in [*patterns.get("*", []), *patterns.get(package, [])]:
            found.update(str(Path(p).relative_to(REPO)) for p in glob.glob(str(folder / pattern), recursive=True)
                         if Path(p).is_file())
    return found


def license_files() -> set[str]:
    return {str(Path(p).relative_to(REPO)) for pattern in PROJECT["license-files"]
            for p in glob.glob(str(REPO / pattern), recursive=True)}


def test_packages_are_the_folders_with_an_init():
    inits = [str(path.relative_to(REPO)) for folder in PACKAGE_DIR.values()
             for path in (REPO / folder).rglob("__init__.py")]
    expected = {".".join(Path(installed_path(init)).parent.parts) for init in inits}
    listed = SETUPTOOLS["packages"]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == expected, (f"missing from packages: {sorted(expected - set(listed))}; "
                                     f"listed without a folder: {sorted(set(listed) - expected)}")


def test_every_tracked_module_is_in_a_listed_package():
    folders = {package_folder(p) for p in SETUPTOOLS["packages"]}
    outside = [p for p in tracked_package_files() if p.endswith(".py") and str(Path(p).parent) not in folders]
    assert outside == [], f"Python files the wheel leaves out (their folder is no listed package): {outside}"


def test_every_tracked_data_file_matches_a_package_data_pattern():
    data = [p for p in tracked_package_files() if not p.endswith(".py")]
    assert "processors/py.typed" in data
    missing = sorted(set(data) - package_data_files() - license_files())
    assert missing == [], f"tracked files no package-data pattern ships: {missing}"


def test_the_license_text_ships_once_in_the_dist_info():
    """SPDX expression plus the text; with include-package-data off the text is not package data as well."""
    assert PROJECT["license"] == "Apache-2.0"
    assert SETUPTOOLS["include-package-data"] is False
    assert license_files() == {"processors/LICENSE"}
    text = (REPO / "processors" / "LICENSE").read_text("utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    assert license_files().isdisjoint(package_data_files())


def test_the_version_is_the_changelogs_newest_release_and_the_installed_one():
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", CHANGELOG.read_text("utf-8"), flags=re.MULTILINE)
    assert headings[0] == ("Unreleased", ""), headings[:2]
    newest, dated = headings[1]
    assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", dated), dated
    assert PROJECT["version"] == newest
    assert version("agentlog") == newest, "the installed metadata is older than pyproject.toml: run `make venv`"
    import agentlog

    assert agentlog.__version__ == newest


def test_the_changelog_url_names_the_changelog():
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Source", "Issues", "Changelog"}
    assert urls["Changelog"].endswith("/" + str(CHANGELOG.relative_to(REPO)))
    assert all(u.startswith(urls["Source"]) for u in urls.values())
