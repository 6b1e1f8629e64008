"""``history_bench.py``'s part ``memory``: what a retained message and a topic cost in Redis."""

from __future__ import annotations

import argparse

from redis.asyncio import Redis

from lib import stats
from lib.histories.messages import MEMORY, NOBODY, PAYLOAD
from lib.histories.parts import Part, start_part
from lib.histories.posting import fill, fill_topics
from lib.histories.redis_figures import memory_usage, used_memory
from lib.private_redis import RedisServer


async def messages(args: argparse.Namespace, part: Part, client: Redis) -> int:
    """``--retained`` messages in one topic: bytes per message. Returns the bytes
    ``{ns}:sequences`` held before (``topics`` prints them)."""
    ns = part.namespace
    events, sequences = f"{{{ns}}}:events", f"{{{ns}}}:sequences"
    topic_key = f"{{{ns}}}:topic:{MEMORY}"
    base = await used_memory(client)
    events0, sequences0 = (
        await memory_usage(client, events),
        await memory_usage(client, sequences),
    )
    xlen0 = int(await client.xlen(events)) if events0 else 0
    posting, _ = await fill(part.url, MEMORY, args.retained, 1000, args.posters, NOBODY)
    n = posting.accepted
    retained = await used_memory(client)
    events1, topic1 = await memory_usage(client, events), await memory_usage(client, topic_key)
    xlen1 = int(await client.xlen(events))
    per_entry_main = (events1 - events0) / max(1, xlen1 - xlen0)
    sample = await client.xrange(topic_key, "-", "+", count=1)
    entry = (sample[0][1] if sample else None) or {}
    data_bytes = len(entry.get(b"d", b""))
    position_bytes = len(entry.get(b"p", b""))
    print(
        f"  {n:,} messages of {PAYLOAD}-byte payloads in {MEMORY!r} (audience nobody "
        f"connected); each stored as d = {data_bytes} bytes (the event's JSON) and p = "
        f"{position_bytes} bytes (its position in the event stream)"
    )
    rows = [
        [
            "used_memory, after - before",
            f"{(retained - base) / 2**20:,.1f} MiB",
            f"{(retained - base) / n:,.0f}",
            "both copies: topic stream + event stream + the rest",
        ],
        [
            f"MEMORY USAGE {topic_key}",
            f"{topic1 / 2**20:,.1f} MiB",
            f"{topic1 / n:,.0f}",
            "the topic's history: what a retained message costs",
        ],
        [
            f"MEMORY USAGE {events} (+{xlen1 - xlen0:,} entries)",
            f"{(events1 - events0) / 2**20:,.1f} MiB",
            f"{per_entry_main:,.0f}",
            f"every event, kept or not; at most ~backplane.max_len entries ({xlen1:,} now)",
        ],
    ]
    print(stats.table(["measure", "total", "bytes per message", "what"], rows))
    return sequences0


async def topics(args: argparse.Namespace, part: Part, client: Redis, sequences0: int) -> None:
    """``--topics`` topics of one message each, then emptied: bytes per topic."""
    ns = part.namespace
    events, sequences = f"{{{ns}}}:events", f"{{{ns}}}:sequences"
    before = await used_memory(client)
    events2 = await memory_usage(client, events)
    sequences2 = await memory_usage(client, sequences)
    filled = await fill_topics(part.url, args.topics, 1000)
    t = filled.accepted
    after = await used_memory(client)
    events3, sequences3 = (
        await memory_usage(client, events),
        await memory_usage(client, sequences),
    )
    one_key = await memory_usage(client, f"{{{ns}}}:topic:chat/t/0")
    pipeline = client.pipeline(transaction=False)
    for k in range(args.topics):
        pipeline.xtrim(f"{{{ns}}}:topic:chat/t/{k}", maxlen=0)
    await pipeline.execute()
    emptied = await used_memory(client)
    empty_key = await memory_usage(client, f"{{{ns}}}:topic:chat/t/0")
    main_share = events3 - events2
    hash_share = sequences3 - sequences2
    print(
        f"  {t:,} topics 'chat/t/<k>' of one message each, then each topic's stream trimmed to "
        f"nothing (XTRIM MAXLEN 0, as max_age leaves an idle topic); {ns!r}:sequences held "
        f"{sequences0:,} bytes before"
    )
    rows = [
        [
            "used_memory, after - before, less the event stream's change",
            f"{(after - before - main_share) / 2**20:,.1f} MiB",
            f"{(after - before - main_share) / t:,.0f}",
            "a topic of one message: its stream key, the entry, its sequences field",
        ],
        [
            "  of which {ns}:sequences (MEMORY USAGE)",
            f"{hash_share / 2**20:,.2f} MiB",
            f"{hash_share / t:,.0f}",
            "the topic's field in the hash of last sequences",
        ],
        [
            "the same, once emptied",
            f"{(emptied - before - main_share) / 2**20:,.1f} MiB",
            f"{(emptied - before - main_share) / t:,.0f}",
            "an empty topic: its stream key and its sequences field",
        ],
        [
            "the event stream's change (MEMORY USAGE)",
            f"{main_share / 2**20:,.1f} MiB",
            f"{main_share / t:,.0f}",
            "~0 once it is at max_len: it trims as much as it takes",
        ],
        [
            "MEMORY USAGE of one topic key",
            "-",
            f"{one_key:,} / {empty_key:,}",
            "with its one message / emptied",
        ],
    ]
    print(stats.table(["measure", "total", "bytes per topic", "what"], rows))


async def memory_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "memory")
    try:
        sequences0 = await messages(args, part, client)
        await topics(args, part, client, sequences0)
    finally:
        part.gateways.stop()
    return True
