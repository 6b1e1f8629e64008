"""The ``bow-gateway`` command line's parser: every command, its help and its options; each
command's function is imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import os
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..app import standalone_defaults as defaults
from ..app.standalone_defaults import CONFIG_ENV, DEFAULT_VERSION, JWT_SECRET_ENV
from ..job.command import add_arguments as add_criteria_job_arguments
from . import common
from .common import (
    EXAMPLE_AUDIENCE,
    EXAMPLE_CRITERIA,
    EXAMPLE_ID,
    EXAMPLE_PAYLOAD,
    positive_int,
)
from .history import add_arguments as add_history_arguments
from .listening import DEFAULT_PATHS, PROTOCOLS
from .push import add_arguments as add_push_arguments


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog can be made when its help is printed (``epilog_of``): serve's
    lists the settings' variables, read off the gateway's configuration schema."""

    def __init__(
        self, *args: Any, epilog_of: Callable[[], str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.epilog_of = epilog_of

    def format_help(self) -> str:
        if self.epilog_of is not None:
            self.epilog = self.epilog_of()
        return super().format_help()


def _later(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``module``, imported when it runs: a command imports only what it
    needs (``criteria-job`` starts without the gateway's server, ``token`` without aiohttp)."""

    def run(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int]
        command = getattr(importlib.import_module(module, __package__), name)
        return command(args)

    return run


if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[_Parser]  # where the commands are added


def build_parser() -> argparse.ArgumentParser:
    """The ``bow-gateway`` command line's parser."""
    parser = _Parser(
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

    for add in (_add_serve, _add_token, _add_listen, _add_push, _add_history, _add_criteria_job):
        add(commands)
    return parser


def _add_serve(commands: Commands) -> None:
    """``serve``."""
    serve = commands.add_parser(
        "serve",
        help="run the gateway (from a TOML file, or the embedded default)",
        formatter_class=_Formatter,
        description="Run the gateway until SIGINT (Ctrl-C) or SIGTERM, then stop gracefully.\n\n"
        "Without --config it starts on the embedded default: one instance, no Redis,\n"
        f"127.0.0.1:{defaults.DEFAULT_PORT}; inbound POST {defaults.DEFAULT_INBOUND_PATH}"
        f" with Basic Auth {defaults.DEFAULT_USERNAME} / ${common.PASSWORD_ENV}\n"
        f"(else {defaults.DEV_INBOUND_PASSWORD!r}); outbound {DEFAULT_VERSION}"
        f" taking HS256 JWTs signed with ${JWT_SECRET_ENV}\n"
        f"(else the development secret {defaults.DEV_JWT_SECRET!r});\n"
        "criteria from the token's 'criteria' claim.",
        epilog_of=_serve_epilog,
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
        type=positive_int,
        default=1,
        help="run N processes sharing the port, one gateway through Redis (WebSocket only)",
    )
    serve.set_defaults(run=_later(".serve", "serve"))


def _add_token(commands: Commands) -> None:
    """``token``."""
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
        "--ttl",
        type=float,
        default=3600,
        metavar="SECONDS",
        help="the token's lifetime: its exp claim is now + SECONDS, whole seconds; protocol-2 "
        "sockets are asked to re-authenticate then (default: 3600)",
    )
    token.set_defaults(run=_later(".clients", "token"))


def _add_listen(commands: Commands) -> None:
    """``listen``."""
    listen = commands.add_parser(
        "listen",
        help="connect as a listener and print the events it receives",
        formatter_class=_Formatter,
        description="Connect with Socket.IO, authenticate, then print one JSON line per event\n"
        '({"event": NAME, "data": PAYLOAD}) on stdout; alerts and disconnection go to stderr.\n'
        "Runs until Ctrl-C or SIGTERM (exit 0); exit 1 if refused or disconnected.\n\n"
        'With --proto 2 (docs/protocol-2.md) each line also has the event\'s "position" and\n'
        '"replayed"; __position and __gap arrive as lines too; the acknowledgement\'s result and\n'
        "alerts with their code go to stderr, and the last position when it stops. Asked to\n"
        "re-authenticate (4100), it does so with a fresh token if it minted the first (--id).\n"
        "--topic subscribes to topic filters (MQTT syntax) before authenticating.\n\n"
        "--protocol flywheel (docs/flywheel.md): a plain WebSocket to {url}/broker; binds with\n"
        "the token, a random sessionId and the --topic filters (default: '#', every name),\n"
        "prints each R frame as a line (a JSON body as its value, another as a string), the\n"
        "bind's errors and the close code on stderr; on 4100 it re-binds as --proto 2 does;\n"
        "closed with 4012 (the gateway stops), it connects and binds again, for up to 30 s.\n\n"
        "--protocol sse (docs/sse.md): reads GET {url}/events with Authorization: Bearer; each\n"
        'line has the event\'s id as "position"; --since sends Last-Event-ID. When the stream\n'
        "ends without an alert, or with 4012 (the gateway stops), it resumes after the last id,\n"
        "as EventSource does, for up to 30 s; another alert ends it (exit 1), but token_expired\n"
        "with --id reopens with a fresh token. Once stdout is closed (| head) it exits quietly.",
        epilog="Examples:\n"
        '  bow-gateway listen --token "$TOKEN"\n'
        f"  bow-gateway listen --id {EXAMPLE_ID} --criteria '{EXAMPLE_CRITERIA}'\n"
        f"  bow-gateway listen --proto 2 --id {EXAMPLE_ID} --ttl 60 --since POSITION\n"
        "  bow-gateway listen --protocol flywheel --topic 'quotes/#' --token \"$TOKEN\"\n"
        "  bow-gateway listen --protocol sse --topic 'news/+' --token \"$TOKEN\"",
    )
    _listen_arguments(listen)


def _listen_arguments(listen: argparse.ArgumentParser) -> None:
    """``listen``'s options."""
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
    listen.add_argument(
        "--ttl",
        type=float,
        metavar="SECONDS",
        help="with --id: the minted tokens' lifetime, their exp = now + SECONDS (default: 3600)",
    )
    listen.add_argument(
        "--proto",
        choices=["1", "2"],
        help="the handshake's proto: 2 opts in to protocol 2 (default: not sent, protocol 1)",
    )
    listen.add_argument(
        "--since",
        metavar="POSITION",
        help="with --proto 2 or sse: ask for the messages missed after this position",
    )
    listen.add_argument(
        "--anonymous",
        action="store_true",
        help="with --proto 2, flywheel or sse: no token (the outbound's anonymous_criteria)",
    )
    listen.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="socketio",
        help="how to connect: Socket.IO, a Flywheel WebSocket or Server-Sent Events "
        "(default: socketio)",
    )
    listen.add_argument(
        "--topic",
        action="append",
        metavar="FILTER",
        help="a topic filter, like 'quotes/#' (repeatable; Socket.IO: with --proto 2)",
    )
    listen.add_argument(
        "--path",
        help="the Flywheel or SSE endpoint's path (default: "
        + ", ".join(f"{path} for {name}" for name, path in DEFAULT_PATHS.items())
        + ")",
    )
    listen.set_defaults(run=_later(".listen", "listen"))


def _add_push(commands: Commands) -> None:
    """``push``."""
    push = commands.add_parser(
        "push",
        help="POST a message, a Gobbler REST publish or a file of batches to an inbound",
        formatter_class=_Formatter,
        description='POST {"name": NAME, "audience": AUDIENCE, ...PAYLOAD\'s keys} to an\n'
        "inbound: with the pass-through inbound the body is the payload. Or, with --topic,\n"
        "a raw text body to PATH/TOPIC (Gobbler's REST publish); or, with --batch, a JSON-lines\n"
        "file as JSON lists of messages. Prints each status; exit 0 when all is accepted (204),\n"
        "1 otherwise.",
        epilog="Examples:\n"
        f"  bow-gateway push --name greeting --audience '{EXAMPLE_AUDIENCE}'"
        f" --payload '{EXAMPLE_PAYLOAD}'\n"
        "  bow-gateway push --topic chat/room1 --body hello --header Key=Value --user-id marvin\n"
        "  bow-gateway push --batch messages.jsonl --batch-size 500",
    )
    _url_option(push)
    add_push_arguments(push)
    push.set_defaults(run=_later(".push", "push"))


def _add_history(commands: Commands) -> None:
    """``history``."""
    history = commands.add_parser(
        "history",
        help="print a topic's kept messages as a listener may see them",
        formatter_class=_Formatter,
        description="Connect with Socket.IO protocol 2 as a listener, ask for a topic's history\n"
        '(replay, docs/history.md) and print one JSON line per message ({"event", "data",\n'
        '"sequence"}): only those the listener\'s criteria match now. Exit 0, 1 if refused.',
        epilog="Examples:\n"
        '  bow-gateway history /chat/room1 --last 20 --token "$TOKEN"\n'
        "  bow-gateway history /chat/room1 --from 42 --id marvin --criteria '{\"room\": 1}'",
    )
    _url_option(history)
    add_history_arguments(history)
    history.set_defaults(run=_later(".history", "history"))


def _add_criteria_job(commands: Commands) -> None:
    """``criteria-job``."""
    criteria_job = commands.add_parser(
        "criteria-job",
        help="precompute every listener's criteria with Spark into Redis",
        formatter_class=_Formatter,
        description="Run the Spark SQL query of a job file over its inputs (JDBC, Parquet, CSV,\n"
        "JSON) and write each listener's criteria to Redis as a new snapshot, which goes live\n"
        "at once for every instance using the precomputed-criteria middleware.\n"
        "Needs the spark extra (pip install -e '.[spark]' in a clone) and Java 17+.",
        epilog="Example: bow-gateway criteria-job --config deploy/criteria-job.example.toml\n"
        "Exit status: 0 done, 1 the run failed (the live snapshot is untouched), 2 bad config,\n"
        f"{common.MISSING_PART} pyspark (the spark extra) is not installed.",
    )
    add_criteria_job_arguments(criteria_job)
    criteria_job.set_defaults(run=_later("..job.command", "run_command"))


def _serve_epilog() -> str:
    from ..app.standalone import environment_variables

    return (
        "Environment: every setting can come from a variable, which overrides the file:\n"
        + textwrap.fill(
            " ".join(environment_variables()), 88, initial_indent="  ", subsequent_indent="  "
        )
        + "\n"
        f"  {CONFIG_ENV} (the config file)   {JWT_SECRET_ENV} (the embedded default's secret)\n"
        "An annotated config file: deploy/gateway.example.toml in the repository.\n"
        "Exit status: 0 once stopped, 2 for a bad configuration, 1 if it cannot listen."
    )


def _url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=common.DEFAULT_URL,
        help=f"the gateway's address (default: {common.DEFAULT_URL})",
    )


def _secret_option(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--secret",
        help=f"{prefix}the HS256 secret (default: ${JWT_SECRET_ENV}, else the development secret)",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return port
