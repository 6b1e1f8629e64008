"""``bow-gateway serve``: run the gateway (one process or ``--workers``) and print its tour."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
from collections.abc import Sequence

from .. import __version__
from ..app.server import Bow
from ..app.standalone import Settings, build_bow, load_settings
from ..app.standalone_defaults import (
    DEFAULT_INBOUND_PATH,
    DEFAULT_USERNAME,
    DEFAULT_VERSION,
    DEV_INBOUND_PASSWORD,
    DEV_JWT_SECRET,
    JWT_SECRET_ENV,
)
from ..app.workers import run_workers, worker_settings
from ..backplanes import BackplaneUnavailable
from ..core.enrichers import EnricherInitError
from ..outbound.protocols import registered
from ..runtime.config import Config
from ..runtime.logs import configure_logging
from .common import (
    DEFAULT_URL,
    EXAMPLE_AUDIENCE,
    EXAMPLE_CRITERIA,
    EXAMPLE_ID,
    EXAMPLE_PAYLOAD,
    PASSWORD_ENV,
    stop_on_signals,
)

logger = logging.getLogger("bow_gateway.cli")


def serve(args: argparse.Namespace) -> int:
    # From here on serve writes only log records: JSON lines when stderr is not a terminal, its
    # failures included (a bad configuration, a port taken, a crash with its traceback).
    configure_logging()
    try:
        settings = load_settings(args.config, host=args.host, port=args.port)
        if args.workers > 1:
            settings = worker_settings(settings)
        bow = build_bow(settings)
    except ValueError as error:
        logger.error("%s", error)
        return 2
    if args.workers > 1:
        del bow  # each worker builds its own, in its own process
        return run_workers(args.workers, worker, args.config, args.host, args.port, args.workers)
    try:
        return asyncio.run(run_server(bow, settings))
    except Exception:
        logger.critical("the gateway failed", exc_info=True)
        return 1


def worker(number: int, config: str | None, host: str | None, port: int | None, count: int) -> None:
    """One of ``serve --workers`` processes: the same gateway, WebSocket only, the shared port."""
    configure_logging(worker=number)
    settings = worker_settings(load_settings(config, host=host, port=port))
    status = asyncio.run(run_server(build_bow(settings), settings, quiet=number > 0))
    if number == 0 and status == 0:
        logger.info("%d workers stopped", count)
    sys.exit(status)


async def run_server(bow: Bow, settings: Settings, quiet: bool = False) -> int:
    stop = stop_on_signals()
    try:
        await bow.start()
    except ValueError as error:
        logger.error("%s", error)
        return 2
    except OSError as error:
        config = bow.config
        logger.error("cannot listen on %s:%d: %s", config.host, config.port, error.strerror)
        return 1
    except (BackplaneUnavailable, EnricherInitError) as error:
        logger.error("%s", error)
        return 1
    if not quiet:
        print(tour(bow, settings), flush=True)
    await stop.wait()
    logger.info("stopping: closing sockets and draining")
    await bow.stop()
    logger.info("stopped")
    return 0


def tour(bow: Bow, settings: Settings) -> str:
    """What a newcomer needs once the gateway serves: where it is and how to try it."""
    config = bow.config
    scheme = "https" if config.https is not None else "http"
    everywhere = config.host in {"0.0.0.0", "::", ""}
    host = "127.0.0.1" if everywhere else config.host
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{bow.port}"
    password = _inbound_password(settings)
    lines = _serving(config, settings, url, everywhere, password)
    json_inbounds = [i for i in settings.inbounds if i.create_message_from_request_body]
    if not json_inbounds or not settings.outbounds:
        return "\n".join(lines)
    lines += _try_it(config, settings, url, password, json_inbounds[0].path)
    lines.append("Ctrl-C stops the gateway.")
    return "\n".join(lines)


def _inbound_password(settings: Settings) -> str:
    """The inbounds' password as the tour shows it: a variable, the default's, or where."""
    default = settings.source is None
    if "inbound.password" in settings.environment:
        password = f"${PASSWORD_ENV}"
    elif default:
        password = DEV_INBOUND_PASSWORD
    else:
        password = f"<inbound.password in {settings.source}>"
    return password


def _serving(
    config: Config, settings: Settings, url: str, everywhere: bool, password: str
) -> list[str]:
    """Where the gateway serves: its configuration, every inbound and outbound endpoint."""
    default = settings.source is None
    lines = [
        f"bow-gateway {__version__} is serving on {url}"
        + (" (and every other interface)" if everywhere else ""),
        "  configuration: "
        + ("the embedded default (one instance, no Redis)" if default else settings.source or "")
        + (
            f", overridden by {', '.join(sorted(set(settings.environment.values())))}"
            if settings.environment
            else ""
        ),
        "",
    ]
    for inbound in settings.inbounds:
        lines.append(
            f"  push:   POST {url}{inbound.path}  Basic Auth {config.username} / {password}"
            f"  (realm {config.realm!r})"
        )
    ws_url = url.replace("http", "ws", 1)
    for outbound in settings.outbounds:
        lines.append(
            f"  listen: Socket.IO {url}/socket.io/?v={outbound.version}, then emit "
            "'authenticate' with a token"
        )
        for name, protocol in registered().items():
            path = config.endpoint_paths.get(name)
            if path:
                base = ws_url if protocol.websocket else url
                lines.append(
                    f"          {protocol.title} {base}{path}?v={outbound.version}{protocol.how}"
                )
    lines.append(f"  health: GET {url}/health")
    if default and settings.uses_dev_secret:
        lines.append(
            f"  tokens: HS256 JWTs signed with the development secret {DEV_JWT_SECRET!r}"
            f" (set {JWT_SECRET_ENV} to use your own)"
        )
    elif default:
        lines.append(f"  tokens: HS256 JWTs signed with ${JWT_SECRET_ENV}")
    return lines


def _try_it(config: Config, settings: Settings, url: str, password: str, path: str) -> list[str]:
    """Commands to try it with from other terminals: a token, a listener, a push."""
    default = settings.source is None
    version = settings.outbounds[0].version
    target = [] if url == DEFAULT_URL else ["--url", url]
    push = ["bow-gateway", "push", *target]
    if path != DEFAULT_INBOUND_PATH:
        push += ["--path", path]
    if config.username != DEFAULT_USERNAME:
        push += ["--user", config.username]
    curl_password = password
    if not default and "inbound.password" not in settings.environment:
        push += ["--password", "PASSWORD"]
        curl_password = "PASSWORD"
    listen = ["bow-gateway", "listen", *target]
    if version != DEFAULT_VERSION:
        listen += ["--version", version]
    body = json.dumps({"name": "greeting", "audience": [{"role": "admin"}], "text": "hello"})
    credentials = f"{config.username}:{curl_password}"
    lines = [
        "",
        "Try it from another terminal:",
        f"  TOKEN=$(bow-gateway token --id {EXAMPLE_ID} --criteria '{EXAMPLE_CRITERIA}')",
        f'  {_join(listen)} --token "$TOKEN"',
    ]
    if sse_path := config.endpoint_paths.get("sse"):
        events = f"{url}{sse_path}?v={version}"
        lines += [
            "or read the same events as Server-Sent Events, with the same TOKEN:",
            f'  curl -N -H "Authorization: Bearer $TOKEN" {shlex.quote(events)}',
        ]
    lines += [
        "and from a third one:",
        f"  {_join(push)} --name greeting --audience '{EXAMPLE_AUDIENCE}'"
        f" --payload '{EXAMPLE_PAYLOAD}'",
        "  curl -i -u "
        + (f'"{credentials}"' if "$" in credentials else shlex.quote(credentials))
        + f" -H 'Content-Type: application/json' -d {shlex.quote(body)} {url}{path}",
    ]
    if curl_password == "PASSWORD":
        lines.append(f"  (PASSWORD: the inbound.password of {settings.source})")
    if not default:
        lines.append(
            f"  (bow-gateway token signs with ${JWT_SECRET_ENV} or --secret: that fits the"
            " bundled JWT outbound; your own outbound decides what a token is)"
        )
    return lines


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)
