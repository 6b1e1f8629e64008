"""Idempotent publish (contract section 16): ``Idempotency-Key`` on the inbound, on its fast path
and aiohttp's alike, on one instance and across two (through Redis), and ``Bow.publish``'s
``idempotency_key``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from bow_gateway.inbounds.passthrough import create_message_from_envelope

from bow_gateway import Bow

from .support import AUTH, PATH, Gateway, base_config, token
from .support.protocol2 import AUTHOR, BLOG_42, P2, P2Gateway, p2_bow
from .support.redis_server import RedisServer

StartBow = Callable[[Bow], Awaitable[Bow]]
NEWS = {"name": "news", "payload": {"n": 1}, "audience": BLOG_42}


async def post(
    gateway: P2Gateway, body: Any, key: str | None, *, chunked: bool = False, path: str = PATH
) -> tuple[int, dict[str, str], str]:
    """POST ``body`` with ``Idempotency-Key: key``: the status, headers and text. ``chunked``:
    sent chunked, which the fast path hands to aiohttp."""
    headers = {**AUTH, **({"Idempotency-Key": key} if key is not None else {})}
    data: Any = {"json": body}
    if chunked:
        encoded = json.dumps(body).encode()

        async def chunks() -> AsyncIterator[bytes]:
            yield encoded

        data = {"data": chunks(), "headers": {**headers, "Content-Type": "application/json"}}
    else:
        data["headers"] = headers
    async with gateway.http.post(gateway.url + path, **data) as response:
        return response.status, dict(response.headers), await response.text()


async def author(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    return client


async def test_a_repeat_with_the_same_body_gets_the_first_204_and_nothing_is_published_again(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    client = await author(gateway)
    first = await post(gateway, NEWS, "order-17:shipped")
    again = await post(gateway, NEWS, "order-17:shipped")
    assert first[0] == again[0] == 204, (first, again)
    for header in ("Bow-Position", "Bow-Message-Id"):
        assert first[1][header] == again[1][header]
    await client.expect("news")
    await gateway.sentinel(BLOG_42, client)  # the next event is the sentinel: no second "news"
    assert client.ids[0] == first[1]["Bow-Message-Id"]


async def test_a_repeat_with_another_body_is_422_naming_the_reuse(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    assert (await post(gateway, NEWS, "k-1"))[0] == 204
    status, _, text = await post(gateway, {**NEWS, "payload": {"n": 2}}, "k-1")
    assert status == 422 and "Idempotency-Key was used for a request with another body" in text


@pytest.mark.parametrize(
    "key", ["", "x" * 201, "two words", "caf\u00e9", "a/b"], ids=["empty", "201", "space", "e", "/"]
)
async def test_a_malformed_key_is_422_and_nothing_is_published(
    serve_p2: Callable[..., Awaitable[P2Gateway]], key: str
) -> None:
    gateway = await serve_p2()
    client = await author(gateway)
    status, _, text = await post(gateway, NEWS, key)
    assert status == 422 and "Idempotency-Key must be 1 to 200 characters" in text
    await gateway.sentinel(BLOG_42, client)


async def test_the_longest_key_and_every_allowed_character_are_taken(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    key = ("AZaz09._:-" * 20)[:200]
    assert (await post(gateway, NEWS, key))[0] == 204


async def test_a_repeat_while_the_first_is_under_way_is_409_with_retry_after(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    async def slowly(body: Any) -> Any:
        await asyncio.sleep(0.5)
        return create_message_from_envelope(body)

    bow = p2_bow(base_config())
    bow.inbound(path="/slow", create_message_from_request_body=slowly, middleware_version="v1.1")
    gateway = await serve_p2(bow)
    first, second = await asyncio.gather(
        post(gateway, NEWS, "slow-1", path="/slow"), post(gateway, NEWS, "slow-1", path="/slow")
    )
    statuses = sorted([first[0], second[0]])
    assert statuses == [204, 409], (first, second)
    refused = first if first[0] == 409 else second
    assert refused[1]["Retry-After"] == "1"


async def test_the_same_key_on_another_inbound_path_is_another_key(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    bow = p2_bow(base_config())
    bow.inbound(
        path="/other",
        create_message_from_request_body=create_message_from_envelope,
        middleware_version="v1.1",
    )
    gateway = await serve_p2(bow)
    first = await post(gateway, NEWS, "shared-key")
    other = await post(gateway, NEWS, "shared-key", path="/other")
    assert first[1]["Bow-Message-Id"] != other[1]["Bow-Message-Id"]


async def test_after_the_window_the_key_is_free_again(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2(inbound={**base_config()["inbound"], "idempotency_window": 1})
    first = await post(gateway, NEWS, "k-window")
    await asyncio.sleep(1.2)
    later = await post(gateway, NEWS, "k-window")
    assert first[1]["Bow-Message-Id"] != later[1]["Bow-Message-Id"]


async def test_a_batch_repeat_answers_the_first_ids(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    batch = [{**NEWS, "payload": n} for n in range(3)]
    first = await post(gateway, batch, "batch-1")
    again = await post(gateway, batch, "batch-1")
    assert first[1]["Bow-Message-Ids"] == again[1]["Bow-Message-Ids"]
    assert len(first[1]["Bow-Message-Ids"].split(", ")) == 3


async def test_the_fast_path_and_aiohttp_s_path_share_one_key(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    """The first POST is the fast path's (a plain JSON request), the repeat aiohttp's (sent
    chunked): one message, one answer."""
    gateway = await serve_p2()
    client = await author(gateway)
    first = await post(gateway, NEWS, "two-paths")
    again = await post(gateway, NEWS, "two-paths", chunked=True)
    assert again[0] == 204 and first[1]["Bow-Message-Id"] == again[1]["Bow-Message-Id"]
    await client.expect("news")
    await gateway.sentinel(BLOG_42, client)


async def test_a_key_accepted_by_one_instance_is_answered_by_another(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    namespace = f"idempotency-{uuid.uuid4().hex[:8]}"
    config = base_config(redis="redis://127.0.0.1:6379/0", namespace=namespace)
    a = P2Gateway(Gateway(await start_bow(p2_bow(config)), http))
    b = P2Gateway(Gateway(await start_bow(p2_bow(config)), http))
    try:
        listener, _ = await b.listener(token("USER/1", AUTHOR))
        first = await post(a, NEWS, "cross-instance")
        again = await post(b, NEWS, "cross-instance")
        assert again[0] == 204 and first[1]["Bow-Message-Id"] == again[1]["Bow-Message-Id"]
        await listener.expect("news")
        await b.sentinel(BLOG_42, listener)
    finally:
        await a.close()
        await b.close()


async def test_bow_publish_returns_the_id_and_position_and_a_repeat_returns_the_first(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    client = await author(gateway)
    message_id, position = await gateway.bow.publish(NEWS, "embedded-1")
    assert await gateway.bow.publish(NEWS, "embedded-1") == (message_id, position)
    assert await client.expect("news") == ({"n": 1}, {"position": position})
    assert client.ids == [message_id]
    await gateway.sentinel(BLOG_42, client)
    other_id, _ = await gateway.bow.publish(NEWS)
    assert other_id != message_id


async def test_bow_publish_refuses_a_reused_key_an_invalid_message_and_a_bad_key(
    serve_p2: Callable[..., Awaitable[P2Gateway]],
) -> None:
    gateway = await serve_p2()
    await gateway.bow.publish(NEWS, "embedded-2")
    with pytest.raises(ValueError, match="another body"):
        await gateway.bow.publish({**NEWS, "payload": 2}, "embedded-2")
    with pytest.raises(ValueError, match="audience"):
        await gateway.bow.publish({"name": "x"})
    with pytest.raises(ValueError, match="Idempotency-Key must be"):
        await gateway.bow.publish(NEWS, "a b")
    with pytest.raises(ValueError, match="unknown middleware_version"):
        await gateway.bow.publish(NEWS, middleware_version="v9")


async def test_bow_publish_before_start_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        await p2_bow(base_config()).publish(NEWS)


FREEZE_MESSAGES = 1_000
RATE = 100.0  # keyed publishes a second


async def publish_until_accepted(gateway: P2Gateway, n: int, attempts: list[int]) -> None:
    """POST message ``n`` with its key until it is accepted: every ``503``, ``409`` or error
    retried with the same key."""
    body = {"name": "m", "payload": n, "audience": BLOG_42}
    while True:
        attempts[n] += 1
        try:
            status, _, _ = await post(gateway, body, f"freeze-{n}")
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        if status == 204:
            return
        assert status in (0, 409, 503), status
        await asyncio.sleep(0.25)


async def payloads_until_end(client: P2) -> list[Any]:
    received = []
    while (event := await client.next(timeout=30))[0] != "end":
        if event[0] == "m":
            received.append(event[1][0])
    return received


@pytest.mark.slow
async def test_keyed_publishes_retried_through_a_redis_freeze_are_each_delivered_once(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    """1,000 keyed publishes at 100 a second, Redis stopped (SIGSTOP) for 5 s midway: every
    ``503`` retried with its key after SIGCONT; a websocket and a long-polling listener each
    receive every message once. Guards against a retry of a message Redis took late (after its
    ``503``) delivering it twice."""
    with RedisServer() as server:
        config = base_config(
            redis=server.url,
            namespace=f"freeze-{uuid.uuid4().hex[:8]}",
            backplane={"publish_timeout": 1.0},
        )
        gateway = P2Gateway(Gateway(await start_bow(p2_bow(config)), http))
        try:
            websocket, _ = await gateway.listener(token("USER/1", AUTHOR))
            polling = P2(gateway.url)
            gateway.clients.append(polling)
            await polling.connect(transport="polling")
            await polling.authenticate(token("USER/2", AUTHOR))
            attempts = [0] * FREEZE_MESSAGES
            tasks = []
            loop = asyncio.get_running_loop()
            started, frozen = loop.time(), 0.0
            for n in range(FREEZE_MESSAGES):
                if n == 200:
                    server.pause()  # SIGSTOP: what is under way now answers 503, or hangs
                    frozen = loop.time()
                elif frozen and loop.time() > frozen + 5:
                    server.resume()  # SIGCONT: what Redis held runs now, late
                    frozen = 0.0
                tasks.append(asyncio.create_task(publish_until_accepted(gateway, n, attempts)))
                await asyncio.sleep(max(0.0, started + (n + 1) / RATE - loop.time()))
            if frozen:
                server.resume()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert sum(attempts) > FREEZE_MESSAGES, "the freeze refused some publishes"
            assert (await post(gateway, {"name": "end", "audience": BLOG_42}, None))[0] == 204
            for client in (websocket, polling):
                assert sorted(await payloads_until_end(client)) == list(range(FREEZE_MESSAGES))
        finally:
            await gateway.close()
