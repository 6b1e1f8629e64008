"""The package list, found rather than written by hand; everything else is in setup.cfg.

The bundled plugins live in top-level folders of the repository (``inbounds/``, ``outbounds/``,
``middlewares/``) but are installed under the ``bow_gateway`` namespace, so that they never
shadow a user's own modules. setup.cfg's ``find:`` cannot rename a folder, hence this file.
"""

from setuptools import find_packages, setup

BUNDLED = ("inbounds", "outbounds", "middlewares")


def bundled(folder: str) -> list[str]:
    """A bundled folder and its subpackages, under their installed names."""
    return [f"bow_gateway.{folder}", *(f"bow_gateway.{folder}.{p}" for p in find_packages(folder))]


setup(
    packages=[
        *find_packages(include=["bow_gateway", "bow_gateway.*"]),
        *(package for folder in BUNDLED for package in bundled(folder)),
    ],
    package_dir={f"bow_gateway.{folder}": folder for folder in BUNDLED},
)
