"""Receipts (contract section 17): what one instance reports on a message that asked for one,
and a receipt, the reports of every instance that read it merged.

Each instance reports what it did with the message (:mod:`bow_gateway.outbound.receipts`): the
sockets that matched, were delivered it, acknowledged it, and the ids behind them.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import orjson

from .criteria import ID_KEY, ListenerId, is_listener_id
from .index import Query
from .message import id_text


def named_ids(audience: Iterable[Query]) -> list[ListenerId]:
    """The ids the audience's ``__id`` queries name, in order, without repeats: those a
    receipt's ``missed`` may list."""
    named: dict[str, ListenerId] = {}
    for query in audience:
        listener_id = query.get(ID_KEY)
        if listener_id is not None and is_listener_id(listener_id):
            named.setdefault(id_text(listener_id), listener_id)
    return list(named.values())


def merged_receipt(
    message_id: str,
    reports: Mapping[str, bytes],
    live: Collection[str],
    *,
    max_ids: int = 10_000,
    now: float | None = None,
) -> dict[str, Any] | None:
    """The receipt of ``message_id`` from its instances' ``reports`` (by instance id), ``live``
    the instances alive now; None when no instance reported it (unknown, or expired)."""
    documents = [orjson.loads(data) for data in reports.values()]
    if not documents:
        return None
    first = documents[0]
    now = time.time() if now is None else now
    final = now >= first["a"] + first["s"]
    counts = {"matched": 0, "delivered": 0, "acked": 0}
    delivered: dict[str, ListenerId] | None = {}
    acked: dict[str, ListenerId] | None = {}
    for document in documents:
        counts["matched"] += document["m"]
        counts["delivered"] += document["d"]
        counts["acked"] += document["k"]
        delivered = _union(delivered, document["di"], max_ids)
        acked = _union(acked, document["ki"], max_ids)
    named = first["n"]
    missed: list[ListenerId] | None = None
    if named is not None and delivered is not None:
        missed = [i for i in named if id_text(i) not in delivered][: max_ids + 1]
    late = [instance for instance, d in zip(reports, documents, strict=True) if not d["f"]]
    receipt: dict[str, Any] = {
        "id": message_id,
        "position": first["p"],
        "state": "final" if final else "open",
        **counts,
        "listeners": {
            "delivered": _listed(delivered, max_ids),
            "acked": _listed(acked, max_ids),
            "missed": None if missed is None or len(missed) > max_ids else missed,
        },
        "complete": final and not late,
    }
    dead = sum(1 for instance in late if instance not in live)
    if final and dead:
        receipt["missing_instances"] = dead
    return receipt


def _union(
    ids: dict[str, ListenerId] | None, more: list[ListenerId] | None, max_ids: int
) -> dict[str, ListenerId] | None:
    if ids is None or more is None:
        return None
    for listener_id in more:
        ids.setdefault(id_text(listener_id), listener_id)
    return None if len(ids) > max_ids else ids


def _listed(ids: dict[str, ListenerId] | None, max_ids: int) -> list[ListenerId] | None:
    """The ids in the order of their JSON text (as presence orders them); None past the bound."""
    if ids is None or len(ids) > max_ids:
        return None
    return [ids[text] for text in sorted(ids)]


def unreached(
    reports: Mapping[str, bytes], matching: Iterable[ListenerId] | None = None
) -> list[ListenerId]:
    """The ids that no instance reached (none of their sockets acknowledged the message, on
    protocol 2, or was delivered it, on the others) among ``matching`` (the audience index's
    listeners of the audience, section 20), or without it those the audience's ``__id``
    queries name: those a ``message.undelivered`` webhook lists (section 19)."""
    documents = [orjson.loads(data) for data in reports.values()]
    if not documents:
        return []
    if matching is None:
        matching = documents[0]["n"]
        if matching is None:
            return []
    reached = reached_texts(reports, documents)
    return [i for i in matching if id_text(i) not in reached]


def reached_texts(
    reports: Mapping[str, bytes], documents: list[dict[str, Any]] | None = None
) -> set[str]:
    """The JSON texts of the ids any instance reached (acknowledged, or delivered where none
    acknowledges)."""
    if documents is None:
        documents = [orjson.loads(data) for data in reports.values()]
    return {id_text(listener_id) for d in documents for listener_id in d["oi"] or ()}


def reported_audience(reports: Mapping[str, bytes]) -> list[Query] | None:
    """The audience the reports carry (with the audience index), else None."""
    for data in reports.values():
        audience: list[Query] | None = orjson.loads(data).get("au")
        return audience
    return None
