"""``bow-gateway``: serve a gateway, and try one out (mint a token, listen, push)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import shlex
import signal
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import aiohttp
import socketio

from . import __version__
from .backplanes import BackplaneUnavailable
from .job.command import add_arguments as add_criteria_job_arguments
from .job.command import run_command as run_criteria_job
from .logs import configure_logging
from .server import Bow
from .standalone import (
    CONFIG_ENV,
    DEFAULT_INBOUND_PATH,
    DEFAULT_PORT,
    DEFAULT_USERNAME,
    DEFAULT_VERSION,
    DEV_INBOUND_PASSWORD,
    DEV_JWT_SECRET,
    JWT_SECRET_ENV,
    Settings,
    build_bow,
    environment_variables,
    load_settings,
)
from .workers import run_workers, worker_settings

logger = logging.getLogger("bow_gateway.cli")

DEFAULT_URL: Final = f"http://127.0.0.1:{DEFAULT_PORT}"
PASSWORD_ENV: Final = "BOW_INBOUND_PASSWORD"
EXAMPLE_ID: Final = "USER/1"
EXAMPLE_CRITERIA: Final = '{"role": "admin"}'
EXAMPLE_AUDIENCE: Final = '[{"role": "admin"}]'
EXAMPLE_PAYLOAD: Final = '{"text": "hello"}'


class UsageError(Exception):
    """A bad argument: reported on stderr, exit status 2."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


OPTIONAL_PARTS: Final = {
    "pyspark": "spark",
    "py4j": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "asyncpg": "postgres",
}
"""Packages of the extras, and the extra that installs each."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``bow-gateway`` command line; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or argparse's own usage error
        return exit_.code if isinstance(exit_.code, int) else 0
    command: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return command(args)
    except UsageError as error:
        print(f"bow-gateway {args.command}: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        extra = OPTIONAL_PARTS.get(package)
        if extra is None:
            raise
        print(
            f"bow-gateway {args.command}: {package} is not installed: "
            f"pip install 'bow-gateway[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


# -- serve --------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    # From here on serve writes only log records: JSON lines when stderr is not a terminal, its
    # failures included (a bad configuration, a port taken, a crash with its traceback).
    configure_logging()
    try:
        settings = load_settings(args.config).with_address(host=args.host, port=args.port)
        if args.workers > 1:
            settings = worker_settings(settings)
        bow = build_bow(settings)
    except ValueError as error:
        logger.error("%s", error)
        return 2
    if args.workers > 1:
        del bow  # each worker builds its own, in its own process
        return run_workers(args.workers, _worker, args.config, args.host, args.port, args.workers)
    try:
        return asyncio.run(_run_server(bow, settings))
    except Exception:
        logger.critical("the gateway failed", exc_info=True)
        return 1


def _worker(
    number: int, config: str | None, host: str | None, port: int | None, count: int
) -> None:
    """One of ``serve --workers`` processes: the same gateway, WebSocket only, the shared port."""
    configure_logging(worker=number)
    settings = worker_settings(load_settings(config).with_address(host=host, port=port))
    status = asyncio.run(_run_server(build_bow(settings), settings, quiet=number > 0))
    if number == 0 and status == 0:
        logger.info("%d workers stopped", count)
    sys.exit(status)


async def _run_server(bow: Bow, settings: Settings, quiet: bool = False) -> int:
    stop = _stop_on_signals()
    try:
        await bow.start()
    except ValueError as error:
        logger.error("%s", error)
        return 2
    except OSError as error:
        config = bow.config
        logger.error("cannot listen on %s:%d: %s", config.host, config.port, error.strerror)
        return 1
    except BackplaneUnavailable as error:
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
    if "inbound.password" in settings.environment:
        password = f"${PASSWORD_ENV}"
    elif default:
        password = DEV_INBOUND_PASSWORD
    else:
        password = f"<inbound.password in {settings.source}>"
    for inbound in settings.inbounds:
        lines.append(
            f"  push:   POST {url}{inbound.path}  Basic Auth {config.username} / {password}"
            f"  (realm {config.realm!r})"
        )
    for outbound in settings.outbounds:
        lines.append(
            f"  listen: Socket.IO {url}/socket.io/?v={outbound.version}, then emit "
            "'authenticate' with a token"
        )
    lines.append(f"  health: GET {url}/health")
    if default and settings.uses_dev_secret:
        lines.append(
            f"  tokens: HS256 JWTs signed with the development secret {DEV_JWT_SECRET!r}"
            f" (set {JWT_SECRET_ENV} to use your own)"
        )
    elif default:
        lines.append(f"  tokens: HS256 JWTs signed with ${JWT_SECRET_ENV}")
    if not settings.inbounds or not settings.outbounds:
        return "\n".join(lines)

    path = settings.inbounds[0].path
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
    lines += [
        "",
        "Try it from another terminal:",
        f"  TOKEN=$(bow-gateway token --id {EXAMPLE_ID} --criteria '{EXAMPLE_CRITERIA}')",
        f'  {_join(listen)} --token "$TOKEN"',
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
    lines.append("Ctrl-C stops the gateway.")
    return "\n".join(lines)


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


# -- token --------------------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> int:
    criteria = _json_object(args.criteria, "--criteria") if args.criteria is not None else {}
    if args.ttl <= 0:
        raise UsageError("--ttl must be a positive number of seconds")
    print(_mint(args.id, _secret(args.secret), criteria, ttl=args.ttl))
    return 0


def _mint(listener_id: str, secret: str, criteria: Mapping[str, Any], ttl: float = 3600) -> str:
    """``bow_gateway.outbounds.jwt.mint``, imported by name: mypy sees the bundled plugins as the
    top-level packages of the repository, not under ``bow_gateway``."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    token: str = jwt_outbound.mint(listener_id, secret, criteria=criteria, ttl=ttl)
    return token


def _secret(given: str | None) -> str:
    """The HS256 secret to sign with: ``--secret``, else ``$BOW_JWT_SECRET``, else the development
    one. One too short to be safe (RFC 7518) is a usage error: the gateway would refuse it."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    secret = given or os.environ.get(JWT_SECRET_ENV)
    if secret:
        try:
            jwt_outbound.check_secret(secret, source="--secret" if given else f"${JWT_SECRET_ENV}")
        except ValueError as error:
            raise UsageError(str(error)) from None
        return secret
    print(
        f"bow-gateway: signing with the development secret ({JWT_SECRET_ENV} is not set)",
        file=sys.stderr,
    )
    return DEV_JWT_SECRET


# -- push ---------------------------------------------------------------------------------------


def _push(args: argparse.Namespace) -> int:
    audience = _json(args.audience, "--audience")
    body: dict[str, Any] = {"name": args.name, "audience": audience}
    if args.payload is not None:
        payload = _json(args.payload, "--payload")
        if args.envelope:
            body["payload"] = payload
        elif not isinstance(payload, dict):
            raise UsageError(
                "--payload must be a JSON object: the pass-through inbound sends the body itself "
                "as the payload (use --envelope to send {name, audience, payload})"
            )
        elif {"name", "audience"} & payload.keys():
            raise UsageError("--payload must not set 'name' or 'audience': use --name, --audience")
        else:
            body.update(payload)
    password = args.password or os.environ.get(PASSWORD_ENV) or DEV_INBOUND_PASSWORD
    return asyncio.run(_post(args.url.rstrip("/") + args.path, args.user, password, body))


async def _post(url: str, user: str, password: str, body: Any) -> int:
    headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.post(url, json=body, headers=headers) as response,
        ):
            text = (await response.text()).strip()
    except (aiohttp.ClientError, TimeoutError) as error:
        print(
            f"bow-gateway push: cannot reach {url}: {error or type(error).__name__}",
            file=sys.stderr,
        )
        return 1
    status = f"{response.status} {response.reason}"
    if response.status == 204:
        print(f"{status}: accepted")
        return 0
    print(f"bow-gateway push: {status}" + (f": {text}" if text else ""), file=sys.stderr)
    return 1


# -- listen -------------------------------------------------------------------------------------


def _listen(args: argparse.Namespace) -> int:
    if args.token is not None:
        if args.id is not None or args.criteria is not None:
            raise UsageError("give --token, or --id (and --criteria), not both")
        token = args.token
    elif args.id is not None:
        criteria = _json_object(args.criteria, "--criteria") if args.criteria else {}
        token = _mint(args.id, _secret(args.secret), criteria)
    else:
        raise UsageError("give --token TOKEN, or --id ID [--criteria JSON] to mint one")
    return asyncio.run(_run_listener(args.url.rstrip("/"), args.version, token))


async def _run_listener(url: str, version: str, token: str) -> int:
    """Listen until Ctrl-C/SIGTERM (0) or a refusal or disconnection (1), over an HTTP session of
    our own, closed whatever ended it: engineio closes its own only when the client disconnects,
    not when the server does, and the interpreter then warns of an unclosed session."""
    async with aiohttp.ClientSession() as session:
        return await _listen_with(session, url, version, token)


async def _listen_with(session: aiohttp.ClientSession, url: str, version: str, token: str) -> int:
    stop = _stop_on_signals()
    # handle_sigint=False: python-socketio would otherwise take SIGINT to disconnect by itself.
    client = socketio.AsyncClient(reconnection=False, handle_sigint=False, http_session=session)
    refusal: list[str] = []
    authenticated = asyncio.Event()
    ended = asyncio.Event()

    async def on_event(event: str, *data: Any) -> None:
        line: dict[str, Any] = {"event": event}
        if data:
            line["data"] = data[0] if len(data) == 1 else list(data)
        print(json.dumps(line, ensure_ascii=False), flush=True)

    async def on_alert(*data: Any) -> None:
        message = data[0] if len(data) == 1 else list(data)
        refusal.append(str(message))
        print(f"alert: {message}", file=sys.stderr, flush=True)

    async def on_connect_error(*data: Any) -> None:
        # The gateway's reason comes as {"message": ...}: print the reason, not the dict.
        refusal.extend(
            str(item["message"]) if isinstance(item, dict) and "message" in item else str(item)
            for item in data
        )

    async def on_disconnect(*reason: Any) -> None:
        ended.set()

    client.on("*", on_event)
    client.on("alert", on_alert)
    client.on("connect_error", on_connect_error)
    client.on("disconnect", on_disconnect)

    address = f"{url}?v={version}"
    try:
        await client.connect(address, transports=["websocket"], wait_timeout=10)
    except socketio.exceptions.ConnectionError as error:
        reason = "; ".join(refusal) or str(error)
        print(f"bow-gateway listen: {address} refused the connection: {reason}", file=sys.stderr)
        return 1
    try:
        await client.emit("authenticate", token, callback=lambda *_: authenticated.set())
        if await _first(authenticated, ended, stop, timeout=30) is not authenticated:
            if stop.is_set():
                return 0
            reason = "; ".join(refusal) or "no answer to 'authenticate'"
            print(f"bow-gateway listen: authentication refused: {reason}", file=sys.stderr)
            return 1
        print(
            f"listening on {address}; events appear below as JSON lines (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        if await _first(ended, stop) is stop:
            return 0
        print("bow-gateway listen: disconnected by the server", file=sys.stderr)
        return 1
    finally:
        if client.connected:
            await client.disconnect()


async def _first(*events: asyncio.Event, timeout: float | None = None) -> asyncio.Event | None:
    """The first of ``events`` to be set (checked in order), or ``None`` on timeout."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next((event for event in events if event.is_set()), None)


# -- shared -------------------------------------------------------------------------------------


def _stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM; a second one interrupts for good."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def handle() -> None:
        stop.set()
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)

    for number in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(number, handle)
        except (NotImplementedError, RuntimeError):  # not on this platform or thread
            pass
    return stop


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{option} is not valid JSON ({error}): {text}") from None


def _json_object(text: str, option: str) -> dict[str, Any]:
    value = _json(text, option)
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, like {EXAMPLE_CRITERIA}: {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bow-gateway",
        formatter_class=_Formatter,
        description="A real-time push gateway: backends POST messages with an audience,\n"
        "Socket.IO listeners authenticate with a token, and each message reaches exactly\n"
        "the listeners whose criteria match its audience.",
        epilog="A five-minute tour: run `bow-gateway serve` and follow what it prints.\n"
        "`bow-gateway COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"bow-gateway {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the gateway (from a TOML file, or the embedded default)",
        formatter_class=_Formatter,
        description="Run the gateway until SIGINT (Ctrl-C) or SIGTERM, then stop gracefully.\n\n"
        "Without --config it starts on the embedded default: one instance, no Redis,\n"
        f"127.0.0.1:{DEFAULT_PORT}; inbound POST {DEFAULT_INBOUND_PATH} with Basic Auth "
        f"{DEFAULT_USERNAME} / ${PASSWORD_ENV}\n"
        f"(else {DEV_INBOUND_PASSWORD!r}); outbound {DEFAULT_VERSION} taking HS256 JWTs signed "
        f"with ${JWT_SECRET_ENV}\n"
        f"(else the development secret {DEV_JWT_SECRET!r});\n"
        "criteria from the token's 'criteria' claim.",
        epilog="Environment: every setting can come from a variable, which overrides the file:\n"
        + textwrap.fill(
            " ".join(environment_variables()), 88, initial_indent="  ", subsequent_indent="  "
        )
        + "\n"
        f"  {CONFIG_ENV} (the config file)   {JWT_SECRET_ENV} (the embedded default's secret)\n"
        "An annotated config file: deploy/gateway.example.toml in the repository.\n"
        "Exit status: 0 once stopped, 2 for a bad configuration, 1 if it cannot listen.",
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(CONFIG_ENV) or None,
        help=f"a TOML config file (default: ${CONFIG_ENV}, else the embedded default)",
    )
    serve.add_argument("--host", metavar="H", help="listen on this address (overrides all)")
    serve.add_argument(
        "--port", metavar="P", type=_port, help="listen on this port, 0 = any (overrides all)"
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        type=_positive_int,
        default=1,
        help="run N processes sharing the port, one gateway through Redis (WebSocket only)",
    )
    serve.set_defaults(run=_serve)

    token = commands.add_parser(
        "token",
        help="print a signed JWT for a listener",
        formatter_class=_Formatter,
        description="Print an HS256 JWT whose 'sub' claim is the listener id and whose 'criteria'\n"
        "claim holds the criteria: what the embedded default's outbound takes.",
        epilog="Example:\n"
        f"  TOKEN=$(bow-gateway token --id {EXAMPLE_ID} --criteria '{EXAMPLE_CRITERIA}')",
    )
    token.add_argument("--id", required=True, help="the listener id (the 'sub' claim)")
    token.add_argument(
        "--criteria",
        metavar="JSON",
        help=f"a JSON object, like '{EXAMPLE_CRITERIA}' (default: {{}})",
    )
    _secret_option(token)
    token.add_argument(
        "--ttl", type=float, default=3600, metavar="SECONDS", help="lifetime (default: 3600)"
    )
    token.set_defaults(run=_token)

    listen = commands.add_parser(
        "listen",
        help="connect as a listener and print the events it receives",
        formatter_class=_Formatter,
        description="Connect with Socket.IO, authenticate, then print one JSON line per event\n"
        '({"event": NAME, "data": PAYLOAD}) on stdout; alerts and disconnection go to stderr.\n'
        "Runs until Ctrl-C or SIGTERM (exit 0); exit 1 if refused or disconnected.",
        epilog="Examples:\n"
        '  bow-gateway listen --token "$TOKEN"\n'
        f"  bow-gateway listen --id {EXAMPLE_ID} --criteria '{EXAMPLE_CRITERIA}'",
    )
    _url_option(listen)
    listen.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        help=f"the outbound version, the handshake's v (default: {DEFAULT_VERSION})",
    )
    listen.add_argument("--token", help="the token to authenticate with")
    listen.add_argument("--id", help="instead of --token: mint a token for this listener id")
    listen.add_argument("--criteria", metavar="JSON", help="with --id: the token's criteria")
    _secret_option(listen, "with --id: ")
    listen.set_defaults(run=_listen)

    push = commands.add_parser(
        "push",
        help="POST a message to an inbound",
        formatter_class=_Formatter,
        description='POST {"name": NAME, "audience": AUDIENCE, ...PAYLOAD\'s keys} to an\n'
        "inbound: with the pass-through inbound the body is the payload. Prints the status;\n"
        "exit 0 when accepted (204), 1 otherwise.",
        epilog="Example:\n"
        f"  bow-gateway push --name greeting --audience '{EXAMPLE_AUDIENCE}'"
        f" --payload '{EXAMPLE_PAYLOAD}'",
    )
    _url_option(push)
    push.add_argument(
        "--path",
        default=DEFAULT_INBOUND_PATH,
        help=f"the inbound's path (default: {DEFAULT_INBOUND_PATH})",
    )
    push.add_argument(
        "--user", default=DEFAULT_USERNAME, help=f"Basic Auth user (default: {DEFAULT_USERNAME})"
    )
    push.add_argument(
        "--password",
        help=f"Basic Auth password (default: ${PASSWORD_ENV}, else {DEV_INBOUND_PASSWORD})",
    )
    push.add_argument("--name", required=True, help="the event name listeners receive")
    push.add_argument(
        "--audience",
        required=True,
        metavar="JSON",
        help=f"a JSON list of queries, like '{EXAMPLE_AUDIENCE}'",
    )
    push.add_argument("--payload", metavar="JSON", help=f"a JSON object, like '{EXAMPLE_PAYLOAD}'")
    push.add_argument(
        "--envelope",
        action="store_true",
        help='send {"name", "audience", "payload"} instead (for an envelope inbound)',
    )
    push.set_defaults(run=_push)

    criteria_job = commands.add_parser(
        "criteria-job",
        help="precompute every listener's criteria with Spark into Redis",
        formatter_class=_Formatter,
        description="Run the Spark SQL query of a job file over its inputs (JDBC, Parquet, CSV,\n"
        "JSON) and write each listener's criteria to Redis as a new snapshot, which goes live\n"
        "at once for every instance using the precomputed-criteria middleware.\n"
        "Needs pyspark (pip install 'bow-gateway[spark]') and Java 17+.",
        epilog="Example: bow-gateway criteria-job --config deploy/criteria-job.example.toml\n"
        "Exit status: 0 done, 1 the run failed (the live snapshot is untouched), 2 bad config.",
    )
    add_criteria_job_arguments(criteria_job)
    criteria_job.set_defaults(run=run_criteria_job)
    return parser


def _url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"the gateway's address (default: {DEFAULT_URL})"
    )


def _secret_option(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--secret",
        help=f"{prefix}the HS256 secret (default: ${JWT_SECRET_ENV}, else the development secret)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return port
