"""Flywheel's bind (``B {json}``): authentication, session id, subscriptions, and its
``BindResponse``.

A bind's ``auth`` authenticates or re-authenticates under section 8's rules (refresh, anonymous to
id upgrade, 4004 on another id; a refusal answers the bind with a ``General`` error, then closes
with its code). Without ``auth``, a connection is anonymous when its outbound has
``anonymous_criteria``; otherwise every filter it asks for is refused (``TopicAccess``) until it
authenticates. A ``sessionId`` is then bound, unless another identity holds it on any instance,
or the backplane cannot say (a ``General`` error): ``$remote/{sessionId}/rx/...`` reaches its own
listener only. Filters are MQTT's; ``$`` names are the gateway's and refused (``TopicAccess``).
Binds run one at a time, in arrival order (the endpoint reads the next frame once one is done).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ...backplanes.base import BackplaneUnavailable
from ...core import codes
from ...core.message import dumps, parse_json
from ...core.publication import forbidden_character
from ...core.topics import SYSTEM_PREFIX, parse_filter
from ...wire.frames import websocket_frame
from ..connection import Connection, logger
from ..expiry import Refusal
from ..subscriptions import owner, refusal

if TYPE_CHECKING:
    from ..hub import Hub

NO_MESSAGE_ID: Final = "00000000-0000-0000-0000-000000000000"
MAX_SESSION_ID: Final = 128  # characters of a sessionId: it is a topic level of $remote names
KEYS: Final = frozenset({"sessionId", "auth", "subscribe", "unsubscribe", "metadata", "messageId"})

Error = dict[str, str]


def general(description: str) -> Error:
    return {"type": "General", "description": description}


def topic_access(description: str, topic: str) -> Error:
    return {"type": "TopicAccess", "description": description, "topic": topic}


def error_frame(connection: Connection, description: str, topic: str) -> bytes:
    """``R $remote/{sessionId or anon}/rx/errors [TopicAccess]``: a publish refused."""
    errors = [topic_access(description, topic)]
    name = f"$remote/{connection.session or 'anon'}/rx/errors"
    return websocket_frame(b"R " + name.encode() + b" " + dumps(errors))


class Binder:
    """Applies the binds of Flywheel connections to the outbound's core."""

    def __init__(self, outbound: Hub) -> None:
        self._outbound = outbound

    async def bind(self, connection: Connection, text: str) -> None:
        """Apply one bind, as much of it as is valid, and answer it with a ``BindResponse``."""
        errors: list[Error] = []
        try:
            request = parse_json(text.encode())
        except ValueError as error:
            request, errors = {}, [general(f"the bind is not JSON: {error}")]
        if not isinstance(request, Mapping):
            request, errors = {}, [general("a bind is a JSON object")]
        message_id = request.get("messageId", NO_MESSAGE_ID)
        if not isinstance(message_id, str):
            errors.append(general("messageId must be a string"))
            message_id = NO_MESSAGE_ID
        unknown = sorted(str(key)[:32] for key in request if key not in KEYS)
        if unknown:
            errors.append(general(f"unknown field {unknown[0]!r}"))
        if "metadata" in request and not isinstance(request["metadata"], Mapping):
            errors.append(general("metadata must be an object"))
        if "auth" in request:
            admitted = await self._authenticate(connection, request["auth"], errors)
        elif not connection.authenticated and connection.outbound.anonymous_criteria is not None:
            admitted = await self._admit(connection, None, errors)
        else:
            admitted = True
        if not admitted:
            self._respond(connection, errors, message_id)
            return  # refused: the connection is being closed
        # After auth: a session id belongs to the identity that holds it, known only now.
        await self._session(connection, request.get("sessionId"), errors)
        self._subscriptions(connection, request, errors)
        self._respond(connection, errors, message_id)

    def _respond(self, connection: Connection, errors: list[Error], message_id: str) -> None:
        response = {"type": "BindResponse", "errors": errors, "messageId": message_id}
        frame = websocket_frame(b"B " + dumps(response))
        if connection.closing is None:
            self._outbound.writer.write(connection, frame)
        else:  # refused: the client learns why before the close frame
            self._outbound.writer.write_alert(connection, frame)

    # -- session ----------------------------------------------------------------------------

    async def _session(self, connection: Connection, session: Any, errors: list[Error]) -> None:
        """Bind ``session`` (the bind's ``sessionId``, when new), then check the one held: a
        session id is held by one identity at a time on every instance
        (:mod:`bow_gateway.outbound.sessions`), the listener id that bound it (or anonymous
        connections), so that another cannot read its ``$remote/{sessionId}/rx/...``. A bind with
        one another identity holds is refused (``General``), the session held so far kept; a
        connection whose identity changed (anonymous to an id) while another holds its session lets
        it go. When the backplane cannot say who holds it, the session is refused (``General``) all
        the same."""
        if session is not None and session != connection.session:
            if (
                not isinstance(session, str)
                or not session
                or len(session) > MAX_SESSION_ID
                or any(char in session for char in "/+# ")
                or forbidden_character(session)  # a level of $remote names: held to their rule
            ):
                errors.append(
                    general(
                        f"sessionId must be a string of 1 to {MAX_SESSION_ID} characters "
                        "without '/', '+', '#', a space, a comma, a control or bidirectional "
                        "character"
                    )
                )
            else:
                held = "sessionId is held by another listener: choose another"
                await self._join(connection, session, errors, held)
        current = connection.session
        if current is not None and not self._outbound.sessions.owns(connection):
            if session == current:
                held = "sessionId is held by another listener: choose another"
            else:
                held = f"sessionId {current!r} is held by another listener: let go"
            await self._join(connection, current, errors, held)

    async def _join(
        self, connection: Connection, session: str, errors: list[Error], held: str
    ) -> None:
        """Bind ``session``, or say why not: ``held`` when another identity holds it."""
        try:
            if await self._outbound.sessions.join(connection, session):
                return
        except BackplaneUnavailable as error:
            logger.info("Flywheel connection %s: sessionId not bound: %s", connection.sid, error)
            held = "sessionId cannot be bound now (the backplane is unavailable): try again"
        errors.append(general(held))

    def leave_session(self, connection: Connection) -> None:
        """Stop routing ``$remote/{sessionId}/rx/...`` to ``connection`` (it is gone)."""
        self._outbound.sessions.leave(connection)

    # -- authentication ---------------------------------------------------------------------

    async def _authenticate(self, connection: Connection, auth: Any, errors: list[Error]) -> bool:
        """Authenticate with the bind's ``auth``; False when the connection is being closed."""
        outbound = self._outbound
        credentials, wrong = _credentials(auth)
        if wrong:
            errors.append(general(wrong))
            return True
        if not connection.authenticates.take():
            limit = outbound.settings.max_authenticates_per_minute
            outbound.close(connection, codes.TOO_MANY_REQUESTS, f"over {limit} auth a minute")
            errors.append(general(connection.farewell[1] if connection.farewell else "closed"))
            return False
        return await self._admit(connection, credentials, errors)

    async def _admit(self, connection: Connection, credentials: Any, errors: list[Error]) -> bool:
        """Admit the connection with ``credentials`` (None: anonymous); False when it is being
        closed instead (its ``farewell``, the bind's error, says why)."""
        admission = self._outbound.admission
        try:
            admitted = await admission.admit(connection, credentials, keep_details=True)
        except Refusal as refusal:
            admission.refuse(connection, refusal)
        else:
            if admitted is not None:
                await admission.share(connection, admitted)
                if connection.closing is None:
                    return True
        errors.append(general(connection.farewell[1] if connection.farewell else "closed"))
        return False

    # -- subscriptions ----------------------------------------------------------------------

    def _subscriptions(
        self, connection: Connection, request: Mapping[str, Any], errors: list[Error]
    ) -> None:
        topics = self._outbound.topics[connection.outbound.middleware_version]
        for key in ("unsubscribe", "subscribe"):
            filters = request.get(key, [])
            if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
                errors.append(general(f"{key} must be a list of topic filters"))
                continue
            for text in filters:
                if key == "unsubscribe":
                    topics.remove(connection, text)  # MQTT: only exactly a filter held
                    continue
                if topics.holds(connection, text):
                    continue
                refused, levels = self._refusal(connection, text, topics.held(connection))
                if refused is not None:
                    errors.append(refused)
                else:
                    topics.add(connection, text, levels, owner=owner(connection))

    def _refusal(
        self, connection: Connection, text: str, held: int
    ) -> tuple[Error | None, tuple[str, ...]]:
        """Why ``connection`` may not subscribe to filter ``text``, which it does not hold
        (None: it may), and the filter's levels."""
        shown = text[:256]
        if text.startswith(SYSTEM_PREFIX):
            return topic_access("names starting with $ are the gateway's own", shown), ()
        try:
            levels = parse_filter(text)
        except ValueError as error:
            return general(f"bad topic filter: {error}"), ()
        if not connection.authenticated:
            return topic_access("bind with auth first", shown), ()
        limit = self._outbound.settings.max_filters
        if held >= limit:
            return general(f"at most {limit} filters per connection (outbound.max_filters)"), ()
        why = refusal(self._outbound, connection, [text])
        if why is not None:
            return general(why), ()
        return None, levels


def _credentials(auth: Any) -> tuple[Any, str]:
    """What the outbound's function is handed (a Bearer's token, a Basic's whole object), or
    what is wrong with ``auth``."""
    if not isinstance(auth, Mapping):
        return None, "auth must be an object with a type, Bearer or Basic"
    kind = auth.get("type")
    if kind == "Bearer":
        token = auth.get("token")
        if not isinstance(token, str) or not token:
            return None, "a Bearer auth has a token (a non-empty string)"
        return token, ""
    if kind == "Basic":
        if not all(isinstance(auth.get(key), str) for key in ("username", "password")):
            return None, "a Basic auth has a username and a password (strings)"
        return dict(auth), ""
    return None, f"unknown auth type {str(kind)[:32]!r}: Bearer or Basic"
