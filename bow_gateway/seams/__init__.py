"""aiohttp, python-socketio, python-engineio, prometheus-client (and PySpark), reached into where
they offer no public seam.

Everything the gateway does with their private methods and attributes lives in this package:

- :mod:`.transport`: engineio's ``AsyncSocket`` subclassed (:class:`LeanSocket`: the websocket
  transport without a task per packet, a guarded ``receive``, bounded polls);
- :mod:`.websocket`: engineio's aiohttp websocket driver replaced (the server's
  ``_async["websocket"]``): the gateway answers the upgrade and takes the connection from
  aiohttp's ``RequestHandler``, reading its frames itself (:mod:`bow_gateway.wire.frames`);
- :mod:`.server`: python-socketio's ``AsyncServer`` (``_handle_event``, ``_handle_eio_connect``,
  ``_handle_eio_disconnect``, ``_handle_eio_message``, ``_send_packet``) and ``AsyncManager``
  (``basic_disconnect``, ``pending_connect``) subclassed;
- :mod:`.prometheus`: a histogram's buckets added to once per event-loop step (checked when
  built: prometheus-client's pins are a range, setup.cfg's);
- ``spark_daemon/bow_spark_daemon.py``: PySpark's daemon (its private ``pyspark.daemon.manager``)
  for the criteria job's local runs, with the workers' imports done once before it forks. Not a
  module of this package: the job puts its folder on the Python workers' path.

They are written for the minor versions in :data:`WRITTEN_FOR`, which setup.cfg pins too; the
README's test command runs the suite at both ends of the pins. Importing this package checks the
installed versions, so that another version fails at once with a message, not later with an
``AttributeError`` on a disconnect.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version as installed_version
from typing import Final

WRITTEN_FOR: Final = {"aiohttp": "3.14", "python-socketio": "5.18", "python-engineio": "4.15"}
"""The minor version of each library these seams are written and tested for."""


def check_versions(version: Callable[[str], str] = installed_version) -> None:
    """Raise ``ImportError`` naming the library, its version and the one to install when an
    installed library is not of the minor version the seams are written for."""
    for library, minor in WRITTEN_FOR.items():
        found = version(library)
        if found != minor and not found.startswith(minor + "."):
            raise ImportError(
                f"bow_gateway reaches into private parts of {library}, written for {minor}.x, "
                f"but {found} is installed: pip install '{library}=={minor}.*'"
            )


check_versions()

from .guard import ProtocolViolation  # noqa: E402
from .server import Server, ServerHooks, socketio_server  # noqa: E402
from .transport import LeanSocket  # noqa: E402

__all__ = [
    "WRITTEN_FOR",
    "LeanSocket",
    "ProtocolViolation",
    "Server",
    "ServerHooks",
    "check_versions",
    "socketio_server",
]
