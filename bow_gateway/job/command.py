"""The criteria job's command line: ``bow-gateway criteria-job``, ``python -m
bow_gateway.criteria_job`` and ``spark-submit`` of that file."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Final

from .config import ConfigError, load_job_config

CONFIG_ENV: Final = "BOW_CRITERIA_JOB_CONFIG"


class Progress:
    """Timestamped progress lines on stderr (or nowhere)."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.stream is not None:
            elapsed = time.monotonic() - self.started
            print(f"[{elapsed:7.1f} s] {message}", file=self.stream, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``criteria-job`` (shared by ``bow-gateway`` and ``python -m``)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(CONFIG_ENV) or None,
        help=f"the job's TOML file (default: ${CONFIG_ENV})",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="the Spark master (default: the file's spark.master, else local[*])",
    )
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="write only the listeners whose criteria changed since the last run",
    )


def run_command(
    args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None
) -> int:
    """Run the job as the command line asked; the exit status (0 done, 1 failed, 2 bad config)."""
    from .run import CriteriaJobError, run_job  # here: bow-gateway's parser imports this module
    from .spark import build_session

    out, err = out or sys.stdout, err or sys.stderr
    if not args.config:
        print(f"criteria-job: --config FILE is required (or ${CONFIG_ENV})", file=err)
        return 2
    try:
        config = load_job_config(args.config)
    except ConfigError as error:
        print(f"criteria-job: {args.config}: {error}", file=err)
        return 2
    progress = Progress(err)
    try:
        progress("starting Spark")
        spark = build_session(config, args.master)
        summary = run_job(config, spark, incremental=args.incremental, progress=progress)
    except CriteriaJobError as error:
        print(f"criteria-job: failed: {error}", file=err)
        return 1
    print(summary.text(), file=out)
    elapsed = time.monotonic() - progress.started
    print(f"  with Spark's start {elapsed:>12.1f} s", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bow_gateway.criteria_job`` and ``spark-submit`` (of that file)."""
    parser = argparse.ArgumentParser(
        prog="criteria-job",
        description="Precompute every listener's criteria with Spark into Redis.",
    )
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
