"""The fence around python-socketio's and python-engineio's private parts (bow_gateway/seams/)."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from bow_gateway.seams import WRITTEN_FOR, check_versions


def test_the_installed_versions_are_those_the_seams_are_written_for() -> None:
    check_versions()


@pytest.mark.parametrize("other", ["5.16.3", "5.19.0", "6.0.0", "5.1.8"])
def test_another_socketio_version_fails_at_import_naming_what_to_install(other: str) -> None:
    # Regression: python-socketio 5.16.3, inside the old pin, raised AttributeError:
    # pending_connect on every disconnect.
    def versions(library: str) -> str:
        return other if library == "python-socketio" else version(library)

    with pytest.raises(ImportError) as refused:
        check_versions(versions)
    assert f"but {other} is installed" in str(refused.value)
    assert "pip install 'python-socketio==5.18.*'" in str(refused.value)


def test_the_pins_in_setup_cfg_admit_only_the_minors_the_seams_are_written_for() -> None:
    from .support import ROOT

    setup = (ROOT / "setup.cfg").read_text()
    for library, minor in WRITTEN_FOR.items():
        major, minor_number = minor.split(".")
        assert f"{library}>={minor}." in setup
        assert f"<{major}.{int(minor_number) + 1}\n" in setup
