"""Rate limits (bow_gateway/runtime/ratelimit.py): the token bucket and the log filter."""

from __future__ import annotations

import logging

import pytest

from bow_gateway.runtime.ratelimit import LogRateLimit, TokenBucket


def test_a_bucket_gives_its_burst_then_refuses() -> None:
    bucket = TokenBucket(rate=0.001, burst=3)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_reservations_queue_up_to_the_longest_wait() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    delays = [bucket.reserve(max_wait=0.35) for _ in range(6)]
    assert delays[:2] == [0.0, 0.0] and delays[5] is None  # the burst, then 3 turns in 0.35 s
    assert all(d is not None and 0.05 < d <= 0.35 for d in delays[2:5])
    assert delays[2] < delays[3] < delays[4]  # each waits for the one before
    assert bucket.reserve(max_wait=0.35) is None  # a refusal reserves nothing


def test_a_flood_of_info_lines_does_not_hide_an_error(caplog: pytest.LogCaptureFixture) -> None:
    # Regression: one bucket for every level: after a churn of connections' INFO lines, a
    # middleware's traceback was dropped.
    logger = logging.getLogger("bow_gateway.test_ratelimit")
    logger.addFilter(LogRateLimit(rate=0.001, burst=5))
    caplog.set_level(logging.INFO, logger=logger.name)
    for n in range(50):
        logger.info("connected %d", n)
    logger.error("the middleware raised")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 6
    assert messages[-1].startswith("the middleware raised")


def test_the_next_line_passed_says_how_many_were_dropped(caplog: pytest.LogCaptureFixture) -> None:
    limit = LogRateLimit(rate=0.001, burst=1)
    logger = logging.getLogger("bow_gateway.test_ratelimit.dropped")
    logger.addFilter(limit)
    caplog.set_level(logging.INFO, logger=logger.name)
    logger.info("first")
    logger.info("second")
    logger.info("third")
    limit._buckets[0]._tokens = 1  # time passed
    logger.info("fourth %s", "line")
    assert [record.getMessage() for record in caplog.records] == [
        "first",
        "fourth line (2 lines dropped by the rate limit)",
    ]
