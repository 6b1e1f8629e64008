"""Background tasks under supervision: one that dies is logged with its traceback and restarted
with capped exponential backoff, so that a bug or a fault never silently stops delivery."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger("bow_gateway.supervisor")

Job = Callable[[], Coroutine[Any, Any, None]]


class Supervisor:
    """Runs named jobs until they return; restarts one that raises, ``first_delay`` s later,
    doubling up to ``max_delay`` s (the count starts again once it ran ``max_delay`` s)."""

    def __init__(
        self,
        *,
        first_delay: float = 0.1,
        max_delay: float = 10.0,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self._first_delay = first_delay
        self._max_delay = max_delay
        self._on_restart = on_restart
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._down: set[str] = set()

    def start(self, name: str, job: Job) -> asyncio.Task[None]:
        """Run ``job()`` under supervision; the task returned ends when a run of it returns."""
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is already supervised")
        task = asyncio.get_running_loop().create_task(self._supervise(name, job), name=name)
        self._tasks[name] = task
        task.add_done_callback(lambda _: self._tasks.pop(name, None))
        return task

    def is_down(self, name: str) -> bool:
        """Whether ``name`` died and waits to be restarted."""
        return name in self._down

    def cancel(self, *, keep: tuple[str, ...] = ()) -> list[asyncio.Task[None]]:
        """Cancel every task but those named in ``keep``; returns them, to be awaited."""
        tasks = [task for name, task in self._tasks.items() if name not in keep]
        for task in tasks:
            task.cancel()
        return tasks

    async def _supervise(self, name: str, job: Job) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            try:
                await job()
                return
            except Exception:
                if loop.time() - started >= self._max_delay:
                    failures = 0  # it had been running well
                delay = min(self._max_delay, self._first_delay * 2**failures)
                failures += 1
                logger.exception("background task %s died; restarting it in %.1f s", name, delay)
                if self._on_restart is not None:
                    self._on_restart(name)
            self._down.add(name)
            try:
                await asyncio.sleep(delay)
            finally:
                self._down.discard(name)
