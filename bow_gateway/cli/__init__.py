"""``bow-gateway``: serve a gateway, and try one out (mint a token, listen, push).

``main`` is here, the parser (every command's help and options) in ``parser``; the commands are
in ``serve``, ``clients`` (token), ``push`` and ``listen``, what they share in ``common``;
``criteria-job`` is ``bow_gateway.job.command``."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Final

from .common import (
    DEFAULT_URL,
    EXAMPLE_AUDIENCE,
    EXAMPLE_CRITERIA,
    EXAMPLE_ID,
    EXAMPLE_PAYLOAD,
    MISSING_PART,
    PASSWORD_ENV,
    StdoutClosed,
    UsageError,
)
from .parser import build_parser as _parser

__all__ = [
    "DEFAULT_URL",
    "EXAMPLE_AUDIENCE",
    "EXAMPLE_CRITERIA",
    "EXAMPLE_ID",
    "EXAMPLE_PAYLOAD",
    "OPTIONAL_PARTS",
    "PASSWORD_ENV",
    "UsageError",
    "main",
]


OPTIONAL_PARTS: Final = {
    "pyspark": "spark",
    "py4j": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "asyncpg": "postgres",
}
"""Packages of the extras, and the extra that installs each."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``bow-gateway`` command line; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or argparse's own usage error
        return exit_.code if isinstance(exit_.code, int) else 0
    command: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return command(args)
    except UsageError as error:
        print(f"bow-gateway {args.command}: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        extra = OPTIONAL_PARTS.get(package)
        if extra is None:
            raise
        print(
            f"bow-gateway {args.command}: {package} is not installed: "
            f"pip install {_requirements(extra)} (the {extra} extra of bow-gateway)",
            file=sys.stderr,
        )
        return MISSING_PART
    except (StdoutClosed, BrokenPipeError):
        # Nobody reads stdout any more (`| head -1`): exit as Python's docs advise, without the
        # traceback, stdout pointed at /dev/null so that the interpreter's last flush succeeds.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


def _requirements(extra: str) -> str:
    """The extra's requirements, quoted for a shell, as installed (``'pyspark[sql]>=4.0'
    'pandas<3,>=2.2'``): they install from a clone as from a wheel, bow-gateway not on PyPI."""
    try:
        found = importlib.metadata.requires("bow-gateway") or []
    except importlib.metadata.PackageNotFoundError:
        found = []
    marker = f'extra == "{extra}"'
    wanted = [r.partition(";")[0].strip() for r in found if r.partition(";")[2].strip() == marker]
    return " ".join(map(shlex.quote, wanted)) or shlex.quote(f"bow-gateway[{extra}]")
