"""The gateway's probes, supervised beside the consumer: the event loop's lag, and a periodic
log line of who is connected."""

from __future__ import annotations

import asyncio
import logging

from ..outbound import SocketOutbound
from ..runtime.metrics import Metrics

logger = logging.getLogger("bow_gateway")


async def probe_loop_lag(metrics: Metrics, interval: float = 0.25, warn_above: float = 1.0) -> None:
    """Measure how late the loop runs a timer; a stall over ``warn_above`` s is logged."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        lag = max(0.0, loop.time() - due)
        metrics.loop_lag_seconds.observe(lag)
        if lag > warn_above:
            logger.warning("the event loop stalled for %.2f s", lag)


async def log_listeners(outbound: SocketOutbound, interval: float) -> None:
    """Every ``interval`` s, how many listeners and sockets are connected."""
    while True:
        await asyncio.sleep(interval)
        logger.info(
            "%d listeners connected (%d sockets)",
            outbound.listener_count(),
            len(outbound.connections),
        )
