"""The Web Push connector (contract section 20): subscriptions stored through
``/_bow/push-subscriptions`` (in a real Redis), checked; each ``message.undelivered`` pushed,
VAPID-signed and encrypted, to every subscription of the listeners that missed it, as a real push
service (:mod:`.support.push_service`) verifies and decrypts it; ``404``/``410`` dropping a
subscription, ``503`` retried; a bad ``[webpush]`` refused at start, naming the setting."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bow_gateway import Bow

from .support import AUTH, PATH, base_config, until
from .support.mixed_clients import Mixed, next_seen
from .support.push_service import PushService, b64url
from .support.redis_server import RedisServer

SUBJECT = "mailto:ops@example.com"
FX = {"desk": "fx"}
ROUTE = "/_bow/push-subscriptions"
PRIVATE_KEY = ec.generate_private_key(ec.SECP256R1())
RAW_KEY = b64url(PRIVATE_KEY.private_numbers().private_value.to_bytes(32, "big"))
SERVER_KEY = b64url(
    PRIVATE_KEY.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
)


def webpush_table(**overrides: Any) -> dict[str, Any]:
    table = {"vapid_private_key": RAW_KEY, "subject": SUBJECT, "allow_http_loopback": True}
    return {**table, **overrides}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def push_service() -> AsyncIterator[PushService]:
    started = await PushService(SUBJECT, SERVER_KEY).start()
    yield started
    await started.stop()
    assert started.refused == []


@pytest.fixture
def namespace() -> str:
    return f"webpush-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def gateway(
    serve_mixed: Callable[..., Awaitable[Mixed]], redis_server: RedisServer, namespace: str
) -> Mixed:
    """A gateway of every protocol on Redis with the connector configured."""
    return await serve_mixed(redis=redis_server.url, namespace=namespace, webpush=webpush_table())


@pytest.fixture
async def store(redis_server: RedisServer, namespace: str) -> AsyncIterator[Any]:
    """A client of the gateway's Redis, to look at the subscriptions held."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def listener_key(namespace: str, listener_id: Any) -> str:
    return f"{{{namespace}}}:webpush:listener:{listener_id!s}"


async def subscribe(gateway: Mixed, listener_id: Any, subscription: Any) -> aiohttp.ClientResponse:
    async with gateway.http.post(
        gateway.url + ROUTE, json={"id": listener_id, "subscription": subscription}, headers=AUTH
    ) as response:
        await response.read()
        return response


async def fallback(gateway: Mixed, audience: list[dict[str, Any]], **body: Any) -> str:
    """Publish to ``audience`` with ``Bow-Fallback: 1``; the message's id."""
    message = {"name": "news", "payload": {"n": 1}, "audience": audience, **body}
    async with gateway.http.post(
        gateway.url + PATH, json=message, headers={**AUTH, "Bow-Fallback": "1"}
    ) as response:
        assert response.status == 204, await response.text()
        message_id: str = response.headers["Bow-Message-Id"]
    return message_id


def good(push_service: PushService) -> dict[str, Any]:
    return push_service.subscribe()


BAD_SUBSCRIPTIONS = [
    (lambda s: {**s, "endpoint": "ftp://push.example.com/x"}, "subscription.endpoint"),
    (lambda s: {**s, "endpoint": "http://push.example.com/x"}, "https:// URL"),
    (lambda s: {**s, "endpoint": 42}, "subscription.endpoint"),
    (lambda s: {k: v for k, v in s.items() if k != "keys"}, "subscription.keys"),
    (lambda s: {**s, "keys": {"p256dh": s["keys"]["p256dh"]}}, "subscription.keys"),
    (lambda s: {**s, "keys": {**s["keys"], "auth": "a+b/"}}, "keys.auth: must be base64url"),
    (lambda s: {**s, "keys": {**s["keys"], "auth": b64url(b"x" * 15)}}, "16 bytes, not 15"),
    (lambda s: {**s, "keys": {**s["keys"], "p256dh": b64url(b"x" * 64)}}, "65 bytes, not 64"),
    (lambda s: {**s, "keys": {**s["keys"], "p256dh": b64url(b"\4" * 65)}}, "not an uncompressed"),
    (lambda s: {**s, "more": 1}, "unknown key 'more'"),
    (lambda s: "not an object", "subscription: must be"),
]


@pytest.mark.parametrize(("spoil", "named"), BAD_SUBSCRIPTIONS)
async def test_a_bad_subscription_is_refused_with_422_naming_what_is_wrong(
    gateway: Mixed, push_service: PushService, spoil: Callable[[Any], Any], named: str
) -> None:
    async with gateway.http.post(
        gateway.url + ROUTE,
        json={"id": "USER/1", "subscription": spoil(good(push_service))},
        headers=AUTH,
    ) as response:
        assert response.status == 422
        assert named in await response.text()


@pytest.mark.parametrize("listener_id", [None, "", True, [1]])
async def test_a_bad_listener_id_is_refused_with_422(
    gateway: Mixed, push_service: PushService, listener_id: Any
) -> None:
    response = await subscribe(gateway, listener_id, good(push_service))
    assert response.status == 422


async def test_subscriptions_need_the_control_credentials(
    gateway: Mixed, push_service: PushService
) -> None:
    body = {"id": "USER/1", "subscription": good(push_service)}
    async with gateway.http.post(gateway.url + ROUTE, json=body) as response:
        assert response.status == 401


async def test_a_subscription_is_stored_in_redis_by_listener(
    gateway: Mixed, push_service: PushService, store: Any, namespace: str
) -> None:
    subscription = good(push_service)
    response = await subscribe(gateway, "USER/1", subscription)
    assert response.status == 200
    held = await store.hgetall(listener_key(namespace, '"USER/1"'))
    assert list(held) == [subscription["endpoint"]]
    assert await store.hget(f"{{{namespace}}}:webpush:endpoints", subscription["endpoint"]) == (
        '"USER/1"'
    )


async def test_delete_by_endpoint_removes_the_subscription(
    gateway: Mixed, push_service: PushService, store: Any, namespace: str
) -> None:
    subscription = good(push_service)
    await subscribe(gateway, 7, subscription)
    body = {"endpoint": subscription["endpoint"]}
    async with gateway.http.delete(gateway.url + ROUTE, json=body, headers=AUTH) as response:
        assert response.status == 200
        assert await response.json() == {"removed": 1}
    assert await store.hgetall(listener_key(namespace, "7")) == {}
    assert await store.hgetall(f"{{{namespace}}}:webpush:endpoints") == {}


async def test_delete_with_another_listeners_id_removes_nothing(
    gateway: Mixed, push_service: PushService
) -> None:
    subscription = good(push_service)
    await subscribe(gateway, 7, subscription)
    body = {"id": 8, "endpoint": subscription["endpoint"]}
    async with gateway.http.delete(gateway.url + ROUTE, json=body, headers=AUTH) as response:
        assert await response.json() == {"removed": 0}


async def test_delete_with_an_id_alone_removes_every_subscription_of_the_listener(
    gateway: Mixed, push_service: PushService, store: Any, namespace: str
) -> None:
    for _ in range(2):
        await subscribe(gateway, "USER/3", good(push_service))
    body = {"id": "USER/3"}
    async with gateway.http.delete(gateway.url + ROUTE, json=body, headers=AUTH) as response:
        assert await response.json() == {"removed": 2}
    assert await store.hgetall(f"{{{namespace}}}:webpush:endpoints") == {}


async def test_a_new_endpoint_past_max_subscriptions_is_refused_with_422(
    serve_mixed: Callable[..., Awaitable[Mixed]],
    redis_server: RedisServer,
    namespace: str,
    push_service: PushService,
) -> None:
    webpush = webpush_table(max_subscriptions=1)
    gateway = await serve_mixed(redis=redis_server.url, namespace=namespace, webpush=webpush)
    assert (await subscribe(gateway, "USER/1", good(push_service))).status == 200
    async with gateway.http.post(
        gateway.url + ROUTE,
        json={"id": "USER/2", "subscription": good(push_service)},
        headers=AUTH,
    ) as response:
        assert response.status == 422
        assert "1 push subscriptions" in await response.text()


async def test_a_listener_keeps_its_newest_subscriptions_up_to_the_bound(
    serve_mixed: Callable[..., Awaitable[Mixed]],
    redis_server: RedisServer,
    namespace: str,
    push_service: PushService,
    store: Any,
) -> None:
    webpush = webpush_table(max_subscriptions_per_listener=2)
    gateway = await serve_mixed(redis=redis_server.url, namespace=namespace, webpush=webpush)
    made = [good(push_service) for _ in range(3)]
    for subscription in made:
        assert (await subscribe(gateway, "USER/1", subscription)).status == 200
    held = await store.hgetall(listener_key(namespace, '"USER/1"'))
    assert set(held) == {made[1]["endpoint"], made[2]["endpoint"]}


async def test_a_fallback_reaches_every_subscription_of_the_listeners_that_missed_it(
    gateway: Mixed, push_service: PushService
) -> None:
    two, two_again, four = good(push_service), good(push_service), good(push_service)
    for listener_id, subscription in (("USER/2", two), ("USER/2", two_again), (4, four)):
        assert (await subscribe(gateway, listener_id, subscription)).status == 200
    message_id = await fallback(gateway, [{"__id": "USER/2"}, {"__id": 4}])
    await push_service.wait_for(3)
    sent = {"id": message_id, "name": "news", "payload": {"n": 1}}
    assert push_service.to(two) == push_service.to(two_again) == push_service.to(four) == [sent]
    headers = push_service.pushed[0].headers
    assert headers["TTL"] == "86400" and headers["Content-Encoding"] == "aes128gcm"


async def test_a_connected_listener_is_not_pushed(
    gateway: Mixed, push_service: PushService
) -> None:
    here, away = good(push_service), good(push_service)
    await subscribe(gateway, "USER/1", here)
    await subscribe(gateway, "USER/2", away)
    socket = await gateway.socketio("USER/1", FX)  # acknowledges what it gets
    await fallback(gateway, [{"__id": "USER/1"}, {"__id": "USER/2"}])
    await next_seen(socket)
    await push_service.wait_for(1)
    await asyncio.sleep(0.5)  # the event's other pushes, had there been any
    assert push_service.to(here) == [] and len(push_service.to(away)) == 1


@pytest.mark.parametrize("status", [404, 410])
async def test_a_subscription_the_push_service_says_is_gone_is_removed(
    gateway: Mixed, push_service: PushService, store: Any, namespace: str, status: int
) -> None:
    gone, kept = good(push_service), good(push_service)
    gone_token = gone["endpoint"].rsplit("/", 1)[1]
    push_service.answer = lambda token, attempt: (status if token == gone_token else 201, {})
    await subscribe(gateway, "USER/2", gone)
    await subscribe(gateway, "USER/2", kept)
    await fallback(gateway, [{"__id": "USER/2"}])
    await push_service.wait_for(1)
    key = listener_key(namespace, '"USER/2"')
    await until(lambda: push_service.attempts.get(gone_token) == 1, "the push refused")
    await _until_async(lambda: store.hkeys(key), [kept["endpoint"]])
    assert push_service.attempts[gone_token] == 1  # not retried


async def test_a_503_is_retried_after_its_retry_after(
    gateway: Mixed, push_service: PushService
) -> None:
    subscription = good(push_service)
    push_service.answer = lambda token, attempt: (
        (503, {"Retry-After": "0"}) if attempt == 1 else (201, {})
    )
    await subscribe(gateway, "USER/2", subscription)
    await fallback(gateway, [{"__id": "USER/2"}])
    await push_service.wait_for(1)
    token = subscription["endpoint"].rsplit("/", 1)[1]
    assert push_service.attempts[token] == 2 and len(push_service.to(subscription)) == 1


async def test_a_push_refused_for_good_is_a_dead_letter(
    gateway: Mixed, push_service: PushService
) -> None:
    subscription = good(push_service)
    push_service.answer = lambda token, attempt: (400, {})
    await subscribe(gateway, "USER/2", subscription)
    await fallback(gateway, [{"__id": "USER/2"}])

    async def dead() -> list[dict[str, Any]]:
        async with gateway.http.get(gateway.url + "/_bow/webhooks/dead", headers=AUTH) as response:
            letters: list[dict[str, Any]] = (await response.json())["dead"]
            return letters

    letters = await _until_async(dead, lambda found: len(found) == 1)
    assert letters[0]["url"] == "webpush:" and letters[0]["last_status"] == 400


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"vapid_private_key": "not-a-key"}, "webpush.vapid_private_key"),
        ({"vapid_private_key": b64url(b"k" * 31)}, "webpush.vapid_private_key"),
        ({"subject": "ops@example.com"}, "webpush.subject"),
        ({"subject": "http://example.com"}, "webpush.subject"),
        ({"vapid_private_key": None, "vapid_private_key_env": "BOW_TEST_UNSET_KEY"}, "BOW_TEST_"),
        ({"ttl": -1}, "webpush"),
    ],
)
def test_a_bad_webpush_configuration_is_refused_naming_the_setting(
    table: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as refused:
        Bow(base_config(webpush=webpush_table(**table)))
    assert RAW_KEY not in str(refused.value)


def test_a_pem_key_is_taken() -> None:
    pem = PRIVATE_KEY.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    bow = Bow(base_config(webpush=webpush_table(vapid_private_key=pem)))
    assert bow.config.webpush is not None and bow.config.webpush.public_key == SERVER_KEY


async def _until_async(
    read: Callable[[], Awaitable[Any]], wanted: Any, timeout: float = 10.0
) -> Any:
    """Poll ``read()`` until it equals ``wanted`` (or ``wanted(value)`` holds); the value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await read()
        if (wanted(value) if callable(wanted) else value == wanted) or time.monotonic() > deadline:
            assert wanted(value) if callable(wanted) else value == wanted, value
            return value
        await asyncio.sleep(0.05)


async def test_without_redis_the_gateway_holds_the_subscriptions_and_pushes(
    serve_mixed: Callable[..., Awaitable[Mixed]], push_service: PushService
) -> None:
    gateway = await serve_mixed(webpush=webpush_table())
    subscription = good(push_service)
    assert (await subscribe(gateway, "USER/2", subscription)).status == 200
    message_id = await fallback(gateway, [{"__id": "USER/2"}])
    await push_service.wait_for(1)
    assert push_service.to(subscription)[0]["id"] == message_id


def test_the_environment_configures_the_connector() -> None:
    from bow_gateway.app.standalone import load_settings

    environ = {"BOW_WEBPUSH_VAPID_PRIVATE_KEY": RAW_KEY, "BOW_WEBPUSH_SUBJECT": SUBJECT}
    settings = load_settings(None, {**environ, "BOW_WEBPUSH_TTL": "60"})
    webpush = Bow(settings.config).config.webpush
    assert webpush is not None and (webpush.ttl, webpush.public_key) == (60, SERVER_KEY)


async def test_the_metrics_count_pushes_sent_failed_and_subscriptions_removed(
    gateway: Mixed, push_service: PushService
) -> None:
    sent, flaky, gone = good(push_service), good(push_service), good(push_service)
    tokens = {
        name: sub["endpoint"].rsplit("/", 1)[1] for name, sub in (("flaky", flaky), ("gone", gone))
    }

    def answer(token: str, attempt: int) -> tuple[int, dict[str, str]]:
        if token == tokens["gone"]:
            return 410, {}
        if token == tokens["flaky"] and attempt == 1:
            return 503, {"Retry-After": "0"}
        return 201, {}

    push_service.answer = answer
    for subscription in (sent, flaky, gone):
        await subscribe(gateway, "USER/2", subscription)
    await fallback(gateway, [{"__id": "USER/2"}])
    registry = gateway.bow.metrics.registry
    await until(
        lambda: registry.get_sample_value(
            "bow_webpush_subscriptions_removed_total", {"reason": "410"}
        ),
        "the subscription removed",
        timeout=15,
    )
    await push_service.wait_for(2)
    assert registry.get_sample_value("bow_webpush_sent_total") == 2
    assert registry.get_sample_value("bow_webpush_failed_total", {"status": "503"}) == 1
