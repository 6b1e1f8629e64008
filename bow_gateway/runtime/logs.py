"""Logging for ``bow-gateway serve``: one JSON object per line, or readable lines on a terminal.

The library itself only logs through ``logging.getLogger("bow_gateway...")``; configuring the
output is the application's business, and this is what the CLI does. No line carries a token or
a password: the engine never logs them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_READABLE = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...}`` on one line, for log collectors."""

    def __init__(self, **static: Any) -> None:
        super().__init__()
        self._static = static

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **self._static,
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def configure_logging(
    level: int = logging.INFO, stream: TextIO | None = None, **static: Any
) -> None:
    """Log to ``stream`` (stderr): JSON lines unless it is a terminal; ``static`` fields on each.

    Python warnings (a library's, a plugin's) are logged too, under ``py.warnings``: otherwise
    they are written as plain text between the JSON lines.
    """
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    if stream.isatty():
        prefix = "".join(f"{key}={value} " for key, value in static.items())
        handler.setFormatter(logging.Formatter(prefix + _READABLE, datefmt="%H:%M:%S"))
    else:
        formatter = JsonFormatter(**static)
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
