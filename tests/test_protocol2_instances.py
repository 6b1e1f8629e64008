"""Protocol 2 across instances (sections 7 and 10): two gateways through one private
redis-server (no persistence: a restart loses everything), real python-socketio clients.

A client recovers on the other instance; under load, clients that drop and come back (sometimes
to the other instance) receive exactly their share of every accepted message, once, in order;
Redis losing its history (restart, ``FLUSHALL``, ``DEL`` of the stream) is a new epoch that
connected protocol-2 sockets are told of (``__gap``) and old positions cannot recover from; and
``outbound.max_sockets_per_id`` counts the sockets of an id on every instance.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis.asyncio
import socketio

from bow_gateway import Bow

from .support import AUTH, PATH, WAIT, base_config, read_metric, token, until
from .support.protocol2 import AUTHOR, BLOG_7, BLOG_42, P2, p2_bow, stream_key, without_id
from .support.redis_server import RedisServer

GAPS = 'bow_gaps_total{reason="epoch_changed"}'
BROKEN = 15.0  # seconds an instance may take to notice a broken history (it looks every second)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # no RDB, no AOF
        yield server


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(port=redis_server.port)
    yield client
    await client.aclose()


class Instance:
    """One running gateway: pushes that return their ``Bow-Position``, protocol-2 clients
    (closed at the end), and a protocol-1 watcher of its own (no ``__gap`` nor ``__position``
    comes between it and what it waits for)."""

    def __init__(self, name: str, bow: Bow, http: aiohttp.ClientSession) -> None:
        self.name = name
        self.bow = bow
        self.url = f"http://127.0.0.1:{bow.port}"
        self.http = http
        self.clients: list[P2] = []
        self.watcher_id = f"WATCHER-{name}"
        self.watcher: P2 | None = None

    async def push(self, body: Any) -> str:
        async with self.http.post(self.url + PATH, json=body, headers=AUTH) as response:
            text = await response.text()
            assert response.status == 204, f"push to {self.name}: {response.status} {text}"
            position = response.headers["Bow-Position"]
        assert isinstance(position, str) and position.isascii() and 0 < len(position) <= 64
        return position

    async def connect(self, proto: str | None = "2") -> P2:
        client = P2(self.url)
        self.clients.append(client)
        return await client.connect(proto)

    async def listener(
        self, listener_token: Any, options: Any = None, proto: str | None = "2"
    ) -> tuple[P2, Any]:
        client = await self.connect(proto)
        return client, await client.authenticate(listener_token, options)

    async def watch(self) -> None:
        self.watcher, ack = await self.listener(token(self.watcher_id), proto="1")
        assert ack is None

    async def gaps(self) -> float:
        return await read_metric(self.http, self.url, GAPS)

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))


Pair = tuple[Instance, Instance]
StartPair = Callable[..., Awaitable[Pair]]


@pytest.fixture
async def pair(
    redis_server: RedisServer,
    start_bow: Callable[[Bow], Awaitable[Bow]],
    http: aiohttp.ClientSession,
) -> AsyncIterator[StartPair]:
    """``a, b = await pair(**config)``: two instances of one gateway (:func:`p2_bow`, envelopes
    of name, payload and audience) through the private Redis, each with its watcher."""
    started: list[Instance] = []

    async def start(**config: Any) -> Pair:
        config.setdefault("namespace", f"p2-{uuid.uuid4().hex[:8]}")
        config["outbound"] = {"timeout": 5, **config.get("outbound", {})}
        settings = base_config(redis=redis_server.url, **config)
        for name in "AB":
            instance = Instance(name, await start_bow(p2_bow(settings)), http)
            started.append(instance)
            await instance.watch()
        return started[-2], started[-1]

    yield start
    await asyncio.gather(*(instance.close() for instance in started))


_settled = 0


async def settle(a: Instance, b: Instance) -> str:
    """Push to both watchers and wait until each has it: both instances have delivered (and
    keep in their window) everything accepted before. Its position."""
    global _settled
    _settled += 1
    name = f"settled-{_settled}"
    audience = [{"__id": a.watcher_id}, {"__id": b.watcher_id}]
    position = await a.push({"name": name, "audience": audience})
    for instance in (a, b):
        assert instance.watcher is not None
        assert await instance.watcher.expect(name) == ()  # protocol 1, no payload
    return position


async def live_position(pusher: Instance, client: P2) -> str:
    """Push one blog-42 message (to ``pusher``); ``client`` receives it live: its position."""
    position = await pusher.push({"name": "seen", "payload": {"n": 0}, "audience": BLOG_42})
    assert await client.expect("seen") == ({"n": 0}, {"position": position})
    return position


# -- 1. recovery on the other instance -----------------------------------------------------


async def test_a_client_dropped_on_one_instance_recovers_on_the_other(pair: StartPair) -> None:
    a, b = await pair()
    first, _ = await a.listener(token("USER/1", AUTHOR))
    since = await live_position(a, first)
    await first.close()
    missed = [("a", BLOG_42), ("x", BLOG_7), ("b", BLOG_42), ("y", BLOG_7), ("c", BLOG_42)]
    positions = [
        await (a, b)[i % 2].push({"name": name, "payload": {"i": i}, "audience": audience})
        for i, (name, audience) in enumerate(missed)
    ]
    settled = await settle(a, b)
    again, ack = await b.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"], ack["criteria_changed"]) == (True, None, False)
    assert ack["id"] == "USER/1" and ack["position"] == settled
    for name, i in (("a", 0), ("b", 2), ("c", 4)):
        assert await again.expect(name) == ({"i": i}, {"position": positions[i], "replayed": True})
    live = await a.push({"name": "live", "payload": 1, "audience": BLOG_42})
    assert await again.expect("live") == (1, {"position": live})


# -- 2. the load test ----------------------------------------------------------------------

RATE = 200  # messages a second, alternately to each instance
SECONDS = 6.0
ROAMERS = 50
GROUPS = 16


@dataclass
class Roamer:
    """One listener (``ROAM/n``, in two groups) that drops and comes back, each time on a
    socket of its own, always asking for what it missed since the last position it received.

    ``received`` is every event, as received, over all its sockets (``("connected", n)`` where
    socket ``n`` began); events that arrive on a socket after it was given up are not kept (they
    come after ``since``, so they are replayed)."""

    number: int
    groups: list[int]
    token: str = ""
    received: list[tuple[str, Any]] = field(default_factory=list)
    acks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (instance, ack)
    first_ack_position: str = ""
    at: str = ""  # the instance it is connected to
    client: socketio.AsyncClient | None = None
    sockets: list[socketio.AsyncClient] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token = token(f"ROAM/{self.number}", {"group": self.groups})

    async def connect(self, instance: Instance, since: str | None) -> dict[str, Any]:
        client = socketio.AsyncClient(reconnection=False)
        self.sockets.append(client)

        async def on_any(event: str, *args: Any) -> None:
            if self.client is client:
                self.received.append((event, args))

        client.on("*", on_any)
        self.client = client
        self.received.append(("connected", len(self.sockets)))
        await client.connect(
            instance.url + "?v=v1.3&proto=2", transports=["websocket"], wait_timeout=WAIT
        )
        options = {} if since is None else {"since": since}
        ack: dict[str, Any] = await client.call("authenticate", (self.token, options), timeout=WAIT)
        self.acks.append((instance.name, ack))
        return ack

    async def drop(self) -> None:
        client, self.client = self.client, None
        assert client is not None
        await client.disconnect()

    def since(self) -> str:
        """The last position received, or (none yet) that of the first ack."""
        for name, args in reversed(self.received):
            if (
                name != "connected"
                and len(args) == 2
                and isinstance(args[1], dict)
                and "position" in args[1]
            ):
                position: str = args[1]["position"]
                return position
        return self.first_ack_position

    async def roam(self, instances: Pair, t0: float, rng: random.Random) -> None:
        """Drop 1 to 3 times during the run, each time coming back after 0 to 0.3 s to either
        instance (half the time the other one)."""
        drops = sorted(rng.uniform(0.2, SECONDS - 0.5) for _ in range(rng.randint(1, 3)))
        where = next(i for i, instance in enumerate(instances) if instance.name == self.at)
        for at in drops:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            await self.drop()
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            if rng.random() < 0.5:
                where = 1 - where
            since = self.since()
            await self.connect(instances[where], since)
            self.at = instances[where].name

    async def close(self) -> None:
        await asyncio.gather(*(client.disconnect() for client in self.sockets))


async def test_under_load_roaming_clients_receive_exactly_their_messages_once_in_order(
    pair: StartPair,
) -> None:
    a, b = await pair(recovery={"position_interval": 3600})  # no __position in what is compared
    instances = (a, b)
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    roamers = [Roamer(n, rng.sample(range(GROUPS), 2)) for n in range(ROAMERS)]
    try:
        for roamer in roamers:
            start = rng.randrange(2)
            roamer.at = instances[start].name
            ack = await roamer.connect(instances[start], None)
            assert ack["recovered"] is None and isinstance(ack["position"], str)
            roamer.first_ack_position = ack["position"]
        await settle(a, b)  # both instances hold every first ack's position

        count = int(RATE * SECONDS)
        audiences = [rng.sample(range(GROUPS), rng.choice((1, 1, 2))) for _ in range(count)]
        positions: list[str | None] = [None] * count

        async def post(i: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            body = {
                "name": "m",
                "payload": {"i": i},
                "audience": [{"group": group} for group in audiences[i]],
            }
            positions[i] = await instances[i % 2].push(body)

        t0 = time.monotonic() + 0.1
        tasks = [asyncio.ensure_future(post(i, t0 + i / RATE)) for i in range(count)]
        tasks += [
            asyncio.ensure_future(roamer.roam(instances, t0, random.Random(rng.random())))
            for roamer in roamers
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        elapsed = time.monotonic() - t0

        end = await a.push({"name": "end", "audience": [{"group": g} for g in range(GROUPS)]})
        await until(
            lambda: all(r.received and r.received[-1][0] == "end" for r in roamers),
            "every roamer's end marker",
            timeout=20,
        )

        assert all(position is not None for position in positions)
        order = sorted(range(count), key=lambda i: stream_key(positions[i] or ""))
        assert len({stream_key(p or "")[0] for p in positions}) == 1  # one epoch throughout
        assert len(set(positions)) == count
        context = f"seed {seed}"
        reconnections = 0
        for roamer in roamers:
            wanted = [i for i in order if set(audiences[i]) & set(roamer.groups)]
            events = [(name, args) for name, args in roamer.received if name != "connected"]
            assert events[-1][0] == "end", context
            assert without_id(events[-1][1][1]) == {"position": end}, context
            got = events[:-1]
            assert [name for name, _ in got] == ["m"] * len(got), (context, roamer.number, got)
            assert [args[0]["i"] for _, args in got] == wanted, (context, roamer.number)
            for _, (payload, meta) in got:
                assert without_id(meta) in (
                    {"position": positions[payload["i"]]},
                    {"position": positions[payload["i"]], "replayed": True},
                ), (context, meta)
            # on each socket, what was replayed comes first, then live messages
            replayed_after_live = False
            live = False
            for name, args in roamer.received:
                if name == "connected":
                    live = False
                elif name == "m":
                    if args[1].get("replayed"):
                        replayed_after_live |= live
                    else:
                        live = True
            assert not replayed_after_live, (context, roamer.number)
            for where, ack in roamer.acks[1:]:
                reconnections += 1
                assert (ack["recovered"], ack["reason"]) == (True, None), (context, where, ack)
        assert reconnections >= ROAMERS
        places = [[where for where, _ in roamer.acks] for roamer in roamers]
        moves = sum(x != y for names in places for x, y in itertools.pairwise(names))
        assert moves > 0  # some came back to the other instance (about half of them)
        assert elapsed < SECONDS + 3, f"the pushes took {elapsed:.1f} s"
    finally:
        await asyncio.gather(*(roamer.close() for roamer in roamers))


# -- 3. and 4. epochs ----------------------------------------------------------------------


async def expect_gap(client: P2) -> str:
    """The next event is ``__gap`` ``epoch_changed``: its position."""
    payload, meta = await client.expect("__gap", timeout=BROKEN)
    assert payload is None and set(meta) == {"position", "reason"}, meta
    assert meta["reason"] == "epoch_changed"
    position: str = meta["position"]
    assert isinstance(position, str) and position.isascii() and 0 < len(position) <= 64
    return position


async def test_redis_restarted_without_persistence_is_a_new_epoch_on_every_instance(
    pair: StartPair, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bow_gateway")
    a, b = await pair()
    on_a, _ = await a.listener(token("USER/1", AUTHOR))
    on_b, _ = await b.listener(token("USER/2", AUTHOR))
    v1, ack = await b.listener(token("USER/3", AUTHOR), proto="1")
    assert ack is None
    since = await live_position(b, on_a)
    assert await on_b.expect("seen") == ({"n": 0}, {"position": since})
    assert await v1.expect("seen") == ({"n": 0},)
    gaps_before = [await a.gaps(), await b.gaps()]

    redis_server.restart()

    gap = await expect_gap(on_a)
    assert await expect_gap(on_b) == gap  # both instances agree on the new epoch
    assert gap != since
    assert [await a.gaps(), await b.gaps()] == [n + 1 for n in gaps_before]
    late, ack = await b.listener(token("USER/4", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "epoch_changed")
    assert ack["position"] == gap
    live = await a.push({"name": "after", "payload": 2, "audience": BLOG_42})
    for client in (on_a, on_b, late):
        assert await client.expect("after") == (2, {"position": live})
    assert await v1.expect("after") == (2,)  # protocol 1: never told, still served
    assert v1.client.connected and v1.names == ["seen", "after"]
    # ... but logged: A holds its watcher, B its watcher and v1
    untold = [
        int(found[1])
        for record in caplog.records
        if (found := re.search(r"(\d+) protocol-1 sockets may have missed", record.getMessage()))
    ]
    assert sorted(untold) == [1, 2]


@pytest.mark.parametrize("loss", ["FLUSHALL", "DEL"])
async def test_a_flushed_or_deleted_stream_is_a_new_epoch(
    pair: StartPair, admin: redis.asyncio.Redis, loss: str
) -> None:
    namespace = f"p2-{uuid.uuid4().hex[:8]}"
    a, b = await pair(namespace=namespace)
    on_a, _ = await a.listener(token("USER/1", AUTHOR))
    on_b, _ = await b.listener(token("USER/2", AUTHOR))
    since = await live_position(a, on_a)
    assert await on_b.expect("seen") == ({"n": 0}, {"position": since})

    if loss == "FLUSHALL":
        await admin.flushall()
    else:
        assert await admin.delete(f"{{{namespace}}}:events") == 1

    gap = await expect_gap(on_a)
    assert await expect_gap(on_b) == gap
    lates: list[P2] = []
    for instance, late_id in ((a, "USER/3"), (b, "USER/4")):
        late, ack = await instance.listener(token(late_id, AUTHOR), {"since": since})
        assert (ack["recovered"], ack["reason"]) == (False, "epoch_changed"), instance.name
        if not lates:  # nothing accepted since the gap (the first's criteria are, after its ack)
            assert ack["position"] == gap
        lates.append(late)
    live = await b.push({"name": "after", "payload": 2, "audience": BLOG_42})
    for client in (on_a, on_b, *lates):
        assert await client.expect("after") == (2, {"position": live})


# -- 5. sockets per id, on every instance --------------------------------------------------


async def test_max_sockets_per_id_counts_the_sockets_of_every_instance(
    pair: StartPair, admin: redis.asyncio.Redis
) -> None:
    namespace = f"p2-{uuid.uuid4().hex[:8]}"
    a, b = await pair(namespace=namespace, outbound={"max_sockets_per_id": 2})
    first, ack = await a.listener(token("X", AUTHOR))
    assert ack["id"] == "X"
    second, ack = await b.listener(token("X", AUTHOR))
    assert ack["id"] == "X"
    for instance in (a, b):
        third = await instance.connect()
        acks = await third.authenticate_unacked(token("X", AUTHOR))
        await third.wait_disconnected()
        assert third.names == ["alert", "disconnect"], instance.name
        [(text, info)] = third.alerts
        assert isinstance(text, str) and text
        assert info == {
            "code": 4009,
            "reason": "too_many_sockets",
            "fatal": True,
            "reconnect": "backoff",
        }
        assert acks == []
    claims = f'{{{namespace}}}:sockets:"X"'
    assert await admin.zcard(claims) == 2  # the refused sockets hold no place

    await first.close()
    deadline = time.monotonic() + WAIT
    while await admin.zcard(claims) != 1:  # the instance gives the place back
        assert time.monotonic() < deadline, "the closed socket's place was never given back"
        await asyncio.sleep(0.02)
    fourth, ack = await a.listener(token("X", AUTHOR))
    assert ack["id"] == "X" and fourth.client.connected
    live = await b.push({"name": "both", "audience": [{"__id": "X"}]})
    for client in (second, fourth):
        assert await client.expect("both") == (None, {"position": live})


# -- a position the other instance has not read yet ----------------------------------------


async def test_a_position_another_instance_gave_out_recovers_on_one_that_lags(
    pair: StartPair,
) -> None:
    # A backend may hand a client the 204's position before every instance has read it: the
    # instance waits for its reader (a moment) rather than call the position unknown.
    a, b = await pair()
    await settle(a, b)
    reader = b.bow._backplane  # B's reader takes 0.3 s to hand on what it read
    read = reader._xread  # type: ignore[union-attr]

    async def lagging(*args: Any) -> Any:
        response = await read(*args)
        if response[0]:
            await asyncio.sleep(0.3)
        return response

    reader._xread = lagging  # type: ignore[union-attr]
    first, _ = await a.listener(token("USER/1", AUTHOR))
    since = await live_position(a, first)  # delivered by A; B has not read it yet
    await first.close()
    again, ack = await b.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    live = await a.push({"name": "live", "payload": 1, "audience": BLOG_42})
    assert await again.expect("live", timeout=BROKEN) == (1, {"position": live})  # not "seen"
