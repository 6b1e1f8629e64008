"""The commands of Gobbler's WebSocket protocol (``seeds/gobbler.md``), one at a time:

- ``+ path`` subscribes to ``path`` and its subtopics, live (``#subscribed-to path``);
- ``+ path start`` replays ``path``'s history from ``start`` (a sequence; 0: the oldest kept; a
  negative count: the last ones), ``#fetch-start path count`` (exactly the messages that
  follow, those the listener may see) to ``#fetch-done path``, and
  subscribes, live from ``#fetch-done`` on: nothing missed between the two, nothing twice;
- ``+ path start count`` replays at most ``count`` and stops (no subscription); ``start,count``
  is read as ``start count``;
- ``- path`` cancels the subscription (``#canceled path``);
- ``> path [publisherMessageId]``, then optional header lines (one JSON object, or ``Name: value``
  lines ended by an empty line) and the body: published through the outbound's
  ``create_message_from_publish`` with Gobbler's fields (``#send id`` with the sequence, or
  ``!error-send id why`` with none: a refused message has no sequence). The message's name is
  held to a client's rule (:func:`~bow_gateway.core.names.name_error`): no ``__`` or ``$`` name, no
  comma, control, line break or empty level, which could forge what other clients read.

Anything else is ``!error-bad-request``. A replay is filtered by the connection's criteria of now
and written as fast as the client reads it. Replays are bounded: ``recovery.max_replays_per_minute``
per connection and per listener id, and the entries of one fetch at most ``recovery.max_bytes``;
past either, ``!error-bad-request`` says which, and a ``+ path start`` subscribes to nothing. A
fetch is read and filtered before ``#fetch-start`` keeping only the entries it counted (its first
messages encoded), then encoded as it is written: it never holds its frames all at once. Both
passes go in slices that take turns with the event loop and every other replay or recovery
(:class:`~bow_gateway.core.history.Lane`), however many run at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from ...backplanes import Stored
from ...core.history import SLICE_ENTRIES
from ...core.message import MessageEvent, decode_event, dumps
from ...core.topics import parse_filter
from ...wire.frames import websocket_frame
from ..connection import Connection, logger
from ..publishing import PublishRefused
from ..subscriptions import owner, refusal
from ..writer import REPLAY_LOW_WATER

if TYPE_CHECKING:
    from ..hub import Hub

MAX_PATH: Final = 1_000  # characters of a path
ENCODED_FIRST: Final = SLICE_ENTRIES  # a fetch's first messages encoded as they are read,
ENCODED_BYTES: Final = REPLAY_LOW_WATER  # as long as their frames are under this many bytes


def status(kind: str, text: str = "", data: Any = None) -> bytes:
    """A status message: ``#kind text`` (or ``!kind text``), then its JSON data if any."""
    line = f"{kind} {text}" if text else kind
    frame = line.encode() if data is None else line.encode() + b"\n" + dumps(data)
    return websocket_frame(frame)


class BadCommand(ValueError):
    """A command refused as a whole: ``!error-bad-request`` says why."""


class TooBig(BadCommand):
    """A fetch whose entries would be over ``recovery.max_bytes``."""


class Fetch:
    """A fetch under way: what follows ``#fetch-start`` (encoded frames, then the entries to
    encode as they are written), and how many were written."""

    __slots__ = ("items", "sent")

    def __init__(self) -> None:
        self.items: deque[bytes | Stored] = deque()
        self.sent = 0


class Commands:
    """Runs the commands of Gobbler connections over the core (:class:`~..hub.Hub`)."""

    def __init__(self, outbound: Hub, max_publishes_per_second: int = 100) -> None:
        self._outbound = outbound
        self._max_publishes = max_publishes_per_second

    async def run(self, connection: Connection, text: str) -> None:
        first, _, rest = text.partition("\n")
        kind, _, arguments = first.partition(" ")
        try:
            if kind == "+":
                await self._receive(connection, *_receive_arguments(arguments))
            elif kind == "-":
                self._cancel(connection, _path(arguments.strip()))
            elif kind == ">":
                path, _, message_id = arguments.strip().partition(" ")
                await self._send(connection, _sent_path(path), message_id.strip(), rest)
            else:
                raise BadCommand(f"unknown command {kind[:32]!r}")
        except BadCommand as error:
            logger.info("Gobbler connection %s: %s", connection.sid, error)
            self._write(connection, status("!error-bad-request", str(error)))

    def _write(self, connection: Connection, frame: bytes) -> bool:
        return self._outbound.writer.write(connection, frame)

    # -- + and - ---------------------------------------------------------------------------------

    async def _receive(
        self, connection: Connection, path: str, start: int | None, count: int | None
    ) -> None:
        outbound = self._outbound
        topics = outbound.topics[connection.outbound.middleware_version]
        live = count is None
        held = topics.filters_of(connection)
        limit = outbound.settings.max_filters
        if live and _filter(path) not in held:
            if len(held) >= limit:
                raise BadCommand(
                    f"at most {limit} subscriptions per connection (outbound.max_filters)"
                )
            why = refusal(outbound, connection, [_filter(path)])
            if why is not None:
                raise BadCommand(why)
        if start is None:
            topics.add(connection, _filter(path), owner=owner(connection))
            self._write(connection, status("#subscribed-to", path))
            return
        rate = None if outbound.topic_history is None else outbound.topic_history.limit
        if rate is not None and not rate.take(connection):
            text = f"over {rate.per_minute} replays a minute (recovery.max_replays_per_minute)"
            raise BadCommand(text)
        added = live and _filter(path) not in held
        mark = None
        if live:
            # From now on, live messages of the path wait behind the replay; it replays only
            # what this instance had delivered by now (``mark``): the rest comes live.
            topics.add(connection, _filter(path), owner=owner(connection))
            outbound.writer.begin_replay(connection, [])
            mark = outbound.history.last
        fetch = Fetch()
        try:
            await self._fetched(fetch, connection, path, start, count, mark)
            self._send_now(connection, status("#fetch-start", f"{path} {len(fetch.items)}"))
            if not await self._replayed(fetch, connection):
                return
            self._send_now(connection, status("#fetch-done", path))
            if live:
                self._send_now(connection, status("#subscribed-to", path))
        except TooBig as error:
            logger.info("Gobbler connection %s: %s", connection.sid, error)
            if added:
                topics.remove(connection, _filter(path))
            self._send_now(connection, status("!error-bad-request", str(error)))
        except Exception as error:  # noqa: BLE001 - Redis unreachable: the client is told
            logger.warning(
                "Gobbler connection %s: fetch of %r failed: %s", connection.sid, path, error
            )
            self._send_now(
                connection, status("!error-server-internal", "the history cannot be read now")
            )
        finally:
            if live and connection.closing is None:
                await outbound.writer.replay(connection)  # what came live meanwhile, in order
            outbound.metrics.replayed.inc(fetch.sent)

    async def _fetched(
        self,
        fetch: Fetch,
        connection: Connection,
        path: str,
        start: int,
        count: int | None,
        mark: str | None,
    ) -> None:
        """What a fetch replays, read and filtered (criteria of now, age, ``mark``) before
        ``#fetch-start``, whose count must be exactly theirs: what the listener may see, no more.
        The first ones, up to :data:`ENCODED_FIRST` messages and :data:`ENCODED_BYTES`, are
        encoded at once (a small fetch decodes each message once); past them, only the entries
        read are kept (the in-process backplane's own, or the bytes Redis answered: what was
        counted is what follows, whatever leaves the history meanwhile), decoded again as they
        are written. :class:`TooBig` past ``recovery.max_bytes`` of entries."""
        outbound = self._outbound
        history = outbound.topic_history
        if history is None:
            return
        begin, most = await history.span(path, start, count)

        def past_mark(stored: Stored) -> bool:
            return mark is not None and outbound.history.is_after(stored.position, mark)

        items, codec = fetch.items, connection.codec
        size, most_bytes = 0, outbound.history.max_bytes
        encoded = 0  # bytes of the first frames, encoded as they are read

        def take(stored: Stored, event: MessageEvent) -> None:
            nonlocal size, encoded
            size += len(stored.data)
            if size > most_bytes:
                text = f"{path[:64]} {len(items) + 1}+ messages are over "
                raise TooBig(text + f"{most_bytes} bytes (recovery.max_bytes): ask fewer")
            if len(items) < ENCODED_FIRST and encoded < ENCODED_BYTES:
                frame = codec.replayed(event, "")
                encoded += len(frame)
                items.append(frame)
            else:  # the rest: their entries, encoded as they are written
                items.append(stored)

        read = history.replay(outbound, connection, path, begin, most, until=past_mark, take=take)
        async for _ in read:  # each message given to take
            pass

    async def _replayed(self, fetch: Fetch, connection: Connection) -> bool:
        """Write what :meth:`_fetched` kept as fast as the client reads it: the frames encoded
        (all of a small fetch) at once, the entries in slices on the history's lane, each encoded
        as it is written. False when the connection went."""
        items, writer = fetch.items, self._outbound.writer
        while items and isinstance(frame := items[0], bytes):
            await self._room(connection)
            if not self._send_now(connection, frame):
                return False
            items.popleft()
            fetch.sent += 1
        if not items:
            return True
        slices = self._outbound.history.lane.slices()
        await slices.begin()
        try:
            while items:
                if writer.buffered(connection) > REPLAY_LOW_WATER:
                    slices.end()
                    await self._room(connection)
                    await slices.begin()
                item = items.popleft()
                if isinstance(item, Stored):
                    event = decode_event(item.data)
                    assert isinstance(event, MessageEvent), "a message when it was counted"
                    item = connection.codec.replayed(event, "")
                if not self._send_now(connection, item):
                    return False
                fetch.sent += 1
                if slices.due():
                    await slices.pause()
        finally:
            slices.end()
        return True

    def _send_now(self, connection: Connection, frame: bytes) -> bool:
        """Write ahead of what waits behind a replay (the replay's own frames)."""
        transport = connection.transport
        if connection.closing is not None or transport is None or transport.is_closing():
            return False
        transport.write(frame)
        return True

    async def _room(self, connection: Connection) -> None:
        """Wait while the client has not taken what was written to it."""
        while (
            connection.closing is None
            and self._outbound.writer.buffered(connection) > REPLAY_LOW_WATER
        ):
            await asyncio.sleep(0.005)

    def _cancel(self, connection: Connection, path: str) -> None:
        topics = self._outbound.topics[connection.outbound.middleware_version]
        topics.remove(connection, _filter(path))
        self._write(connection, status("#canceled", path))

    # -- > -----------------------------------------------------------------------------------------

    async def _send(self, connection: Connection, path: str, message_id: str, rest: str) -> None:
        outbound = self._outbound
        headers, body = _headers_and_body(rest)
        bucket = connection.publishes
        why = ""
        position = sequence = None
        if bucket is not None and not bucket.take():
            why = f"over {self._max_publishes} sends a second (outbound.max_publishes_per_second)"
        elif outbound.client_publish is None:
            why = "this gateway takes no publish from clients"
        else:
            details = connection.details if connection.listener_id is not None else None
            fields = {
                "headers": headers,
                "user_id": "" if connection.listener_id is None else str(connection.listener_id),
                "application_id": connection.session or "",
                "message_id": message_id,
            }
            extra = {key: value for key, value in fields.items() if value}
            try:
                position, sequence = await outbound.client_publish(
                    connection.outbound, details, path, body, extra=extra
                )
            except PublishRefused as error:
                why = str(error)
        # Gobbler's send notifications: the refusal has no sequence, since nothing was kept.
        data = {
            "path": path,
            "publisherMessageId": message_id,
            "messagePublishingTime": str(int(time.time())),
        }
        outcome = "refused" if why else "accepted"
        outbound.metrics.client_publishes.labels("gobbler", outcome).inc()
        if why:
            logger.info("Gobbler connection %s: send refused: %s", connection.sid, why)
            self._write(connection, status("!error-send", f"{message_id} {why}".strip(), data))
        else:
            assert position is not None
            sent = {"sequenceId": str(sequence or 0), **data}
            self._write(connection, status("#send", message_id, sent))


def _path(text: str) -> str:
    """A path as Gobbler writes it (``/foo/bar``): a message name, not a filter."""
    if not text:
        raise BadCommand("a path is missing")
    if len(text) > MAX_PATH:
        raise BadCommand(f"a path has at most {MAX_PATH} characters")
    if {"+", "#"} & set(text.split("/")) or text.startswith("$") or text.startswith("__"):
        raise BadCommand(f"{text[:64]!r} is not a path a client may use")
    return text


def _sent_path(text: str) -> str:
    """A send's path: there, and bounded. What a message may be named is the one rule of every
    way in (:func:`~bow_gateway.core.names.name_error`, a client's), checked on the name of the
    message the outbound's function makes of it: a refusal is ``!error-send``."""
    if not text:
        raise BadCommand("a path is missing")
    if len(text) > MAX_PATH:
        raise BadCommand(f"a path has at most {MAX_PATH} characters")
    return text


def _filter(path: str) -> str:
    """The path and its subtopics, as an MQTT filter (``#`` matches the parent level too)."""
    text = path.rstrip("/") + "/#" if path != "/" else "/#"
    parse_filter(text)
    return text


def _receive_arguments(arguments: str) -> tuple[str, int | None, int | None]:
    """``path [start [count]]``, spaces or a comma between start and count."""
    parts = arguments.replace(",", " ").split()
    if not parts:
        raise BadCommand("+ takes a path, then optionally a start and a count")
    if len(parts) > 3:
        raise BadCommand("+ takes a path, a start and a count at most")
    path = _path(parts[0])
    try:
        numbers = [int(part) for part in parts[1:]]
    except ValueError:
        raise BadCommand("start and count are integers") from None
    start = numbers[0] if numbers else None
    count = numbers[1] if len(numbers) > 1 else None
    if count is not None and count < 0:
        raise BadCommand("count is 0 or more")
    return path, start, count


def _headers_and_body(rest: str) -> tuple[dict[str, str], str]:
    """A send's headers (a JSON object line, or ``Name: value`` lines ended by an empty line)
    and its body."""
    lines = rest.split("\n")
    if lines and lines[0].startswith("{"):
        try:
            parsed = json.loads(lines[0])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            body = lines[1:]
            if body and body[0] == "":
                body = body[1:]
            return {str(k): str(v) for k, v in parsed.items()}, "\n".join(body)
    if "" in lines:
        end = lines.index("")
        named = [line.partition(":") for line in lines[:end]]
        if end and all(sep and name.strip() for name, sep, _ in named):
            headers = {name.strip(): value.strip() for name, _, value in named}
            return headers, "\n".join(lines[end + 1 :])
        if end == 0:
            return {}, "\n".join(lines[1:])
    return {}, rest
