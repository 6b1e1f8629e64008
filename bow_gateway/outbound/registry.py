"""The client protocols the gateway serves besides Socket.IO (its core's own): each one's name,
endpoint, liveness and configuration key, registered by the protocol's module. A new protocol is a
module that calls :func:`register`; the routes, the configuration (``outbound.{name}_path``) and
``bow-gateway serve``'s banner take it from here, and no other file changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from ..runtime import protocol_paths
from ..runtime.config import Config
from ..runtime.http_server import HandshakeLimits

if TYPE_CHECKING:
    from .hub import Hub

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class EndpointFactory(Protocol):
    """What serves ``GET {outbound.{name}_path}`` for one gateway: built once, at start."""

    def __call__(self, hub: Hub, limits: HandshakeLimits, config: Config) -> Handler: ...


@dataclass(frozen=True, slots=True)
class ClientProtocol:
    """One client protocol: how it is configured, served and kept alive."""

    name: str
    """Lowercase: the key ``outbound.{name}_path`` and the metrics' ``protocol`` label."""
    title: str
    """As ``bow-gateway serve`` names its endpoint: ``Flywheel WebSocket``."""
    default_path: str | None
    endpoint: EndpointFactory
    liveness: str
    """How a dead client is found: what the protocol sends, and how often."""
    websocket: bool = True
    """Its clients open a WebSocket (``ws://``) rather than an HTTP request."""
    how: str = ""
    """What a client does once connected, as the banner says it after the endpoint's URL."""


_PROTOCOLS: dict[str, ClientProtocol] = {}


def register(protocol: ClientProtocol) -> ClientProtocol:
    """Serve ``protocol`` on every gateway started from now on; ``ValueError`` for a name taken or
    not a config key's."""
    protocol_paths.declare(protocol.name, protocol.default_path)
    _PROTOCOLS[protocol.name] = protocol
    return protocol


def registered() -> Mapping[str, ClientProtocol]:
    """The protocols registered, by name, in the order they were."""
    return _PROTOCOLS


def unregister(name: str) -> None:
    """Serve protocol ``name`` no more on gateways started from now on (a test's protocol)."""
    del _PROTOCOLS[name]
    protocol_paths.forget(name)
