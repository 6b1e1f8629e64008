"""What a ``Bow`` is given before it starts: its versioned plugins (middlewares, inbounds,
outbounds), enrichers and health check, each checked as it is registered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from ..core import plugins
from ..core.criteria import ID_KEY, validate_criteria
from ..core.enrichers import Enrichers
from ..outbound import normalise_version
from ..runtime.config import Config
from .routes import check_inbound


class Registry:
    """The registrations of a ``Bow``: every one returns the same object, so that calls chain;
    an invalid one raises ``ValueError`` naming the field."""

    def __init__(self, config: Config) -> None:
        # Keyed by normalise_version(version), so that "v1" and "1" match; the names as configured
        # (the specs' version, these) are what errors, logs and metric labels show.
        self._middlewares: dict[str, plugins.CreateCriteriaFromListenerDetails] = {}
        self._middleware_names: dict[str, str] = {}
        self._middleware_references: list[tuple[str, str]] = []  # (who, middleware version)
        self._inbounds: dict[str, plugins.InboundPlugin] = {}
        self._outbounds: dict[str, plugins.OutboundPlugin] = {}
        self._health_check: plugins.HealthCheck | None = None
        self._api_prefix = config.api_prefix
        self._enrichers = Enrichers(  # its enrich(message) is what every source of messages calls
            timeout=config.inbound_timeout,
            max_queries=config.max_queries,
            max_predicates=config.max_predicates,
        )

    def middleware(
        self,
        *,
        version: str,
        create_criteria_from_listener_details: plugins.CreateCriteriaFromListenerDetails,
    ) -> Self:
        """Register how a listener's details become criteria, under a unique version."""
        key = _version("middleware", version)
        _callable("create_criteria_from_listener_details", create_criteria_from_listener_details)
        if key in self._middlewares:
            raise ValueError(f"middleware version {version!r} is already registered")
        self._middlewares[key] = create_criteria_from_listener_details
        self._middleware_names[key] = version
        return self

    def inbound(
        self,
        *,
        path: str,
        create_message_from_request_body: plugins.CreateMessageFromRequestBody | None = None,
        middleware_version: str,
        create_message_from_request: plugins.CreateMessageFromRequest | None = None,
    ) -> Self:
        """Register ``POST path`` (aiohttp's syntax: ``/api/message/{topic:.+}`` has a parameter),
        whose JSON bodies (``create_message_from_request_body``) or whole requests
        (``create_message_from_request``, given an :class:`InboundRequest`; exactly one of the
        two) become messages resolved by a middleware version."""
        functions = (create_message_from_request_body, create_message_from_request)
        check_inbound(path, self._api_prefix, *functions)
        if path in self._inbounds:
            raise ValueError(f"inbound path {path!r} is already registered")
        self._inbounds[path] = plugins.InboundPlugin(
            path,
            create_message_from_request_body,
            _version("middleware_version", middleware_version),
            create_message_from_request=create_message_from_request,
        )
        self._middleware_references.append((f"inbound {path!r}", middleware_version))
        return self

    def outbound(
        self,
        *,
        version: str,
        create_listener_details_from_token: plugins.CreateListenerDetailsFromToken,
        middleware_version: str,
        anonymous_criteria: Mapping[str, Any] | None = None,
        create_message_from_publish: plugins.CreateMessageFromPublish | None = None,
    ) -> Self:
        """Register an outbound version (every client protocol) whose tokens become listener
        details; ``anonymous_criteria``: the criteria of a listener without a token (None:
        refused); ``create_message_from_publish``: what a client's publish becomes (None:
        clients cannot publish)."""
        key = _version("outbound", version)
        if key in self._outbounds:
            raise ValueError(f"outbound version {version!r} is already registered")
        _callable("create_listener_details_from_token", create_listener_details_from_token)
        if create_message_from_publish is not None:
            _callable("create_message_from_publish", create_message_from_publish)
        self._outbounds[key] = plugins.OutboundPlugin(
            version,
            create_listener_details_from_token,
            _version("middleware_version", middleware_version),
            anonymous_criteria=_anonymous(anonymous_criteria),
            create_message_from_publish=create_message_from_publish,
        )
        self._middleware_references.append((f"outbound {version!r}", middleware_version))
        return self

    def enricher(
        self, *, filter: str, enrich: plugins.Enrich, init: plugins.EnrichInit | None = None
    ) -> Self:
        """Pass every accepted message whose name matches the MQTT topic ``filter`` through
        ``enrich(message) -> message`` before it is positioned, after the enrichers registered
        before; ``init()`` runs once at ``start()`` (see :mod:`bow_gateway.core.enrichers`)."""
        self._enrichers.add(filter, enrich, init)
        return self

    def health_check(self, decorator: plugins.HealthCheck) -> Self:
        """Let ``decorator(request)`` make the ``200`` answer of ``GET /health``."""
        _callable("health_check", decorator)
        self._health_check = decorator
        return self

    def _check_versions(self) -> None:
        for what, middleware_version in self._middleware_references:
            if normalise_version(middleware_version) not in self._middlewares:
                known = ", ".join(sorted(self._middleware_names.values())) or "none"
                raise ValueError(
                    f"{what} names middleware version {middleware_version!r}, "
                    f"which is not registered (registered: {known})"
                )

    def _plugin_functions(self) -> list[object]:
        """Every function registered: those of them that are ``AsyncClosable`` close at stop."""
        return [
            *self._middlewares.values(),
            *(spec.function for spec in self._inbounds.values()),
            *(spec.create_listener_details_from_token for spec in self._outbounds.values()),
            *(
                spec.create_message_from_publish
                for spec in self._outbounds.values()
                if spec.create_message_from_publish is not None
            ),
            *self._enrichers.functions(),
        ]


def _anonymous(criteria: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Anonymous criteria, checked as a middleware's are (without ``__id``: they have none)."""
    if criteria is None:
        return None
    try:
        checked: dict[str, Any] = validate_criteria(criteria, "anonymous")
    except ValueError as error:
        raise ValueError(f"anonymous_criteria: {error}") from None
    del checked[ID_KEY]
    return checked


def _version(field: str, version: Any) -> str:
    if not isinstance(version, str) or not normalise_version(version):
        raise ValueError(f"{field} must be a non-empty string, not {version!r}")
    return normalise_version(version)


def _callable(field: str, function: Any) -> None:
    if not callable(function):
        raise ValueError(f"{field} must be callable, not {type(function).__name__}")
