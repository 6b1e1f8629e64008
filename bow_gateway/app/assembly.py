"""The parts ``Bow.start`` builds from its configuration and its registrations: the recovery
window, the outbound with its settings, the topic histories and the clients' publish, the
webhook engine with its connectors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from ..backplanes import Backplane
from ..connectors.webpush import webpush_from_config
from ..core.enrichers import Enrichers
from ..core.history import History
from ..core.index import CriteriaIndex
from ..core.message import Event
from ..core.plugins import CreateCriteriaFromListenerDetails, OutboundPlugin
from ..core.retention import Retentions
from ..ingress.publisher import Publisher
from ..outbound import Settings, SocketOutbound
from ..outbound.publishing import ClientPublish
from ..outbound.receipts import Receipts
from ..outbound.topic_replay import TopicHistory
from ..runtime.audience_index import AudienceIndex
from ..runtime.config import Config
from ..runtime.metrics import Metrics
from ..runtime.redis_client import redis_client
from ..webhooks import Webhooks, webhooks_from_config


def history_from(config: Config, backplane: Backplane) -> History:
    """The recovery window: ``[recovery]``'s bounds, the backplane's positions."""
    return History(
        backplane.parse_position,
        max_count=config.recovery_max_count,
        max_age=config.recovery_max_age,
        max_bytes=config.recovery_max_bytes,
        max_scan=config.recovery_max_scan,
    )


def webhooks_from(config: Config, metrics: Metrics) -> Webhooks:
    """Section 19's engine, with section 20's Web Push connector as a destination of its
    ``message.undelivered`` events when ``[webpush]`` is configured."""
    webpush = webpush_from_config(config, metrics)
    return webhooks_from_config(config, metrics, () if webpush is None else (webpush,))


def index_from(config: Config) -> AudienceIndex | None:
    """The audience index's reader (section 20) in the gateway's Redis and namespace, where the
    criteria job writes it; None without Redis."""
    if config.redis is None:
        return None
    client = redis_client(config.redis, decode_responses=False)
    return AudienceIndex(client, config.namespace)


def settings_from(config: Config) -> Settings:
    """The outbound's settings, as configured."""
    return Settings(
        auth_timeout=config.auth_timeout,
        max_buffered_bytes=config.max_buffered_bytes,
        expiry_grace=config.expiry_grace,
        expire_v1_sockets=config.expire_v1_sockets,
        max_sockets_per_id=config.max_sockets_per_id,
        max_buffered_bytes_per_id=config.max_buffered_bytes_per_id,
        max_anonymous=config.max_anonymous,
        max_authenticates_per_minute=config.max_authenticates_per_minute,
        max_filters=config.max_filters,
        max_filters_per_id=config.max_filters_per_id,
        max_filters_per_instance=config.max_filters_per_instance,
        recovery_enabled=config.recovery_enabled,
        max_replay=config.recovery_max_replay,
        position_interval=config.position_interval,
    )


def outbound_from(
    config: Config,
    *,
    outbounds: Mapping[str, OutboundPlugin],
    middlewares: Mapping[str, CreateCriteriaFromListenerDetails],
    backplane: Backplane,
    publish: Callable[[Event], Awaitable[str]],
    publisher: Publisher,
    retentions: Retentions,
    history: History,
    enrichers: Enrichers,
    metrics: Metrics,
) -> SocketOutbound:
    """The outbound every client protocol serves from, an index per middleware version."""
    return SocketOutbound(
        outbounds=outbounds,
        middlewares=middlewares,
        indices={version: CriteriaIndex() for version in middlewares},
        publish=publish,
        history=history,
        settings=settings_from(config),
        claim=backplane.claim,
        release=backplane.release,
        hold=backplane.hold,
        let_go=backplane.let_go,
        max_incoming_bytes=config.max_incoming_bytes,
        body_timeout=config.http_timeout,
        transports=config.transports,
        cors_origins=config.cors_origins,
        metrics=metrics,
        receipts=Receipts(
            backplane.report, max_ids=config.receipts_max_ids, ttl=config.receipts_ttl
        ),
        topic_history=(
            TopicHistory(
                backplane.topic_bounds,
                backplane.topic_read,
                retentions,
                max_replays_per_minute=config.recovery_max_replays_per_minute,
            )
            if retentions
            else None
        ),
        client_publish=ClientPublish(
            publisher.published,
            enrich=enrichers.enrich_all if enrichers else None,
            timeout=config.inbound_timeout,
            max_queries=config.max_queries,
            max_predicates=config.max_predicates,
            max_event_bytes=config.max_event_bytes,
        ),
    )
