"""What users install: the wheel holds the whole tree, the suite tests it, its floors are tested."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import bow_gateway

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = Path(sysconfig.get_path("purelib"))
# Each folder of the tree that the wheel ships, to its name in the wheel (setup.py).
SHIPPED = {
    "bow_gateway": "bow_gateway",
    "inbounds": "bow_gateway/inbounds",
    "outbounds": "bow_gateway/outbounds",
    "middlewares": "bow_gateway/middlewares",
}


def floors() -> dict[str, str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    found: dict[str, str] = {}
    for line in setup["options"]["install_requires"].splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*>=\s*([0-9.]+)", line)
        if match:
            found[match[1].lower()] = match[2]
    return found


def pinned() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "tests" / "lowest-versions.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[name.strip().lower()] = version.strip()
    return found


def test_every_dependency_has_a_floor() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requirements = [
        line.strip()
        for line in setup["options"]["install_requires"].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert len(floors()) == len(requirements), requirements


def test_the_lowest_versions_run_are_the_floors_setup_cfg_admits() -> None:
    assert pinned() == floors()


def test_a_plain_install_brings_the_redis_client() -> None:
    # Regression: `pip install .` then a Redis URL died with "No module named 'redis'".
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert "redis" in floors()


def tracked(*paths: str) -> list[str]:
    """The files under ``paths`` that a commit would hold (what git ignores left out): a clone."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [path for path in listed.split("\0") if path and (ROOT / path).is_file()]


@pytest.mark.timeout(300)
def test_the_wheel_holds_every_package_and_data_file_of_the_tree(tmp_path: Path) -> None:
    # Regression: bow_gateway.outbound was missing from setup.cfg's hand-written package list, so
    # every wheel (and `pip install .`) failed at start with ModuleNotFoundError.
    clone = tmp_path / "clone"
    for path in tracked("."):
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, clone / path)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(clone)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("bow_gateway-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        SHIPPED[path.split("/", 1)[0]] + "/" + path.split("/", 1)[1] for path in tracked(*SHIPPED)
    }
    missing = sorted(expected - shipped)
    assert not missing, f"the wheel lacks {missing}"


def test_the_suite_imports_the_installed_package_not_the_tree() -> None:
    # Regression: the suite ran against an editable install, which imports the tree, so a wheel
    # that could not start passed CI.
    assert Path(bow_gateway.__file__).is_relative_to(INSTALLED), (
        f"bow_gateway is imported from {bow_gateway.__file__}, not from {INSTALLED}: "
        "install the wheel as the README's test command does (tests/install-wheel.sh)"
    )


def test_a_python_the_tests_start_in_the_root_imports_the_installed_package() -> None:
    # `python -m bow_gateway` puts its working directory first on sys.path: from the repository's
    # root, that is the tree's bow_gateway/, unless PYTHONSAFEPATH (tests/conftest.py) is set.
    found = subprocess.run(
        [sys.executable, "-c", "import bow_gateway; print(bow_gateway.__file__)"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(found).is_relative_to(INSTALLED), found
