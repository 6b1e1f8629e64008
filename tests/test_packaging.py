"""The dependency floors in setup.cfg are the versions tests/lowest-versions.sh tests."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
