"""Protocol 2, end to end (sections 6 and 7): positioned events, and missed-message recovery.

Real gateways on free ports (the memory backplane: positions are ``epoch.n``, a restart is a new
epoch) and real python-socketio clients that keep every argument of every event.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from .support import connect_error, token
from .support.protocol2 import AUTHOR, BLOG_7, BLOG_42, P2, P2Gateway

Serve = Callable[..., Awaitable[P2Gateway]]


async def live_position(gateway: P2Gateway, client: P2) -> str:
    """Push one blog-42 message; ``client`` must receive it live: its position."""
    position = await gateway.push({"name": "seen", "payload": {"n": 0}, "audience": BLOG_42})
    assert await client.expect("seen") == ({"n": 0}, {"position": position})
    return position


async def missed(gateway: P2Gateway, names: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Push messages nobody of blog 42 is connected to receive; their positions, once delivered."""
    positions = [
        await gateway.push({"name": name, "payload": {"i": i}, "audience": audience})
        for i, (name, audience) in enumerate(names)
    ]
    await gateway.settle()
    return positions


# -- positioned events (section 6) ---------------------------------------------------------


async def test_a_protocol_2_event_is_payload_and_meta_whose_position_is_the_204s_bow_position(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    payload = {"title": "é", "list": [1, None, True]}
    position = await gateway.push({"name": "NEW_ARTICLE", "payload": payload, "audience": BLOG_42})
    assert await client.expect("NEW_ARTICLE") == (payload, {"position": position})


async def test_a_protocol_2_event_without_payload_has_null_then_meta(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    position = await gateway.push({"name": "bare", "audience": BLOG_42})
    assert await client.expect("bare") == (None, {"position": position})


async def test_positions_of_successive_messages_differ(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    positions = [await gateway.push({"name": "m", "audience": BLOG_42}) for _ in range(3)]
    received = [(await client.expect("m"))[1]["position"] for _ in range(3)]
    assert received == positions
    assert len(set(positions)) == 3


async def test_protocol_1_and_no_protocol_events_keep_one_argument(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    explicit, ack_1 = await gateway.listener(token("USER/1", AUTHOR), proto="1")
    implicit, ack_none = await gateway.listener(token("USER/2", AUTHOR), proto=None)
    assert ack_1 is None and ack_none is None  # Bow's empty acknowledgement
    await gateway.push({"name": "with", "payload": {"n": 1}, "audience": BLOG_42})
    await gateway.push({"name": "bare", "audience": BLOG_42})
    for client in (explicit, implicit):
        assert await client.expect("with") == ({"n": 1},)
        assert await client.expect("bare") == ()


async def test_protocol_3_is_refused_with_connect_error_4022(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    data = await connect_error(gateway.url + "?v=v1.3&proto=3")
    assert data["data"] == {"code": 4022, "reason": "bad_protocol", "reconnect": "never"}


# -- the acknowledgement -------------------------------------------------------------------


async def test_without_since_the_ack_has_null_recovery_fields_and_a_string_position(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    await gateway.push({"name": "before", "audience": BLOG_7})
    await gateway.settle()
    _, ack = await gateway.listener(token("USER/1", AUTHOR))
    assert set(ack) == {"id", "position", "recovered", "reason", "criteria_changed", "expires_in"}
    assert ack["id"] == "USER/1"
    assert ack["recovered"] is None and ack["reason"] is None and ack["criteria_changed"] is None
    assert isinstance(ack["position"], str) and ack["position"]


async def test_with_empty_options_the_ack_is_the_same_as_without(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    _, ack = await gateway.listener(token("USER/1", AUTHOR), {})
    assert ack["id"] == "USER/1" and isinstance(ack["position"], str)
    assert (ack["recovered"], ack["reason"], ack["criteria_changed"]) == (None, None, None)


# -- recovery (section 7) ------------------------------------------------------------------


async def test_recovery_replays_exactly_the_matching_missed_messages_in_order_then_live(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    positions = await missed(
        gateway,
        [("a", BLOG_42), ("x", BLOG_7), ("b", BLOG_42), ("y", BLOG_7), ("c", BLOG_42)],
    )
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert ack["recovered"] is True and ack["reason"] is None
    assert ack["criteria_changed"] is False
    assert isinstance(ack["position"], str)
    for name, index in (("a", 0), ("b", 2), ("c", 4)):
        expected = ({"i": index}, {"position": positions[index], "replayed": True})
        assert await again.expect(name) == expected
    live = await gateway.push({"name": "live", "payload": 1, "audience": BLOG_42})
    assert await again.expect("live") == (1, {"position": live})


async def test_messages_pushed_during_a_recovery_arrive_after_the_replay_once_each(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [(f"old-{i}", BLOG_42) for i in range(50)])
    again = await gateway.connect()
    pushes = asyncio.gather(
        *(gateway.push({"name": f"new-{i}", "audience": BLOG_42}) for i in range(20))
    )
    ack, _ = await asyncio.gather(
        again.authenticate(token("USER/1", AUTHOR), {"since": since}), pushes
    )
    assert ack["recovered"] is True
    await gateway.sentinel(BLOG_42)
    names = []
    while True:
        name, _ = await again.next()
        if name.startswith("sentinel"):
            break
        names.append(name)
    olds = [name for name in names if name.startswith("old-")]
    news = [name for name in names if name.startswith("new-")]
    assert olds == [f"old-{i}" for i in range(50)]
    assert names[:50] == olds  # the replay first
    assert sorted(news) == sorted(f"new-{i}" for i in range(20)) and len(news) == 20


async def test_over_max_replay_nothing_is_replayed_too_many(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"max_replay": 3})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [(f"m{i}", BLOG_42) for i in range(4)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "too_many")
    await gateway.sentinel(BLOG_42, again)  # the next event: nothing was replayed


async def test_exactly_max_replay_is_replayed(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"max_replay": 3})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [(f"m{i}", BLOG_42) for i in range(3)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    for i in range(3):
        assert (await again.expect(f"m{i}"))[1]["replayed"] is True


async def test_a_message_after_since_left_the_window_gives_too_old(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"max_count": 5})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [(f"m{i}", BLOG_7) for i in range(6)])  # 6 + 1 settling > 5
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "too_old")
    await gateway.sentinel(BLOG_42, again)


async def test_a_message_older_than_max_age_gives_too_old(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"max_age": 0.5})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [("m", BLOG_42)])
    await asyncio.sleep(0.7)
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "too_old")
    await gateway.sentinel(BLOG_42, again)


async def test_a_garbage_since_gives_unknown_position(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    client, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": "not a position!"})
    assert (ack["recovered"], ack["reason"]) == (False, "unknown_position")
    assert isinstance(ack["position"], str)
    assert client.client.connected
    await gateway.sentinel(BLOG_42, client)


async def test_a_since_from_the_future_gives_unknown_position(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    epoch, _, number = since.rpartition(".")  # the memory backplane's form, to forge a future
    future = f"{epoch}.{int(number) + 1000}"
    _, ack = await gateway.listener(token("USER/2", AUTHOR), {"since": future})
    assert (ack["recovered"], ack["reason"]) == (False, "unknown_position")


async def test_a_since_from_a_previous_gateway_process_gives_epoch_changed(
    serve_p2: Serve,
) -> None:
    old = await serve_p2()
    first, _ = await old.listener(token("USER/1", AUTHOR))
    since = await live_position(old, first)
    await old.close()
    await old.bow.stop()  # the process ends; its in-process history with it
    new = await serve_p2()
    await new.push({"name": "m", "audience": BLOG_42})
    await new.settle()
    again, ack = await new.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "epoch_changed")
    await new.sentinel(BLOG_42, again)


async def test_recovery_filters_with_the_new_criteria_and_says_criteria_changed(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    positions = await missed(gateway, [("of-42", BLOG_42), ("of-7", BLOG_7), ("more-42", BLOG_42)])
    moved = token("USER/1", {"role": "author", "blogId": 7})  # removed from blog 42 meanwhile
    again, ack = await gateway.listener(moved, {"since": since})
    assert (ack["recovered"], ack["reason"], ack["criteria_changed"]) == (True, None, True)
    assert await again.expect("of-7") == ({"i": 1}, {"position": positions[1], "replayed": True})
    await gateway.sentinel(BLOG_7, again)  # nothing of blog 42 was replayed


async def test_an_invalid_token_with_a_valid_since_is_refused_and_replays_nothing(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [("m", BLOG_42)])
    victim = await gateway.connect()
    acks = await victim.authenticate_unacked("not-a-jwt", {"since": since})
    await victim.wait_disconnected()
    assert victim.names == ["alert", "disconnect"]
    [(text, info)] = victim.alerts
    assert isinstance(text, str) and text
    assert info == {"code": 4002, "reason": "auth_refused", "fatal": True, "reconnect": "new_token"}
    assert acks == []


async def test_a_quiet_socket_gets_position_and_recovers_from_it(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"position_interval": 0.4})
    quiet, _ = await gateway.listener(token("USER/1", AUTHOR))
    elsewhere = await gateway.push({"name": "elsewhere", "audience": BLOG_7})
    deadline = time.monotonic() + 3
    while True:  # the teller may first send an older position (a criteria change)
        args = await quiet.expect("__position", timeout=deadline - time.monotonic())
        assert args[0] is None and set(args[1]) == {"position"}
        if args[1]["position"] == elsewhere:
            break
    await quiet.close()
    positions = await missed(gateway, [("a", BLOG_42), ("x", BLOG_7), ("b", BLOG_42)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": elsewhere})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    assert await again.expect("a") == ({"i": 0}, {"position": positions[0], "replayed": True})
    assert await again.expect("b") == ({"i": 2}, {"position": positions[2], "replayed": True})
    await gateway.sentinel(BLOG_42, again)


async def test_a_socket_sent_messages_gets_no_position_event(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"position_interval": 0.6})
    busy, _ = await gateway.listener(token("USER/1", AUTHOR))
    for _ in range(6):  # one every 0.2 s: never quiet for 0.6 s
        await gateway.sentinel(BLOG_42, busy)
        await asyncio.sleep(0.2)
    assert "__position" not in busy.names


async def test_a_204s_bow_position_recovers_every_matching_message_after_it(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2()
    stored = await gateway.push({"name": "saved", "audience": BLOG_42})  # the backend keeps it
    positions = await missed(gateway, [("a", BLOG_42), ("x", BLOG_7), ("b", BLOG_42)])
    client, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": stored})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    assert await client.expect("a") == ({"i": 0}, {"position": positions[0], "replayed": True})
    assert await client.expect("b") == ({"i": 2}, {"position": positions[2], "replayed": True})
    await gateway.sentinel(BLOG_42, client)


async def test_disconnect_messages_are_never_replayed(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [("__disconnect", BLOG_42), ("after", BLOG_42)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert ack["recovered"] is True
    assert (await again.expect("after"))[1]["replayed"] is True
    await gateway.sentinel(BLOG_42, again)
    assert again.client.connected


async def test_recovery_disabled_gives_disabled(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"enabled": False})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [("m", BLOG_42)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "disabled")
    await gateway.sentinel(BLOG_42, again)


async def test_bow_position_header_is_there_without_recovery(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"enabled": False})
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    position = await gateway.push({"name": "m", "audience": BLOG_42})
    assert await client.expect("m") == (None, {"position": position})


# -- issue 27: a recovery's cost is bounded, positions cannot be forged ---------------------


async def test_the_window_is_bounded_in_bytes_recovery_max_bytes(serve_p2: Serve) -> None:
    gateway = await serve_p2(recovery={"max_bytes": 100_000})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    big = "x" * 30_000  # 4 of them are over 100,000 bytes: the oldest leave the window
    await missed(gateway, [(f"small-{i}", BLOG_42) for i in range(3)])
    for i in range(6):
        await gateway.push({"name": f"pad-{i}", "payload": big, "audience": BLOG_7})
    await gateway.settle()
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "too_old")
    await gateway.sentinel(BLOG_42, again)
    # The newest messages are still there: a position among them recovers what follows it
    recent = await gateway.push({"name": "recent", "payload": big, "audience": BLOG_42})
    after = await gateway.push({"name": "after", "audience": BLOG_42})
    await gateway.settle()
    third, ack = await gateway.listener(token("USER/2", AUTHOR), {"since": recent})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    assert await third.expect("after") == (None, {"position": after, "replayed": True})


async def test_over_max_scan_entries_a_recovery_is_too_many_however_few_match(
    serve_p2: Serve,
) -> None:
    gateway = await serve_p2(recovery={"max_scan": 10})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    await missed(gateway, [(f"other-{i}", BLOG_7) for i in range(12)])
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (False, "too_many")
    await gateway.sentinel(BLOG_42, again)


async def test_a_position_forged_from_another_is_unknown(serve_p2: Serve) -> None:
    gateway = await serve_p2()
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    seen = await live_position(gateway, first)
    await first.close()
    missed_position = (await missed(gateway, [("secret", BLOG_42)]))[0]
    head, _, number = seen.rpartition(".")
    forged = f"{head}.{int(number) + 1}"  # the next position, as one counting would guess it
    assert forged != missed_position
    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": forged})
    assert (ack["recovered"], ack["reason"]) == (False, "unknown_position")
    await gateway.sentinel(BLOG_42, again)  # nothing replayed
    # The real one, as given out, recovers
    third, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": seen})
    assert (ack["recovered"], ack["reason"]) == (True, None)
    assert (await third.expect("secret"))[1] == {"position": missed_position, "replayed": True}


async def test_a_long_recovery_lets_live_delivery_go_on_and_ends_where_live_begins(
    serve_p2: Serve,
) -> None:
    """A recovery over a window of big messages takes turns with the event loop: a listener
    pushed to every 20 ms meanwhile never waits 250 ms, and the recovering socket still gets its
    replay, then what was delivered during it, each once, in order. Regression: what the
    recovery decoded (1,600 messages of 2,000 objects) was let go all at once after it, a 200-ms
    stall; now a few milliseconds at a time."""
    gateway = await serve_p2(recovery={"max_bytes": 64 << 20})  # 1,600 of 32 KB: 52 MB
    honest, _ = await gateway.listener(token("HONEST", {"blogId": 1}))
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    since = await live_position(gateway, first)
    await first.close()
    payload = [{"k": i, "v": "x"} for i in range(2_000)]  # decoding each: a fraction of a ms
    sem = asyncio.Semaphore(8)

    async def push_big(i: int) -> None:
        async with sem:
            name, audience = ("mine", BLOG_42) if i % 500 == 0 else ("big", BLOG_7)
            await gateway.push({"name": name, "payload": payload, "audience": audience})

    await asyncio.gather(*(push_big(i) for i in range(1_600)))
    await gateway.settle()
    stop = asyncio.Event()

    async def tick() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await gateway.push({"name": "tick", "payload": n, "audience": [{"blogId": 1}]})
            await asyncio.sleep(0.02)

    # The cyclic collector off meanwhile: its full collections of the 3.2 million objects decoded
    # here take 50-400 ms each in this process (`serve`'s gc_freeze keeps them off a gateway's
    # hot path), a pause of the interpreter, not of the recovery under test.
    gc.disable()
    try:
        ticking = asyncio.create_task(tick())
        await asyncio.sleep(0.3)
        again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": since})
        await asyncio.sleep(0.3)
        stop.set()
        await ticking
    finally:
        gc.enable()
    assert (ack["recovered"], ack["reason"]) == (True, None)
    for _ in range(4):
        assert (await again.expect("mine"))[1]["replayed"] is True
    await gateway.sentinel(BLOG_42, again)
    arrivals = [at for name, _, at in honest.log if name == "tick"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(arrivals) > 10 and max(gaps) < 0.25, max(gaps)


def held_by_the_gateway(before: tracemalloc.Snapshot) -> int:
    """Bytes allocated since ``before`` and still held, by the gateway's code (any frame of the
    allocation in ``bow_gateway``: the test's clients hold what they received, not counted)."""
    gc.collect()
    after = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*bow_gateway*", all_frames=True)]
    )
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


async def test_what_the_window_holds_stays_under_recovery_max_bytes(serve_p2: Serve) -> None:
    """Measured with tracemalloc: a window of 100-KB messages holds no more than
    ``recovery.max_bytes`` (each event held at its size: orjson's output kept the 1-MiB buffer
    it was written into, ten times that), and once a recovery replayed some of them, what it
    decoded (the messages, their packets) is let go."""
    bound = 2_000_000
    gateway = await serve_p2(recovery={"max_bytes": bound})
    first, _ = await gateway.listener(token("USER/1", AUTHOR))
    await live_position(gateway, first)
    await first.close()
    big = "x" * 100_000
    tracemalloc.start(32)
    try:
        before = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*bow_gateway*", all_frames=True)]
        )
        positions = [
            await gateway.push({"name": f"big-{i}", "payload": big, "audience": BLOG_42})
            for i in range(40)  # 4 MB: the oldest leave the window
        ]
        await gateway.settle()
        held = held_by_the_gateway(before)
        assert held < 1.25 * bound, f"the window holds {held} bytes"
        # A recovery of the newest 9 (their positions in the window): replayed, then let go
        again, ack = await gateway.listener(token("USER/2", AUTHOR), {"since": positions[30]})
        assert (ack["recovered"], ack["reason"]) == (True, None)
        for i in range(31, 40):
            assert await again.expect(f"big-{i}") == (
                big,
                {"position": positions[i], "replayed": True},
            )
        await gateway.sentinel(BLOG_42, again)
        await again.close()
        await gateway.settle()
        held = held_by_the_gateway(before)
        assert held < 1.25 * bound, f"after a recovery, the window holds {held} bytes"
    finally:
        tracemalloc.stop()
