"""prometheus_client's histogram and counter updated once per event-loop step
(bow_gateway/seams/prometheus.py): what a scrape reads after the step is what observing each
value at once would have given."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from bow_gateway.seams.prometheus import StepCounter, StepHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [0.0, 0.0005, 0.001, 0.002, 0.01, 0.05, 0.5, 1.0, 3.0, 7.5]


def samples(registry: CollectorRegistry) -> dict[str, float]:
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


async def test_a_step_s_observations_reach_the_histogram_as_one_by_one_would() -> None:
    plain, stepped = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("latency", "l", buckets=BUCKETS, registry=plain)
    histogram = StepHistogram(Histogram("latency", "l", buckets=BUCKETS, registry=stepped))
    for value in VALUES:
        reference.observe(value)
        histogram.observe(value)
    assert samples(stepped)["latency_count[]"] == 0  # still within the step
    await asyncio.sleep(0)
    assert samples(stepped) == samples(plain)
    for value in VALUES[:3]:  # a later step adds to the first
        reference.observe(value)
        histogram.observe(value)
    await asyncio.sleep(0)
    assert samples(stepped) == samples(plain)
    assert b'latency_bucket{le="0.001"} 6.0' in generate_latest(stepped)


async def test_a_step_s_increments_reach_the_counter_once_it_ends() -> None:
    registry = CollectorRegistry()
    counter = Counter("deliveries", "d", ["protocol"], registry=registry)
    stepped = StepCounter(counter.labels("sse"))
    for _ in range(5):
        stepped.inc(3)
    key = "deliveries_total[('protocol', 'sse')]"
    assert samples(registry)[key] == 0
    await asyncio.sleep(0)
    assert samples(registry)[key] == 15
