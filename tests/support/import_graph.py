"""The tree's modules by the dotted names setup.cfg installs them under (the bundled plugins
under ``bow_gateway``), for the tests that read their imports."""

from __future__ import annotations

from pathlib import Path

from . import ROOT

PACKAGES = {  # as setup.cfg installs them
    "bow_gateway": ROOT / "bow_gateway",
    "bow_gateway.inbounds": ROOT / "inbounds",
    "bow_gateway.outbounds": ROOT / "outbounds",
    "bow_gateway.middlewares": ROOT / "middlewares",
}


def modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found
