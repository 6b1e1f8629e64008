"""The criteria index: an inverted index from (criterion key, value) to listeners, as Bow keeps.

Resolving an audience costs in proportion to the smallest posting list of each query and to the
sockets it matches, never a scan of every listener. ``__id`` gets no posting lists of its own (one
set per listener would double the index's memory): the listener table already answers it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

from .criteria import ID_KEY, Criteria, ListenerId, Scalar, criteria_entries, typed_key

S = TypeVar("S", bound=Hashable)

Query = Mapping[str, Scalar]
Entry = tuple[str, Hashable]
IndexKey = ListenerId | tuple[str, str]
"""A listener id, or ``("anonymous", sid)`` for an anonymous socket (no ``__id`` matches it)."""


class _Listener(Generic[S]):
    __slots__ = ("criteria", "entries", "sockets")

    def __init__(self, criteria: Criteria, entries: frozenset[Entry]) -> None:
        self.criteria = criteria
        self.entries = entries
        self.sockets: set[S] = set()


class CriteriaIndex(Generic[S]):
    """The sockets of one middleware version, indexed by their listener's criteria.

    Criteria belong to the listener id: every socket of an id shares them, and a new set of
    criteria for the id replaces the old one for all its sockets. Posting lists hold sockets,
    not listener ids, so that a resolved audience needs no second lookup per listener.
    """

    def __init__(self) -> None:
        self._listeners: dict[IndexKey, _Listener[S]] = {}
        self._postings: dict[Entry, set[S]] = {}

    def __len__(self) -> int:
        """The number of listeners (ids) held."""
        return len(self._listeners)

    def socket_count(self) -> int:
        return sum(len(listener.sockets) for listener in self._listeners.values())

    def criteria_of(self, listener_id: IndexKey) -> Criteria | None:
        listener = self._listeners.get(listener_id)
        return None if listener is None else listener.criteria

    def entries_of(self, listener_id: IndexKey) -> frozenset[Entry] | None:
        listener = self._listeners.get(listener_id)
        return None if listener is None else listener.entries

    def listener_ids(self) -> list[IndexKey]:
        return list(self._listeners)

    def sockets_of(self, listener_id: IndexKey) -> set[S]:
        listener = self._listeners.get(listener_id)
        return set() if listener is None else listener.sockets

    def add(self, socket: S, listener_id: IndexKey, criteria: Criteria) -> None:
        """Hold ``socket`` for ``listener_id``, whose criteria become ``criteria``."""
        listener = self._listeners.get(listener_id)
        if listener is None:
            listener = self._listeners[listener_id] = _Listener(criteria, _entries(criteria))
        else:
            self.update(listener_id, criteria)
        if socket not in listener.sockets:
            listener.sockets.add(socket)
            self._post(socket, listener.entries)

    def remove(self, socket: S, listener_id: IndexKey) -> None:
        """Forget ``socket``; the listener goes with its last socket."""
        listener = self._listeners.get(listener_id)
        if listener is None or socket not in listener.sockets:
            return
        listener.sockets.discard(socket)
        self._unpost(socket, listener.entries)
        if not listener.sockets:
            del self._listeners[listener_id]

    def update(self, listener_id: IndexKey, criteria: Criteria) -> bool:
        """Give a held listener new criteria; True if they differ (strictly) from the old ones."""
        listener = self._listeners.get(listener_id)
        if listener is None:
            return False
        entries = _entries(criteria)
        listener.criteria = criteria
        if listener.entries == entries:
            return False
        gone, new = listener.entries - entries, entries - listener.entries
        for socket in listener.sockets:
            self._unpost(socket, gone)
            self._post(socket, new)
        listener.entries = entries
        return True

    def resolve(self, audience: Iterable[Query]) -> set[S]:
        """Every socket whose criteria match at least one query of ``audience``."""
        matched: set[S] = set()
        for query in audience:
            if ID_KEY in query:
                listener_id = query[ID_KEY]
                listener = (
                    None if isinstance(listener_id, bool) else self._listeners.get(listener_id)
                )
                if listener is not None and all(
                    (key, typed_key(value)) in listener.entries
                    for key, value in query.items()
                    if key != ID_KEY
                ):
                    matched |= listener.sockets
                continue
            postings = []
            for key, value in query.items():
                posting = self._postings.get((key, typed_key(value)))
                if posting is None:
                    break
                postings.append(posting)
            else:
                if len(postings) == 1:
                    matched |= postings[0]
                elif postings:
                    postings.sort(key=len)
                    matched |= postings[0].intersection(*postings[1:])
        return matched

    def _post(self, socket: S, entries: Iterable[Entry]) -> None:
        postings = self._postings
        for entry in entries:
            posting = postings.get(entry)
            if posting is None:
                postings[entry] = {socket}
            else:
                posting.add(socket)

    def _unpost(self, socket: S, entries: Iterable[Entry]) -> None:
        postings = self._postings
        for entry in entries:
            posting = postings[entry]
            posting.discard(socket)
            if not posting:
                del postings[entry]


def _entries(criteria: Criteria) -> frozenset[Entry]:
    return criteria_entries({k: v for k, v in criteria.items() if k != ID_KEY})


entries_of = _entries


def matches(entries: frozenset[Entry], listener_id: object, audience: Iterable[Query]) -> bool:
    """Whether a listener with these entries (and this id; ``None``: anonymous) matches at least
    one query of ``audience``: what :meth:`CriteriaIndex.resolve` decides, for one listener."""
    for query in audience:
        for key, value in query.items():
            if key == ID_KEY:
                if listener_id is None or isinstance(value, bool) or value != listener_id:
                    break
            elif (key, typed_key(value)) not in entries:
                break
        else:
            return True
    return False
