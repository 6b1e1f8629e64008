"""The whole base (contract section 20): ``POST {api.prefix}/reach``, how many listeners of the
audience index match an audience and how many of them are connected now, and a receipt's
``missed`` over every matching listener, not only those its ``__id`` queries name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from redis.exceptions import RedisError

from ..backplanes import BackplaneUnavailable
from ..core.index import Query
from ..runtime.audience_index import AudienceIndex
from ..runtime.whole_base import fill_missed

Count = Callable[[list[Query]], Awaitable[dict[str, Any]]]
"""``/count`` over every instance: ``{"sockets", "listeners", "complete"}``."""

NO_INDEX = (
    "404: no audience index: the criteria job writes one (docs/criteria-job.md) in the "
    "gateway's Redis namespace"
)


class WholeBase:
    """What the audience index answers for the control API (``index`` None: none here)."""

    def __init__(self, index: AudienceIndex | None, count: Count, *, max_ids: int = 10_000) -> None:
        self.index = index
        self._count = count
        self._max_ids = max_ids

    async def reach(self, audience: list[Query]) -> dict[str, Any] | None:
        """``{"listeners", "online", "generation", "complete"}``; None without an index."""
        if self.index is None:
            return None
        counting = asyncio.ensure_future(self._count(audience))  # meanwhile, the index
        try:
            found = await self.index.matching(audience)
        except (RedisError, OSError) as error:
            _drop(counting)
            raise BackplaneUnavailable(f"the audience index cannot be read: {error}") from error
        except BaseException:
            _drop(counting)
            raise
        if found is None:
            _drop(counting)
            return None
        counted = await counting
        return {
            "listeners": len(found),
            "online": counted["listeners"],
            "generation": found.generation,
            "complete": counted["complete"],
        }

    async def fill_missed(self, receipt: dict[str, Any], reports: Mapping[str, bytes]) -> None:
        """``receipt``'s ``missed`` over the whole base, when the index has it."""
        if self.index is None:
            return
        try:
            await fill_missed(self.index, receipt, reports, self._max_ids)
        except (RedisError, OSError) as error:
            raise BackplaneUnavailable(f"the audience index cannot be read: {error}") from error


def _drop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task``, its outcome taken whatever it is (no "exception never retrieved")."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
