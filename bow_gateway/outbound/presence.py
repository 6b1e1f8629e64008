"""This instance's answer to a presence request (contract section 18): the authenticated
listeners it holds whose criteria match an audience now, a page of them in the order of their
ids' JSON text, with exact counts; or which of some ids it holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..core.criteria import ListenerId
from ..core.index import CriteriaIndex
from ..core.message import PresenceEvent, dumps, id_text
from .connection import Connection


def presence_answer(indices: Mapping[str, CriteriaIndex[Connection]], ask: PresenceEvent) -> bytes:
    """``{"ids": [...], "more": bool, "sockets": n, "protocols": {...}}`` for an audience (the
    first ``limit`` ids after ``after``, in order, ``more`` when this instance has others after
    them; counts over all it holds), or ``{"online": [...]}`` for ids."""
    if ask.ids is not None:
        held = [
            listener_id
            for listener_id in ask.ids
            if any(index.sockets_of(listener_id) for index in indices.values())
        ]
        return dumps({"online": held})
    sockets = 0
    protocols: Counter[str] = Counter()
    ids: dict[str, ListenerId] = {}
    for index in indices.values():
        for connection in index.resolve(ask.audience or []):
            listener_id = connection.listener_id
            if listener_id is None:
                continue  # anonymous: no listener
            sockets += 1
            protocols[connection.codec.protocol] += 1
            ids[id_text(listener_id)] = listener_id
    after = ask.after
    page = sorted(key for key in ids if after is None or key > after)
    answer: dict[str, Any] = {
        "ids": [ids[key] for key in page[: ask.limit]],
        "more": len(page) > ask.limit,
        "sockets": sockets,
        "protocols": dict(protocols),
    }
    return dumps(answer)
