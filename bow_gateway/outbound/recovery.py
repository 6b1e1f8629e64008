"""Recovery (section 7): the protocol-2 ack's result, and the messages a socket missed."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..core.criteria import Criteria, ListenerId
from ..core.history import DISABLED, Kept, Recovery
from ..core.index import entries_of, matches
from ..core.message import Message
from ..core.topic_index import FilterSet
from .codec import Codec
from .connection import Connection
from .parts import Sockets


async def ack_result(
    outbound: Sockets,
    connection: Connection,
    listener_id: ListenerId | None,
    criteria: Criteria,
    options: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The protocol-2 ack's result (with the packets to replay under ``_replay``).

    Called once ``connection`` is indexed: the recovery ends at the newest position of then, and
    what is delivered to it while the recovery's slices take turns with the event loop waits
    behind the replay (in its backlog, bounded as any: ``_replay`` ends with it when the
    connection had none)."""
    if not connection.codec.coded:  # protocol 1: no result
        return None
    history = outbound.history
    expires_in = None if connection.exp is None else max(0.0, connection.exp - time.time())
    result: dict[str, Any] = {
        "id": listener_id,
        "position": history.last,
        "recovered": None,
        "reason": None,
        "criteria_changed": None,
        "expires_in": expires_in,
    }
    since = options.get("since")
    if since is None:
        return result
    entries = entries_of(criteria)
    meanwhile: list[bytes] = []
    if outbound.settings.recovery_enabled:
        # The socket's topic filters apply to a replay as to live delivery (section 11)
        filters = FilterSet(
            outbound.topics[connection.outbound.middleware_version].filters_of(connection)
        )

        def wanted(message: Message) -> bool:
            return matches(entries, listener_id, message.audience) and filters.matches(message.name)

        version = connection.outbound.middleware_version
        held = connection.backlog is None
        if held:  # from now on, what is delivered to it waits behind the replay
            outbound.writer.begin_replay(connection, [])
        try:
            recovery = await history.recover(since, version, wanted, outbound.settings.max_replay)
        finally:
            if held:
                meanwhile = list(connection.backlog or ())
                connection.backlog = None
                connection.backlog_bytes = connection.replaying = 0
    else:
        recovery = Recovery(False, DISABLED, history.last)
    outbound.metrics.recoveries.labels(
        "recovered" if recovery.recovered else "not_recovered", recovery.reason or "none"
    ).inc()
    version = connection.outbound.middleware_version
    changed = listener_id is not None and history.changes.changed_since(
        since, version, listener_id, entries
    )
    result.update(
        position=recovery.position,
        recovered=recovery.recovered,
        reason=recovery.reason,
        criteria_changed=changed,
    )
    replay = [_packet(kept, connection.codec) for kept in recovery.replay]
    if replay:
        outbound.metrics.replayed.inc(len(replay))
    if meanwhile:
        replay.extend(meanwhile)
    if replay:
        result["_replay"] = replay
    return result


def _packet(kept: Kept, codec: Codec) -> bytes:
    """A kept message as replayed: the same bytes for every socket of a codec, encoded once."""
    packets = kept.packets
    if packets is None:
        packets = kept.packets = {}
    packet = packets.get(codec.name)
    if packet is None:
        packet = packets[codec.name] = codec.replayed(kept.message, kept.position)
    return packet
