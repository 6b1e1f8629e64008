"""GET /metrics: Prometheus figures that move by the right amounts under real traffic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bow_gateway import Bow

from .support import AUTH, PATH, Listener, base_config, standard_bow

Push = Callable[..., Awaitable[aiohttp.ClientResponse]]
StartBow = Callable[[Bow], Awaitable[Bow]]


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of /metrics, keyed as ``name{label="value",...}``."""
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_metrics_count_real_traffic(
    http: aiohttp.ClientSession,
    url: str,
    push: Push,
    listeners: Callable[..., Awaitable[Listener]],
) -> None:
    before = await scrape(http, url)
    admin = await listeners("USER/1", {"role": "admin"})
    author = await listeners("USER/2", {"role": "author"})
    refused = await listeners(None)
    await refused.client.emit("authenticate", "not-a-jwt", callback=lambda *a: None)
    await refused.disconnected.wait()
    for _ in range(3):
        assert (
            await push({"name": "N", "audience": [{"role": "admin"}, {"role": "author"}]})
        ).status == 204
    assert (await push({"name": "N", "audience": [{}]})).status == 422
    for listener in (admin, author):
        for _ in range(3):
            await listener.next_event()
    await author.close()
    after = await scrape(http, url)

    def moved(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved('bow_messages_accepted_total{inbound="/v1.2/messages"}') == 3
    assert moved('bow_messages_refused_total{inbound="/v1.2/messages",status="422"}') == 1
    assert moved('bow_deliveries_total{protocol="socketio"}') == 6
    assert moved('bow_authentications_total{outbound="v1.3",outcome="accepted"}') == 2
    assert moved('bow_authentications_total{outbound="v1.3",outcome="refused"}') == 1
    assert after['bow_sockets_connected{outbound="v1.3",protocol="socketio"}'] == 1
    assert after['bow_sockets_authenticated{outbound="v1.3",protocol="socketio"}'] == 1
    assert moved('bow_disconnects_total{reason="refused"}') == 1
    assert moved("bow_audience_resolution_seconds_count{}") == 3  # the 422 never got that far
    assert moved("bow_delivery_latency_seconds_count{}") == 3


async def test_metrics_need_no_credentials_by_default(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.get(url + "/metrics") as response:
        assert response.status == 200


async def test_metrics_can_be_put_behind_the_inbound_credentials(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(standard_bow(base_config(metrics={"auth": True})))
    async with http.get(f"http://127.0.0.1:{bow.port}/metrics") as response:
        assert response.status == 401
    async with http.get(f"http://127.0.0.1:{bow.port}/metrics", headers=AUTH) as response:
        assert response.status == 200


async def test_metrics_can_have_a_port_of_their_own(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(standard_bow(base_config(metrics={"port": 0})))
    assert bow.metrics_port and bow.metrics_port != bow.port
    async with http.get(f"http://127.0.0.1:{bow.metrics_port}/metrics") as response:
        assert response.status == 200
        assert "bow_deliveries_total" in await response.text()
    async with http.get(f"http://127.0.0.1:{bow.port}/metrics", headers=AUTH) as response:
        assert response.status == 404


async def test_two_gateways_in_one_process_keep_their_figures_apart(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    first = await start_bow(standard_bow())
    second = await start_bow(standard_bow())
    async with http.post(
        f"http://127.0.0.1:{first.port}{PATH}", json={"name": "N", "audience": []}, headers=AUTH
    ) as response:
        assert response.status == 204
    first_figures = await scrape(http, f"http://127.0.0.1:{first.port}")
    second_figures = await scrape(http, f"http://127.0.0.1:{second.port}")
    key = 'bow_messages_accepted_total{inbound="/v1.2/messages"}'
    assert first_figures[key] == 1
    assert second_figures.get(key, 0) == 0


async def test_a_stalled_event_loop_shows_in_the_loop_lag_histogram(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    def blocking_message_fn(body: object) -> object:
        time.sleep(0.6)  # blocks the loop (as it must not) past the next probe by >= 0.35 s
        return body

    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(
            path="/in", create_message_from_request_body=blocking_message_fn, middleware_version="1"
        )
    )
    url = f"http://127.0.0.1:{bow.port}"
    await asyncio.sleep(0.6)  # a few samples of an idle loop
    before = await scrape(http, url)
    assert before["bow_event_loop_lag_seconds_count{}"] >= 2
    over = 'bow_event_loop_lag_seconds_bucket{le="0.25"}'
    idle_stalls = before["bow_event_loop_lag_seconds_count{}"] - before[over]
    body = {"name": "N", "audience": []}
    async with http.post(url + "/in", json=body, headers=AUTH) as response:
        assert response.status == 204
    await asyncio.sleep(0.3)
    after = await scrape(http, url)
    stalls = after["bow_event_loop_lag_seconds_count{}"] - after[over] - idle_stalls
    assert stalls >= 1  # the 0.6 s stall (a loaded machine may add one of its own)
