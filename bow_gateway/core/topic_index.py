"""The index of who holds which topic filters (:mod:`.topics`), and one connection's filters
matched without it.

Every outbound keeps a :class:`TopicIndex` of its connections' filters. A Socket.IO or SSE
connection with no filter receives every name, and costs nothing here; a Flywheel connection is
*strict* (:meth:`TopicIndex.hold_strictly`): it receives only what it subscribed to.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from typing import Generic, TypeVar

from .topics import ALL_LEVELS, ONE_LEVEL, SEPARATOR, is_system_name

S = TypeVar("S", bound=Hashable)


class _Node(Generic[S]):
    """A node of the trie: the level that leads to it (its key in its parent's ``children``),
    then ``tail``, the levels of a chain without branches compressed into it (a filter's own
    levels past the last it shares with another: one node per filter, not one per level); what
    follows it, and who holds a filter ending here (None: nothing, no empty container kept)."""

    __slots__ = ("children", "holders", "tail")

    def __init__(self, tail: tuple[str, ...] = ()) -> None:
        self.tail = tail
        self.children: dict[str, _Node[S]] | None = None
        self.holders: set[S] | None = None


class TopicIndex(Generic[S]):
    """The filters held by connections (or anything hashable), as a compressed trie over levels.

    Each distinct filter is held once, whoever holds it: its holders share its node (a set), and
    each *owner* (a listener id, say: :meth:`add`'s ``owner``) counts the distinct filters its
    holders hold (:meth:`owned`), so that a limit per owner counts filters, not sockets.

    :meth:`match` costs in proportion to the levels of the name, the nodes of the filters that
    match its first levels, and the holders it returns: never to the number of holders of
    filters that do not match. :meth:`narrow` drops, from a resolved audience, the holders whose
    filters do not match a name; holders without filters always stay, unless held strictly.
    """

    def __init__(self) -> None:
        self._root: _Node[S] = _Node()
        self._root.children = {}
        self.holders: dict[S, set[str]] = {}
        """Each holder with at least one filter (or held strictly), to its filters (read only:
        delivery skips :meth:`narrow` while it is empty)."""
        self.visited = 0
        """Levels the last :meth:`match` or :meth:`narrow` walked (the cost tests read it)."""
        self.subscriptions = 0
        """Filters held, each counted once per holder (a holder's filter is one subscription)."""
        self._strict: set[S] = set()
        self._owners: dict[S, Hashable] = {}  # each holder with a filter: the owner it counts for
        self._owned: dict[Hashable, dict[str, int]] = {}  # owner: its filters, how many hold each

    def hold_strictly(self, holder: S) -> None:
        """Let ``holder`` receive only names its filters match, none while it holds none."""
        self._strict.add(holder)
        self.holders.setdefault(holder, set())

    def __len__(self) -> int:
        """The number of holders with at least one filter, or held strictly."""
        return len(self.holders)

    def __contains__(self, holder: object) -> bool:
        return holder in self.holders

    def filters_of(self, holder: S) -> frozenset[str]:
        return frozenset(self.holders.get(holder, ()))

    def held(self, holder: S) -> int:
        """How many filters ``holder`` holds."""
        return len(self.holders.get(holder, ()))

    def holds(self, holder: S, text: str) -> bool:
        return text in self.holders.get(holder, ())

    def owned(self, owner: Hashable) -> int:
        """How many distinct filters the holders counted for ``owner`` hold."""
        return len(self._owned.get(owner, ()))

    def owns(self, owner: Hashable, text: str) -> bool:
        """Whether a holder counted for ``owner`` holds ``text``."""
        return text in self._owned.get(owner, ())

    def add(
        self,
        holder: S,
        text: str,
        levels: Iterable[str] | None = None,
        *,
        owner: Hashable = None,
    ) -> bool:
        """Hold filter ``text`` (checked by :func:`~.topics.parse_filter`, or its ``levels``),
        counted for ``owner`` (a holder counted for another owner moves to this one, its filters
        with it); True if new."""
        self.rehome(holder, owner)
        filters = self.holders.get(holder)
        if filters is not None and text in filters:
            return False
        node = self._insert(tuple(text.split(SEPARATOR) if levels is None else levels))
        if node.holders is None:
            node.holders = {holder}
        else:
            node.holders.add(holder)
        if filters is None:
            self.holders[holder] = {text}
        else:
            filters.add(text)
        self._owners[holder] = owner
        counts = self._owned.get(owner)
        if counts is None:
            counts = self._owned[owner] = {}
        counts[text] = counts.get(text, 0) + 1
        self.subscriptions += 1
        return True

    def rehome(self, holder: S, owner: Hashable) -> None:
        """Count ``holder``'s filters for ``owner`` from now on (its listener id changed)."""
        before = self._owners.get(holder, owner)
        if before == owner:
            return
        filters = self.holders.get(holder, ())
        for text in filters:
            self._disown(before, text)
        counts = self._owned.setdefault(owner, {})
        for text in filters:
            counts[text] = counts.get(text, 0) + 1
        self._owners[holder] = owner

    def _disown(self, owner: Hashable, text: str) -> None:
        counts = self._owned[owner]
        left = counts[text] - 1
        if left:
            counts[text] = left
        else:
            del counts[text]
            if not counts:
                del self._owned[owner]

    def _insert(self, levels: tuple[str, ...]) -> _Node[S]:
        """The node of ``levels``, made (and a chain split) if need be."""
        node = self._root
        position, count = 0, len(levels)
        while position < count:
            key = levels[position]
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(key)
            position += 1
            if child is None:
                child = children[key] = _Node(levels[position:])
                return child
            tail = child.tail
            shared = 0
            while (
                shared < len(tail)
                and position + shared < count
                and tail[shared] == levels[position + shared]
            ):
                shared += 1
            if shared < len(tail):  # the chain forks (or ends) inside: split it there
                middle: _Node[S] = _Node(tail[:shared])
                middle.children = {tail[shared]: child}
                child.tail = tail[shared + 1 :]
                children[key] = child = middle
            position += shared
            node = child
        return node

    def remove(self, holder: S, text: str) -> bool:
        """Stop holding exactly ``text`` (no subset or superset); True if it was held."""
        filters = self.holders.get(holder)
        if filters is None or text not in filters:
            return False
        filters.discard(text)
        if not filters and holder not in self._strict:
            del self.holders[holder]
        self._disown(self._owners[holder], text)
        if not filters:
            del self._owners[holder]
        self.subscriptions -= 1
        levels = text.split(SEPARATOR)
        path: list[tuple[_Node[S], str]] = []  # each node walked, and the key of the next
        node = self._root
        position = 0
        while position < len(levels):
            key = levels[position]
            path.append((node, key))
            assert node.children is not None
            node = node.children[key]
            position += 1 + len(node.tail)
        assert node.holders is not None
        node.holders.discard(holder)
        if not node.holders:
            node.holders = None
        for parent, key in reversed(path):  # prune the nodes nobody needs any more
            if node.holders or node.children:
                break
            assert parent.children is not None
            del parent.children[key]
            if not parent.children and parent is not self._root:
                parent.children = None
            node = parent
        if (
            node is not self._root
            and not node.holders
            and node.children
            and len(node.children) == 1
        ):
            [(key, only)] = node.children.items()  # a chain again: one node
            node.tail = (*node.tail, key, *only.tail)
            node.children, node.holders = only.children, only.holders
        return True

    def discard(self, holder: S) -> None:
        """Forget every filter of ``holder`` (it disconnected)."""
        self._strict.discard(holder)
        for text in list(self.holders.get(holder, ())):
            self.remove(holder, text)
        self.holders.pop(holder, None)
        self._owners.pop(holder, None)

    def match(self, name: str) -> set[S]:
        """Every holder of a filter matching ``name``."""
        matched: set[S] = set()
        for holders in self._matching(name):
            matched |= holders
        return matched

    def narrow(self, resolved: set[S], name: str) -> set[S]:
        """``resolved`` (changed in place) without the holders none of whose filters match
        ``name``. Call it only when :attr:`holders` is not empty: without filters, no cost.

        It costs, in C, the smaller of ``resolved`` and :attr:`holders`, then for each filter
        matching ``name`` the smaller of its holders and the filtered ones in ``resolved``.
        """
        held = self.holders.keys() & resolved  # iterates the smaller of the two
        if held:
            wanted: set[S] = set()
            for holders in self._matching(name):
                wanted |= held & holders  # iterates the smaller of the two
            if len(wanted) < len(held):
                resolved -= held - wanted
        return resolved

    def _matching(self, name: str) -> list[set[S]]:
        """The holders of each filter matching ``name`` (sets of the index: not to be changed).

        A walk of the trie along the name's levels: a node is visited only when the filter
        levels leading to it match the name's first levels."""
        parts = name.split(SEPARATOR)
        found: list[set[S]] = []
        visited = 0
        last = len(parts)
        # (node, depth): the levels leading to ``node``'s tail matched the first ``depth``
        pending: list[tuple[_Node[S], int]] = [(self._root, 0)]
        system = is_system_name(name)
        while pending:
            node, depth = pending.pop()
            visited += 1
            tail = node.tail
            if tail:  # a chain: each level a name's level, '+', or a last '#'
                for level in tail:
                    if level == ALL_LEVELS:
                        depth = -1
                        break
                    if depth == last or (level != ONE_LEVEL and level != parts[depth]):
                        depth = -2
                        break
                    depth += 1
                    visited += 1
                if depth < 0:
                    if depth == -1:  # '#' matches what is left, the parent level included
                        visited += 1
                        if node.holders:
                            found.append(node.holders)
                    continue
            children = node.children
            if children is None:
                if depth == last and node.holders:
                    found.append(node.holders)
                continue
            wild = not (system and depth == 0)  # $-names: no wildcard at the first level
            if wild:
                rest = children.get(ALL_LEVELS)
                if rest is not None:  # '#' matches what is left, the parent level included
                    visited += 1
                    if rest.holders:
                        found.append(rest.holders)
            if depth == last:
                if node.holders:
                    found.append(node.holders)
                continue
            child = children.get(parts[depth])
            if child is not None:
                pending.append((child, depth + 1))
            if wild:
                child = children.get(ONE_LEVEL)
                if child is not None:
                    pending.append((child, depth + 1))
        self.visited = visited
        return found


class FilterSet:
    """One connection's filters, matched without an index (a recovery's check per message),
    with each name's answer remembered: a window repeats its names."""

    __slots__ = ("_answers", "_index")

    def __init__(self, filters: Collection[str]) -> None:
        self._index: TopicIndex[int] = TopicIndex()
        for text in filters:
            self._index.add(0, text)
        self._answers: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return len(self._index) > 0

    def matches(self, name: str) -> bool:
        """Whether one of the filters matches ``name`` (always, without filters)."""
        if not self._index:
            return True
        answer = self._answers.get(name)
        if answer is None:
            answer = self._answers[name] = bool(self._index.match(name))
        return answer
