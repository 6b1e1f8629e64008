"""Standalone mode: a ``Bow`` built from a TOML file (or the embedded default) and the environment.

The file holds the section-1 configuration (``port``, ``host``, ``https``, ``redis``,
``namespace``, ``[middleware]``, ``[inbound]``, ``[outbound]``) plus the versioned plugins::

    [[middlewares]]
    version = "v1"
    create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
    options = { claim = "criteria" }      # optional: then attr(**options) makes the function

    [[inbounds]]
    path = "/v1/messages"
    create_message_from_request_body = "my_plugins:message_from_body"
    middleware_version = "v1"

    [[inbounds]]                          # a path with a parameter, the whole request
    path = "/api/message/{topic:.+}"
    create_message_from_request = "bow_gateway.inbounds.gobbler:GobblerInbound"
    options = { audience = [{ role = "admin" }] }
    middleware_version = "v1"

    [[outbounds]]
    version = "v1"
    create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
    options = { secret_env = "BOW_JWT_SECRET" }
    middleware_version = "v1"

    [[enrichers]]                         # optional, any number, applied in this order
    filter = "orders/#"
    enrich = "my_plugins:add_customer"
    init = "my_plugins:connect"           # optional: called once at start

A plugin module is looked up on ``sys.path``, then in the config file's folder. Environment
variables override the file: ``BOW_<KEY>`` for a top-level key, ``BOW_<SECTION>_<KEY>`` for a key
of a section, ``BOW_<KEY>`` for the ``[middleware]`` keys, and ``BOW_REDIS_URL`` for ``redis``
(see :func:`environment_variables`). An empty variable counts as unset.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marshmallow import Schema, fields

from ..core.plugins import (
    EnricherPlugin,
    HealthCheck,
    InboundPlugin,
    MiddlewarePlugin,
    OutboundPlugin,
)
from ..runtime.config import load_config
from ..runtime.config_schema import _ConfigSchema, _HttpsSchema
from .plugin_tables import PLUGIN_KEYS, importable, naming, read_plugins
from .server import Bow
from .standalone_defaults import (
    DEFAULT_HOST,
    DEFAULT_INBOUND_PATH,
    DEFAULT_PORT,
    DEFAULT_USERNAME,
    DEFAULT_VERSION,
    DEV_INBOUND_PASSWORD,
    DEV_JWT_SECRET,
    DOCUMENTED_SECRETS,
    JWT_SECRET_ENV,
)

logger = logging.getLogger("bow_gateway.standalone")


@dataclass(frozen=True)
class Settings:
    """Everything ``build_bow`` needs, and where it came from (for ``bow-gateway serve``)."""

    config: dict[str, Any] = field(repr=False)  # holds the inbound password
    """The section-1 configuration, environment applied, as ``Bow(config)`` takes it."""
    middlewares: tuple[MiddlewarePlugin, ...] = ()
    inbounds: tuple[InboundPlugin, ...] = ()
    outbounds: tuple[OutboundPlugin, ...] = ()
    enrichers: tuple[EnricherPlugin, ...] = ()
    health_check: HealthCheck | None = None
    source: str | None = None
    """The file read, or ``None`` for the embedded default."""
    environment: dict[str, str] = field(default_factory=dict)
    """Dotted setting (``"inbound.password"``) to the variable that set it."""
    uses_dev_secret: bool = False
    """The embedded default checks tokens with :data:`DEV_JWT_SECRET`."""

    def with_address(self, *, host: str | None = None, port: int | None = None) -> Settings:
        """The same settings listening elsewhere (``serve --host/--port``)."""
        config = dict(self.config)
        if host is not None:
            config["host"] = host
        if port is not None:
            config["port"] = port
        return Settings(
            config=config,
            middlewares=self.middlewares,
            inbounds=self.inbounds,
            outbounds=self.outbounds,
            enrichers=self.enrichers,
            health_check=self.health_check,
            source=self.source,
            environment=self.environment,
            uses_dev_secret=self.uses_dev_secret,
        )


def environment_variables() -> dict[str, tuple[str, ...]]:
    """Each variable that overrides a setting, with the key path it sets (from the schema)."""
    names: dict[str, tuple[str, ...]] = {}
    for key, schema_field in _ConfigSchema().fields.items():
        nested: Schema | None = None
        if key == "https":
            nested = _HttpsSchema()
        elif isinstance(schema_field, fields.Nested) and not isinstance(schema_field.nested, str):
            nested = schema_field.schema  # a table, its protocols' paths included
        if key == "redis":
            names["BOW_REDIS_URL"] = (key,)
        elif nested is not None:
            for sub in nested.fields:
                # The [middleware] keys are settings of the whole gateway: BOW_LOG_INTERVAL.
                prefix = "BOW_" if key == "middleware" else f"BOW_{key.upper()}_"
                names[prefix + sub.upper()] = (key, sub)
        elif not isinstance(schema_field, fields.Nested):
            names[f"BOW_{key.upper()}"] = (key,)
    return names


def embedded_default(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The document used without a config file: one instance, no Redis, the bundled plugins."""
    secret = environ.get(JWT_SECRET_ENV) or DEV_JWT_SECRET
    return {
        "port": DEFAULT_PORT,
        "host": DEFAULT_HOST,
        "middleware": {"log_interval": 60},
        "inbound": {
            "realm": "bow-gateway",
            "username": DEFAULT_USERNAME,
            "password": DEV_INBOUND_PASSWORD,
        },
        "outbound": {"timeout": 5},
        "middlewares": [
            {
                "version": DEFAULT_VERSION,
                "create_criteria_from_listener_details": (
                    "bow_gateway.middlewares.claims:criteria_from_claim"
                ),
                "options": {"claim": "criteria"},
            }
        ],
        "inbounds": [
            {
                "path": DEFAULT_INBOUND_PATH,
                "create_message_from_request_body": (
                    "bow_gateway.inbounds.passthrough:create_message_from_request_body"
                ),
                "middleware_version": DEFAULT_VERSION,
            },
            {  # Gobbler's REST publish, to the admins of the tour
                "path": "/api/message/{topic:.+}",
                "create_message_from_request": "bow_gateway.inbounds.gobbler:GobblerInbound",
                "options": {"audience": [{"role": "admin"}]},
                "middleware_version": DEFAULT_VERSION,
            },
        ],
        "history": [{"filter": "/chat/#", "max_count": 1_000, "max_age": 86_400}],
        "outbounds": [
            {
                "version": DEFAULT_VERSION,
                "create_listener_details_from_token": "bow_gateway.outbounds.jwt:JwtOutbound",
                "options": {"algorithms": ["HS256"], "secret": secret},
                "middleware_version": DEFAULT_VERSION,
            }
        ],
    }


def load_settings(
    path: str | None,
    environ: Mapping[str, str] = os.environ,
    *,
    host: str | None = None,
    port: int | None = None,
) -> Settings:
    """Read ``path`` (or take the embedded default when ``None``), apply the environment, then
    ``host`` and ``port`` (``serve --host/--port``), check the whole, resolve the plugins: a file
    may leave to the others what they set. Every problem is a ``ValueError`` naming the file,
    table or variable at fault."""
    if path is None:
        document = embedded_default(environ)
        folder = None
        uses_dev_secret = not environ.get(JWT_SECRET_ENV)
    else:
        try:
            with open(path, "rb") as file:
                document = tomllib.load(file)
        except OSError as error:
            raise ValueError(f"cannot read the config file {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}") from None
        folder = str(Path(path).resolve().parent)
        uses_dev_secret = False
    where = path or "the embedded default"

    config = {key: value for key, value in document.items() if key not in PLUGIN_KEYS}
    config.setdefault("gc_freeze", True)  # the command line owns its process
    environment = _apply_environment(config, environ)
    flags = {"host": host, "port": port}  # over the file and the environment, checked with them
    config.update((key, value) for key, value in flags.items() if value is not None)
    try:
        load_config(config)
    except ValueError as error:
        raise ValueError(f"{where}: {error}{_blame(environment, str(error))}") from None
    _warn_of_documented_secrets(document, config, environment, environ, path)

    try:
        with importable(folder):
            plugins = read_plugins(document)
    except ValueError as error:  # keeps the import's own traceback as the cause
        raise ValueError(f"{where}: {error}") from error.__cause__
    middlewares, inbounds, outbounds, enrichers, health_check = plugins
    if not inbounds and not outbounds:
        raise ValueError(f"{where}: there is no [[inbounds]] and no [[outbounds]] table")
    return Settings(
        config=config,
        middlewares=middlewares,
        inbounds=inbounds,
        outbounds=outbounds,
        enrichers=enrichers,
        health_check=health_check,
        source=path,
        environment=environment,
        uses_dev_secret=uses_dev_secret,
    )


def build_bow(settings: Settings) -> Bow:
    """A ``Bow`` configured and registered as the settings say (not started)."""
    bow = Bow(settings.config)
    for middleware in settings.middlewares:
        with naming(middleware.table):
            bow.middleware(
                version=middleware.version,
                create_criteria_from_listener_details=(
                    middleware.create_criteria_from_listener_details
                ),
            )
    for inbound in settings.inbounds:
        with naming(inbound.table):
            bow.inbound(
                path=inbound.path,
                create_message_from_request_body=inbound.create_message_from_request_body,
                middleware_version=inbound.middleware_version,
                create_message_from_request=inbound.create_message_from_request,
            )
    for outbound in settings.outbounds:
        with naming(outbound.table):
            bow.outbound(
                version=outbound.version,
                create_listener_details_from_token=outbound.create_listener_details_from_token,
                middleware_version=outbound.middleware_version,
                anonymous_criteria=outbound.anonymous_criteria,
                create_message_from_publish=outbound.create_message_from_publish,
            )
    for enricher in settings.enrichers:
        with naming(enricher.table):
            bow.enricher(filter=enricher.filter, enrich=enricher.enrich, init=enricher.init)
    if settings.health_check is not None:
        bow.health_check(settings.health_check)
    return bow


# -- helpers ------------------------------------------------------------------------------------


def _apply_environment(config: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    applied: dict[str, str] = {}
    for variable, keys in environment_variables().items():
        value = environ.get(variable)
        if not value:
            continue
        target = config
        for key in keys[:-1]:
            section = target.get(key)
            target[key] = section = dict(section) if isinstance(section, Mapping) else {}
            target = section
        # A list setting (outbound.transports, .cors_origins) is written comma-separated:
        # "websocket,polling".
        is_list = keys[-1] in ("transports", "cors_origins")
        target[keys[-1]] = value.split(",") if is_list else value
        applied[".".join(keys)] = variable
    return applied


def _warn_of_documented_secrets(
    document: Mapping[str, Any],
    config: Mapping[str, Any],
    environment: Mapping[str, str],
    environ: Mapping[str, str],
    path: str | None,
) -> None:
    """Warn, without quoting the value, of each secret anyone can read in this project (whether
    from the embedded default, a file or the environment): the inbound password, and the secret
    of each ``[[outbounds]]`` table's ``options`` (``secret``, or the variable ``secret_env``)."""
    inbound = config.get("inbound")
    if isinstance(inbound, Mapping) and inbound.get("password") in DOCUMENTED_SECRETS:
        logger.warning(
            "inbound.password (from %s) is a documented default: anyone can push messages "
            "through this gateway. Set BOW_INBOUND_PASSWORD to a secret of your own.",
            environment.get("inbound.password") or path or "the embedded default",
        )
    tables = document.get("outbounds")
    for number, table in enumerate(tables if isinstance(tables, list) else [], start=1):
        options = table.get("options") if isinstance(table, Mapping) else None
        if not isinstance(options, Mapping):
            continue
        variable = options.get("secret_env") if options.get("secret") is None else None
        secret = environ.get(str(variable)) if variable else options.get("secret")
        if secret not in DOCUMENTED_SECRETS:
            continue
        if variable or path is not None:
            source = f"${variable}" if variable else path
        elif environ.get(JWT_SECRET_ENV):
            source = f"${JWT_SECRET_ENV}"
        else:
            source = f"the embedded default: {JWT_SECRET_ENV} is not set"
        logger.warning(
            "[[outbounds]] #%d checks tokens with a documented default secret (%s): anyone can "
            "sign a token for any listener. Set %s to a secret of your own.",
            number,
            source,
            variable or JWT_SECRET_ENV,
        )


def _blame(environment: Mapping[str, str], message: str) -> str:
    named = [
        f"{setting} is set by {variable}"
        for setting, variable in environment.items()
        if f"{setting}:" in message
    ]
    return f" ({'; '.join(named)})" if named else ""
