"""The one way to build a Redis client from settings, for every Redis user of the project.

The backplane, the precomputed-criteria middleware and the criteria job (its driver and its Spark
executors) all take the same ``redis`` settings:

- a URL: ``redis://[:password@]host:6379/0``, ``rediss://`` for TLS, ``unix:///run/redis.sock``;
- a mapping of redis-py connection keyword arguments: ``{"host": "10.0.0.5", "port": 6379}``;
- Redis Sentinel: a mapping with ``sentinels`` (``"host:port"`` or ``[host, port]`` each) and
  ``service_name`` (plus connection keywords for the master, and ``sentinel_kwargs``);
- Redis Cluster: a list of startup nodes, ``[{"host": "node1", "port": 7000}, ...]`` (keys other
  than ``host`` and ``port`` are connection keywords shared by every node).

Self-contained (the standard library, and redis-py imported only when a client is built): the
criteria job ships this module to its executors by value, and the configuration checks settings
with it in a gateway that may never use Redis.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

RedisSettings: TypeAlias = str | dict[str, Any] | list[dict[str, Any]]
"""A URL, a mapping of connection settings (perhaps Sentinel's), or a list of cluster nodes."""

AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"

SETTINGS_FORMS = (
    "a redis:// URL, a mapping of connection settings (with sentinels and service_name for Redis"
    " Sentinel), or a list of such mappings (Redis Cluster nodes)"
)


def check_settings(settings: Any) -> RedisSettings:
    """``settings`` as the builders take them (copied), or ``ValueError`` saying what is wrong."""
    if isinstance(settings, str) and settings:
        url: str = settings
        return url
    if isinstance(settings, Mapping):
        options: dict[str, Any] = dict(settings)
        if "sentinels" in options or "service_name" in options:
            _check_sentinel(options)
        return options
    if isinstance(settings, list) and settings and all(isinstance(n, Mapping) for n in settings):
        nodes = [dict(node) for node in settings]
        if not all(isinstance(node.get("host"), str) and node["host"] for node in nodes):
            raise ValueError("every Redis Cluster node needs a host")
        return nodes
    raise ValueError(f"must be {SETTINGS_FORMS}")


def _check_sentinel(settings: Mapping[str, Any]) -> None:
    sentinels, service = settings.get("sentinels"), settings.get("service_name")
    if not isinstance(sentinels, list) or not sentinels:
        raise ValueError('Redis Sentinel needs "sentinels": a list of "host:port" or [host, port]')
    for sentinel in sentinels:
        try:
            _address(sentinel)
        except (TypeError, ValueError):
            raise ValueError(f'a sentinel is "host:port" or [host, port]: {sentinel!r}') from None
    if not isinstance(service, str) or not service:
        raise ValueError('Redis Sentinel needs "service_name": the name of the monitored master')


def redis_client(
    settings: RedisSettings, *, defaults: Mapping[str, Any] | None = None, **forced: Any
) -> AsyncClient:
    """An asyncio client (``redis.asyncio``) for ``settings``.

    Connection keywords: ``defaults`` < those in ``settings`` < ``forced``. Close it with
    ``await client.aclose()``, which also closes a Sentinel client's connections to the sentinels.
    """
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.asyncio.sentinel

    class SentinelMaster(redis.asyncio.Redis):
        """The master a Sentinel names; closing it closes the connections to the sentinels."""

        sentinels: list[redis.asyncio.Redis] = []  # noqa: RUF012 - set on each instance

        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            await super().aclose(close_connection_pool)
            for sentinel in self.sentinels:
                await sentinel.aclose()

    settings = check_settings(settings)
    options = {**(defaults or {})}
    if isinstance(settings, str):
        return redis.asyncio.Redis.from_url(settings, **{**options, **forced})
    if isinstance(settings, list):
        nodes = [redis.asyncio.cluster.ClusterNode(*_node(node)) for node in settings]
        shared = _shared(settings)
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=nodes, **{**options, **shared, **forced}
        )
    options = {**options, **settings, **forced}
    if "sentinels" not in options:
        return redis.asyncio.Redis(**options)
    sentinels = [_address(sentinel) for sentinel in options.pop("sentinels")]
    service = options.pop("service_name")
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        sentinels, sentinel_kwargs=options.pop("sentinel_kwargs", None), **options
    )
    master: SentinelMaster = sentinel.master_for(service, redis_class=SentinelMaster)
    master.sentinels = list(sentinel.sentinels)
    return master


def sync_redis_client(
    settings: RedisSettings, *, defaults: Mapping[str, Any] | None = None, **forced: Any
) -> SyncClient:
    """A synchronous client (``redis``) for ``settings``, as :func:`redis_client` builds them.

    Close it with ``client.close()``, which also closes a Sentinel client's sentinel connections.
    """
    import redis
    import redis.cluster
    import redis.sentinel

    class SentinelMaster(redis.Redis):
        """The master a Sentinel names; closing it closes the connections to the sentinels."""

        sentinels: list[redis.Redis] = []  # noqa: RUF012 - set on each instance

        def close(self) -> None:
            super().close()
            for sentinel in self.sentinels:
                sentinel.close()

    settings = check_settings(settings)
    options = {**(defaults or {})}
    if isinstance(settings, str):
        return redis.Redis.from_url(settings, **{**options, **forced})
    if isinstance(settings, list):
        nodes = [redis.cluster.ClusterNode(*_node(node)) for node in settings]  # type: ignore[no-untyped-call]
        shared = _shared(settings)
        return redis.cluster.RedisCluster(startup_nodes=nodes, **{**options, **shared, **forced})
    options = {**options, **settings, **forced}
    if "sentinels" not in options:
        return redis.Redis(**options)
    sentinels = [_address(sentinel) for sentinel in options.pop("sentinels")]
    service = options.pop("service_name")
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        sentinels, sentinel_kwargs=options.pop("sentinel_kwargs", None), **options
    )
    master: SentinelMaster = sentinel.master_for(  # type: ignore[no-untyped-call]
        service, redis_class=SentinelMaster
    )
    master.sentinels = list(sentinel.sentinels)
    return master


async def subscribe(client: AsyncClient, pubsub: Any, *channels: str) -> None:
    """``SUBSCRIBE`` with ``client.pubsub()``; a cluster client first learns where the slots
    are, which its pub/sub does not do by itself (redis-py 8)."""
    import redis.asyncio.cluster

    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        await client.initialize()
    await pubsub.subscribe(*channels)


def describe(settings: Any) -> str:
    """The settings for a log line or an error: where Redis is, never a password."""
    if isinstance(settings, str):
        return redacted(settings)
    if isinstance(settings, list):
        return "the Redis Cluster of " + ", ".join(_where(node) for node in settings)
    if isinstance(settings, Mapping) and "sentinels" in settings:
        sentinels = ", ".join(str(sentinel) for sentinel in settings["sentinels"])
        return f"the master of {settings.get('service_name')!r} (sentinels {sentinels})"
    return _where(settings) if isinstance(settings, Mapping) else type(settings).__name__


def redacted(url: str) -> str:
    """A Redis URL without its password (``redis://user:***@host``)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


def _where(settings: Mapping[str, Any]) -> str:
    address = f"{settings.get('host', 'localhost')}:{settings.get('port', 6379)}"
    return str(settings.get("unix_socket_path") or address)


def _node(node: Mapping[str, Any]) -> tuple[str, int]:
    return str(node["host"]), int(node.get("port", 6379))


def _shared(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The connection keywords given with the cluster nodes (other than their addresses)."""
    return {k: v for node in nodes for k, v in node.items() if k not in ("host", "port")}


def _address(sentinel: Any) -> tuple[str, int]:
    """A sentinel as ``"host:port"`` or ``[host, port]``."""
    host, port = sentinel.rsplit(":", 1) if isinstance(sentinel, str) else sentinel
    return str(host), int(port)
