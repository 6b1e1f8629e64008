"""What the gateway knows of each listener's recent criteria changes and kicks, by position.

``criteria_changed`` compares a recovering socket's criteria with those it had at ``since``; and
an authentication that ran while a control change (``POST /_bow/criteria``, ``/disconnect``) was
applied must not undo it, here or, through a stale ``CriteriaEvent``, on another instance.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

Parse = Callable[[str], "tuple[str, tuple[int, ...]] | None"]
Key = tuple[str, tuple[int, ...]]  # (epoch, position key)


class Changes:
    """Per listener, its last few criteria (as a digest) and its last control change, bounded
    to the ``max_listeners`` listeners changed most recently."""

    def __init__(self, parse: Parse, *, max_listeners: int = 100_000) -> None:
        self._parse = parse
        self._max_listeners = max_listeners
        self._criteria: OrderedDict[tuple[str, Hashable], list[tuple[Key, int]]] = OrderedDict()
        self._controls: OrderedDict[Hashable, tuple[Key, str, Any]] = OrderedDict()

    def note_criteria(
        self, position: str, version: str, listener_id: Hashable, entries: Hashable
    ) -> None:
        """The listener had ``entries`` as criteria (of ``version``) from ``position`` on."""
        parsed = self._parse(position)
        if parsed is None:
            return
        key = (version, listener_id)
        changes = self._criteria.pop(key, [])
        changes.append((parsed, hash(entries)))
        self._criteria[key] = changes[-4:]
        if len(self._criteria) > self._max_listeners:
            self._criteria.popitem(last=False)

    def changed_since(
        self, since: str, version: str, listener_id: Hashable, entries: Hashable
    ) -> bool:
        """Whether ``entries`` differ from the criteria the listener had at ``since``; True when
        that is not known (the client reloads rather than miss a scope it gained)."""
        parsed = self._parse(since)
        changes = self._criteria.get((version, listener_id))
        if parsed is None or not changes:
            return True
        same_epoch = [(key, digest) for key, digest in changes if key[0] == parsed[0]]
        before = [digest for key, digest in same_epoch if key[1] <= parsed[1]]
        if before:
            return before[-1] != hash(entries)
        if same_epoch:  # the socket's own authentication, just after since
            return same_epoch[0][1] != hash(entries)
        return True

    def note_control(self, position: str, listener_id: Hashable, kind: str, data: Any) -> None:
        """A control change of ``kind`` (``"criteria"``, ``"kick"``) for the listener."""
        parsed = self._parse(position)
        if parsed is None:
            return
        self._controls.pop(listener_id, None)
        self._controls[listener_id] = (parsed, kind, data)
        if len(self._controls) > self._max_listeners:
            self._controls.popitem(last=False)

    def control_after(self, basis: str | None, listener_id: Hashable) -> tuple[str, Any] | None:
        """The listener's last control change after ``basis`` (None: any), as ``(kind, data)``."""
        control = self._controls.get(listener_id)
        if control is None:
            return None
        key, kind, data = control
        parsed = None if basis is None else self._parse(basis)
        if parsed is None or parsed[0] != key[0] or parsed[1] < key[1]:
            return kind, data
        return None
