"""A throwaway prototype for comparison only (``index_bench.py --compare``), not engine code.

Same matching rules as ``bow_gateway.index.CriteriaIndex`` (typed keys, lists, ``__id`` answered by
the listener table), but each posting list holds the *sockets* of the listeners that have the
entry instead of their ids. Resolving a query is then set operations on posting lists alone; the
engine's index instead looks every matched id up in the listener table and reads its socket set,
one or more cache misses per listener. Only ``add`` and ``resolve`` are written: enough to time.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from bow_gateway.criteria import ID_KEY, criteria_entries, typed_key


class SocketPostingIndex:
    def __init__(self) -> None:
        self._listeners: dict[Any, tuple[frozenset[tuple[str, Hashable]], set[Any]]] = {}
        self._postings: dict[tuple[str, Hashable], set[Any]] = {}

    def add(self, socket: Any, listener_id: Any, criteria: Mapping[str, Any]) -> None:
        listener = self._listeners.get(listener_id)
        if listener is None:
            entries = criteria_entries({k: v for k, v in criteria.items() if k != ID_KEY})
            listener = self._listeners[listener_id] = (entries, set())
        listener[1].add(socket)
        postings = self._postings
        for entry in listener[0]:
            posting = postings.get(entry)
            if posting is None:
                postings[entry] = {socket}
            else:
                posting.add(socket)

    def resolve(self, audience: Iterable[Mapping[str, Any]]) -> set[Any]:
        sockets: set[Any] = set()
        for query in audience:
            if ID_KEY in query:
                listener = self._listeners.get(query[ID_KEY])
                if listener is not None and all(
                    (key, typed_key(value)) in listener[0]
                    for key, value in query.items()
                    if key != ID_KEY
                ):
                    sockets |= listener[1]
                continue
            postings = []
            for key, value in query.items():
                posting = self._postings.get((key, typed_key(value)))
                if posting is None:
                    break
                postings.append(posting)
            else:
                if len(postings) == 1:
                    sockets |= postings[0]
                elif postings:
                    postings.sort(key=len)
                    sockets |= postings[0].intersection(*postings[1:])
        return sockets
