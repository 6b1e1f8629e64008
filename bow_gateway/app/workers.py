"""``serve --workers N``: N processes sharing one port, each an instance of one gateway via Redis.

The kernel spreads new connections over the processes (``SO_REUSEPORT``), so one connection
always stays with one process: WebSocket works, but Socket.IO's long-polling, whose requests of
one session may arrive on different connections and so different processes, cannot. Workers
therefore serve WebSocket only, and refuse a configuration that asks for polling.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from prometheus_client import multiprocess

from ..runtime.metrics import MULTIPROCESS_ENV
from .standalone import Settings

STOP_GRACE = 15.0  # seconds a worker has to stop after SIGTERM before it is killed


def worker_settings(settings: Settings) -> Settings:
    """The settings of one of several workers, or ``ValueError`` saying why there cannot be any."""
    config = dict(settings.config)
    if config.get("redis") is None:
        raise ValueError(
            "--workers needs redis: without it each worker would be a gateway of its own "
            "(set redis in the config file or BOW_REDIS_URL)"
        )
    if not config.get("port"):
        raise ValueError("--workers needs a fixed port, shared by every worker")
    outbound = dict(config.get("outbound") or {})
    if "polling" in (outbound.get("transports") or []):
        raise ValueError(
            "outbound.transports includes polling, which needs sticky sessions that workers "
            'sharing one port cannot give: use transports = ["websocket"], or run one worker '
            "per port behind a load balancer with sticky sessions"
        )
    outbound["transports"] = ["websocket"]
    config["outbound"] = outbound
    config["reuse_port"] = True
    return dataclasses.replace(settings, config=config)


def run_workers(count: int, target: Callable[..., Any], *args: Any) -> int:
    """Run ``target(number, *args)`` in ``count`` processes until they end or a signal stops them.

    SIGTERM and SIGINT are passed on to every worker; if one worker dies, the others are stopped
    too, so that a supervisor (systemd, Kubernetes) sees the failure and restarts the whole.
    """
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=(number, *args)) for number in range(count)]
    stopping = False
    # prometheus-client's multiprocess mode: every worker writes its figures to files there,
    # and whichever worker answers GET /metrics adds them all up.
    metrics_dir = os.environ.get(MULTIPROCESS_ENV)
    own_metrics_dir = metrics_dir is None
    if metrics_dir is None:
        metrics_dir = os.environ[MULTIPROCESS_ENV] = tempfile.mkdtemp(prefix="bow-metrics-")

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.is_alive():
                process.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for process in processes:
            process.start()
        alive: dict[Any, Any] = {process.sentinel: process for process in processes}
        status = 0
        while alive:
            for sentinel in wait(list(alive)):
                process = alive.pop(sentinel)
                process.join()
                multiprocess.mark_process_dead(process.pid, metrics_dir)  # type: ignore[no-untyped-call]
                if process.exitcode and not stopping:
                    status = status or process.exitcode
                    stop(signal.SIGTERM, None)
        return status
    finally:
        for process in processes:
            process.join(STOP_GRACE)
            if process.is_alive():
                process.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if own_metrics_dir:
            del os.environ[MULTIPROCESS_ENV]
            shutil.rmtree(metrics_dir, ignore_errors=True)
