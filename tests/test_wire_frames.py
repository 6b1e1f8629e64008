"""The gateway's WebSocket frame parser (bow_gateway/wire/frames.py) byte by byte, against RFC 6455
section 5 (and 7.4 for close codes): a FrameReader on one end of a real socket pair is fed bytes
directly, and what it writes back is read on the other end, as the client would.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from bow_gateway.wire.frames import MAX_BUFFERED, FrameReader, unmask

LIMIT = 16_384  # the gateway's default outbound.max_incoming_bytes (its max_http_buffer_size)
MASK = bytes.fromhex("37fa213d")  # RFC 6455 section 5.7's example mask
VALID_CLOSE_CODES = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014]
VALID_CLOSE_CODES += [3000, 3999, 4000, 4999]
INVALID_CLOSE_CODES = [0, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535]


def masked(payload: bytes, mask: bytes) -> bytes:
    """RFC 6455 section 5.3 written plainly: octet i XOR octet i mod 4 of the mask."""
    return bytes(octet ^ mask[i % 4] for i, octet in enumerate(payload))


def frame(
    payload: bytes = b"",
    opcode: int = 0x1,
    *,
    final: bool = True,
    mask: bytes | None = MASK,
    rsv: int = 0,
    form: int = 7,
    length: int | None = None,
) -> bytes:
    """A client's frame: masked with ``mask`` (unmasked if None), its length in at least the
    ``form`` (7-, 16- or 64-bit) length form, announcing ``length`` if given."""
    announced = len(payload) if length is None else length
    form = max(form, 7 if announced < 126 else 16 if announced < 65_536 else 64)
    first = (0x80 if final else 0) | rsv | opcode
    bit = 0x80 if mask is not None else 0
    if form == 7:
        head = bytes((first, bit | announced))
    elif form == 16:
        head = struct.pack("!BBH", first, bit | 126, announced)
    else:
        head = struct.pack("!BBQ", first, bit | 127, announced)
    return head + payload if mask is None else head + mask + masked(payload, mask)


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + reason


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The frames in what the reader wrote: each final, unmasked, with no reserved bit and its
    length in its minimal form (as RFC 6455 has a server send them); a partial one is an error."""
    frames: list[tuple[int, bytes]] = []
    at = 0
    while at < len(data):
        first, second = data[at], data[at + 1]
        assert first & 0xF0 == 0x80 and not second & 0x80, data[at : at + 2]
        length, at = second, at + 2
        if length == 126:
            length, at = int.from_bytes(data[at : at + 2], "big"), at + 2
            assert length >= 126
        elif length == 127:
            length, at = int.from_bytes(data[at : at + 8], "big"), at + 8
            assert length >= 65_536
        assert at + length <= len(data), "a partial frame"
        frames.append((first & 0x0F, data[at : at + length]))
        at += length
    return frames


class Recorder(FrameReader):
    """A FrameReader that keeps the messages it is given (``hold``: and pauses the reading)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.messages: list[str | bytes] = []
        self.hold = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def message(self, data: str | bytes) -> bool:
        self.messages.append(data)
        return not self.hold


class Wire:
    """A :class:`Recorder` on one end of a real socket pair, fed bytes directly (as the event loop
    would: nothing once it closed the transport); the other end is read as the client would."""

    def __init__(self, reader: Recorder, peer: socket.socket) -> None:
        self.reader, self.peer = reader, peer
        self.received = b""
        self.eof = False

    @classmethod
    async def open(cls, limit: int = LIMIT) -> Wire:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        loop = asyncio.get_running_loop()
        _, reader = await loop.connect_accepted_socket(lambda: Recorder(limit), ours)
        return cls(reader, peer)

    async def shut(self) -> None:
        transport = self.reader.transport
        if transport is not None:
            transport.abort()
        for _ in range(3):  # connection_lost, then the socket closed
            await asyncio.sleep(0)
        self.peer.close()

    def feed(self, *chunks: bytes) -> None:
        for chunk in chunks:
            transport = self.reader.transport
            if transport is None or transport.is_closing():
                return
            self.reader.data_received(chunk)

    @property
    def messages(self) -> list[str | bytes]:
        return self.reader.messages

    def sent(self) -> list[tuple[int, bytes]]:
        """Every frame the reader wrote so far."""
        while not self.eof:
            try:
                data = self.peer.recv(262_144)
            except BlockingIOError:
                break
            self.received += data
            self.eof = not data
        return server_frames(self.received)

    def is_open(self) -> bool:
        transport = self.reader.transport
        return transport is not None and not transport.is_closing() and not self.reader.closing

    async def ended(self) -> bool:
        """Whether the reader closed the connection (once the event loop ran its callbacks)."""
        for _ in range(5):
            if self.reader.transport is None:
                break
            await asyncio.sleep(0)
        self.sent()
        return self.reader.transport is None and self.eof

    async def close_code(self) -> int:
        """The code of the reader's close frame, its last, once the connection ended."""
        assert await self.ended(), "the connection is still open"
        frames = self.sent()
        assert frames and frames[-1][0] == 0x8, frames
        assert [opcode for opcode, _ in frames].count(0x8) == 1
        assert len(frames[-1][1]) == 2
        return int.from_bytes(frames[-1][1], "big")


@pytest.fixture
async def wires() -> AsyncIterator[Callable[..., Awaitable[Wire]]]:
    """``await wires(limit)``: a fresh Wire, shut at the end of the test."""
    made: list[Wire] = []

    async def make(limit: int = LIMIT) -> Wire:
        wire = await Wire.open(limit)
        made.append(wire)
        return wire

    yield make
    for wire in made:
        await wire.shut()


@pytest.fixture
async def wire(wires: Callable[..., Awaitable[Wire]]) -> Wire:
    return await wires()


# Masking and lengths (RFC 6455 sections 5.2, 5.3)


async def test_an_unmasked_client_frame_is_refused_1002(wire: Wire) -> None:
    wire.feed(frame(b"hello", mask=None))
    assert await wire.close_code() == 1002
    assert wire.messages == []


@pytest.mark.parametrize("size", [0, 125, 126, 127, 65_535, 65_536])
async def test_a_payload_is_read_whatever_its_length_form(
    wires: Callable[..., Awaitable[Wire]], size: int
) -> None:
    """0 and 125 take the 7-bit form, 126 to 65 535 the 16-bit one, 65 536 the 64-bit one."""
    wire = await wires(limit=70_000)
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    wire.feed(frame(data, 0x2))
    assert wire.messages == [data]
    assert wire.is_open()


@pytest.mark.parametrize(("size", "form"), [(5, 16), (5, 64), (125, 16), (300, 64)])
async def test_a_non_minimal_length_encoding_is_accepted(wire: Wire, size: int, form: int) -> None:
    """Deliberate: RFC 6455 5.2 says the minimal form MUST be used, a sender's duty, and names no
    reaction to one that is not; aiohttp and the websockets library read it too."""
    wire.feed(frame(b"x" * size, form=form))
    assert wire.messages == ["x" * size]
    assert wire.is_open()


async def test_a_non_minimal_length_on_a_control_frame_is_accepted(wire: Wire) -> None:
    """Its payload is still at most 125 bytes, all RFC 6455 5.5 asks of a control frame."""
    wire.feed(frame(b"ping", 0x9, form=16))
    assert wire.sent() == [(0xA, b"ping")]
    assert wire.is_open()


async def test_a_64_bit_length_with_its_top_bit_set_is_refused_1002(wire: Wire) -> None:
    """RFC 6455 5.2: the most significant bit of a 64-bit length MUST be 0: a malformed frame,
    not a message too big (it was 1009)."""
    wire.feed(frame(b"", length=1 << 63))
    assert await wire.close_code() == 1002


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 126, 1001])
async def test_each_frame_is_unmasked_from_its_first_payload_byte_with_its_own_mask(
    wire: Wire, size: int
) -> None:
    """Every length modulo 4 across fragments with different masks: the mask restarts with each
    frame's payload (RFC 6455 5.3)."""
    data = bytes((i * 7 + 3) % 256 for i in range(size))
    wire.feed(
        frame(data, 0x2, final=False, mask=b"\x01\x02\x03\x04")
        + frame(data, 0x0, final=False, mask=b"\xff\x00\xaa\x55")
        + frame(data, 0x0, mask=b"\x80\x7f\x10\xef")
    )
    assert wire.messages == [data * 3]


@pytest.mark.parametrize("mask", [bytes(4), b"\xff" * 4, MASK, b"\x00\x01\x80\xff"])
def test_unmask_matches_the_reference_at_every_offset(mask: bytes) -> None:
    """Payloads of every length 0-40 (every offset into the mask, and past the int fast path's
    small sizes) against the plain per-octet XOR."""
    for length in range(41):
        payload = bytes((i * 37 + 11) % 256 for i in range(length))
        assert unmask(payload, mask) == masked(payload, mask)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=600), mask=st.binary(min_size=4, max_size=4))
def test_unmask_matches_the_reference_for_any_mask(payload: bytes, mask: bytes) -> None:
    """Any payload (leading zero octets included, which an int drops) with any mask."""
    assert unmask(payload, mask) == masked(payload, mask)
    assert unmask(unmask(payload, mask), mask) == payload


# Fragmentation (RFC 6455 section 5.4)


@pytest.mark.parametrize("opcode", [0x1, 0x2])
async def test_a_message_in_three_frames_is_reassembled(wire: Wire, opcode: int) -> None:
    wire.feed(
        frame(b"Hel", opcode, final=False) + frame(b"lo, ", 0x0, final=False) + frame(b"you", 0x0)
    )
    assert wire.messages == (["Hello, you"] if opcode == 0x1 else [b"Hello, you"])


async def test_empty_fragments_are_reassembled(wire: Wire) -> None:
    wire.feed(frame(b"", final=False) + frame(b"", 0x0, final=False) + frame(b"", 0x0))
    assert wire.messages == [""]


async def test_a_continuation_without_a_start_is_refused_1002(wire: Wire) -> None:
    wire.feed(frame(b"lost", 0x0))
    assert await wire.close_code() == 1002
    assert wire.messages == []


async def test_a_continuation_after_a_finished_message_is_refused_1002(wire: Wire) -> None:
    wire.feed(frame(b"a", final=False) + frame(b"b", 0x0) + frame(b"c", 0x0))
    assert await wire.close_code() == 1002
    assert wire.messages == ["ab"]


@pytest.mark.parametrize(("opcode", "final"), [(0x1, True), (0x1, False), (0x2, True)])
async def test_a_new_data_frame_inside_a_fragmented_message_is_refused_1002(
    wire: Wire, opcode: int, final: bool
) -> None:
    wire.feed(frame(b"start", final=False) + frame(b"again", opcode, final=final))
    assert await wire.close_code() == 1002
    assert wire.messages == []


async def test_pings_and_pongs_inside_a_fragmented_message_are_handled_and_it_reassembles(
    wire: Wire,
) -> None:
    wire.feed(
        frame(b"4", final=False)
        + frame(b"p1", 0x9)
        + frame(b"", 0x0, final=False)
        + frame(b"unsolicited", 0xA)
        + frame(b"", 0x9)
        + frame(b"0", 0x0)
    )
    assert wire.sent() == [(0xA, b"p1"), (0xA, b"")]
    assert wire.messages == ["40"]
    assert wire.is_open()


async def test_a_close_inside_a_fragmented_message_is_answered_and_the_message_dropped(
    wire: Wire,
) -> None:
    wire.feed(frame(b"4", final=False) + frame(close_payload(1001), 0x8) + frame(b"0", 0x0))
    assert await wire.close_code() == 1001
    assert wire.messages == []


# Control frames, reserved bits and opcodes (RFC 6455 sections 5.2, 5.5)


@pytest.mark.parametrize("opcode", [0x8, 0x9, 0xA])
async def test_a_control_frame_over_125_bytes_is_refused_1002(wire: Wire, opcode: int) -> None:
    payload = close_payload(1000, b"r" * 124) if opcode == 0x8 else b"x" * 126
    wire.feed(frame(payload, opcode))
    assert await wire.close_code() == 1002


async def test_a_ping_of_125_bytes_is_answered_with_them(wire: Wire) -> None:
    wire.feed(frame(bytes(range(125)), 0x9))
    assert wire.sent() == [(0xA, bytes(range(125)))]


async def test_a_ping_is_not_answered_while_the_client_does_not_read(wire: Wire) -> None:
    """Deliberate, against RFC 6455 5.5.2's MUST: with 64 KiB unsent, a client that pings without
    reading cannot grow the gateway's buffer (browsers never ping; Engine.IO pings in packets)."""
    transport = wire.reader.transport
    assert transport is not None
    while transport.get_write_buffer_size() < 65_536:  # the peer reads nothing
        wire.reader.write(bytes(65_536))
    unsent = transport.get_write_buffer_size()
    wire.feed(frame(b"ping", 0x9))
    assert transport.get_write_buffer_size() == unsent
    assert wire.is_open()


@pytest.mark.parametrize("opcode", [0x8, 0x9, 0xA])
async def test_a_fragmented_control_frame_is_refused_1002(wire: Wire, opcode: int) -> None:
    wire.feed(frame(close_payload(1000) if opcode == 0x8 else b"", opcode, final=False))
    assert await wire.close_code() == 1002
    assert [opcode for opcode, _ in wire.sent()] == [0x8]  # no pong


@pytest.mark.parametrize("rsv", [0x40, 0x20, 0x10, 0x70])
@pytest.mark.parametrize("opcode", [0x1, 0x9])
async def test_a_reserved_bit_without_an_extension_is_refused_1002(
    wire: Wire, rsv: int, opcode: int
) -> None:
    """RSV1 (compression's bit) too: the handshake never agrees an extension."""
    wire.feed(frame(b"data", opcode, rsv=rsv))
    assert await wire.close_code() == 1002
    assert wire.messages == [] and [opcode for opcode, _ in wire.sent()] == [0x8]


@pytest.mark.parametrize("opcode", [0x3, 0x4, 0x5, 0x6, 0x7, 0xB, 0xC, 0xD, 0xE, 0xF])
async def test_a_reserved_opcode_is_refused_1002(wire: Wire, opcode: int) -> None:
    wire.feed(frame(b"data", opcode))
    assert await wire.close_code() == 1002


@pytest.mark.parametrize(
    "head",
    [
        frame(b"x" * 100, 0x3)[:6],  # a reserved opcode
        frame(b"x" * 100, 0x0)[:6],  # a continuation of nothing
        frame(b"x" * 20_000, 0x5)[:8],  # a reserved opcode announcing more than the limit
    ],
    ids=["reserved opcode", "continuation of nothing", "reserved opcode over the limit"],
)
async def test_a_frame_its_header_refuses_is_refused_before_its_payload_arrives(
    wire: Wire, head: bytes
) -> None:
    """Nothing of a frame to be refused is waited for, nor buffered (and a reserved opcode is a
    protocol error, 1002, even announcing too much: it was 1009)."""
    wire.feed(head)
    assert await wire.close_code() == 1002


async def test_a_new_message_inside_a_fragmented_one_is_refused_from_its_header(
    wire: Wire,
) -> None:
    wire.feed(frame(b"a", final=False) + frame(b"x" * 100)[:8])
    assert await wire.close_code() == 1002


# The close handshake (RFC 6455 sections 5.5.1, 7.4)


async def test_an_empty_close_is_answered_1000(wire: Wire) -> None:
    """No status code received (1005 for the application): answered with a normal closure."""
    wire.feed(frame(b"", 0x8))
    assert await wire.close_code() == 1000


async def test_a_1_byte_close_payload_is_refused_1002(wire: Wire) -> None:
    wire.feed(frame(b"\x03", 0x8))
    assert await wire.close_code() == 1002


@pytest.mark.parametrize("code", VALID_CLOSE_CODES)
async def test_a_valid_close_code_is_echoed(wire: Wire, code: int) -> None:
    """RFC 6455's codes plus IANA's 1012-1014, and the 3000-4999 ranges for libraries and
    applications (what a browser's ``close(code)`` may send)."""
    wire.feed(frame(close_payload(code), 0x8))
    assert await wire.close_code() == code


@pytest.mark.parametrize("code", INVALID_CLOSE_CODES)
async def test_an_invalid_close_code_is_refused_1002(wire: Wire, code: int) -> None:
    """0-999 unused, 1004-1006 and 1015 never sent in a frame, 1016-2999 reserved for RFC 6455's
    revisions (it accepted 1016-2999), 5000 and up undefined (RFC 6455 7.4.2)."""
    wire.feed(frame(close_payload(code), 0x8))
    assert await wire.close_code() == 1002


async def test_a_close_reason_in_utf8_is_accepted(wire: Wire) -> None:
    wire.feed(frame(close_payload(1000, "au revoir, ça va ✓".encode()), 0x8))
    assert await wire.close_code() == 1000


@pytest.mark.parametrize("reason", [b"\xff", b"bye\xc3", b"\xed\xa0\x80"])
async def test_a_close_reason_that_is_not_utf8_is_refused_1007(wire: Wire, reason: bytes) -> None:
    """RFC 6455 5.5.1: the reason is UTF-8; invalid, it is data inconsistent with its type, 1007
    (as Autobahn's case 7.5.1 expects; the reason was not checked)."""
    wire.feed(frame(close_payload(1000, reason), 0x8))
    assert await wire.close_code() == 1007


async def test_nothing_after_a_close_frame_is_read(wire: Wire) -> None:
    wire.feed(frame(close_payload(1000), 0x8) + frame(b"late") + frame(b"", 0x9))
    assert await wire.close_code() == 1000
    assert wire.messages == []


# UTF-8 (RFC 6455 sections 5.6, 8.1)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # never in UTF-8
        b"4\xc0\xaf",  # an overlong "/"
        b"\xed\xa0\x80",  # a surrogate (U+D800)
        b"\xf4\x90\x80\x80",  # past U+10FFFF
        b"ends in \xe2\x82",  # a code point cut short
        b"\x80",  # a lone continuation byte
    ],
)
async def test_text_that_is_not_utf8_is_refused_1007(wire: Wire, data: bytes) -> None:
    wire.feed(frame(data))
    assert await wire.close_code() == 1007
    assert wire.messages == []


async def test_binary_that_is_not_utf8_is_read(wire: Wire) -> None:
    wire.feed(frame(b"\xff\xfe", 0x2))
    assert wire.messages == [b"\xff\xfe"]


async def test_text_split_across_fragments_at_code_point_boundaries_is_read(wire: Wire) -> None:
    wire.feed(frame("κό".encode(), final=False) + frame("σμε".encode(), 0x0))
    assert wire.messages == ["κόσμε"]


async def test_text_split_inside_a_code_point_is_read_once_completed(wire: Wire) -> None:
    euro = "€".encode()  # 3 bytes: E2 82 AC
    wire.feed(
        frame(b"a" + euro[:1], final=False)
        + frame(euro[1:2], 0x0, final=False)
        + frame(euro[2:] + b"b", 0x0)
    )
    assert wire.messages == ["a€b"]


async def test_fragmented_text_that_is_not_utf8_is_refused_1007_when_it_completes(
    wire: Wire,
) -> None:
    """Deliberate: the text is checked once whole, not per fragment; RFC 6455 8.1 allows failing
    fast but does not require it (Autobahn's 6.4.x rate it non-strict, not a failure)."""
    wire.feed(frame(b"ok\xff", final=False))
    assert wire.is_open()
    wire.feed(frame(b"more", 0x0))
    assert await wire.close_code() == 1007
    assert wire.messages == []


# The gateway's maximum message size (RFC 6455 section 7.4.1, 1009)


async def test_a_message_at_the_limit_is_read(wire: Wire) -> None:
    wire.feed(frame(b"x" * LIMIT))
    assert wire.messages == ["x" * LIMIT]


async def test_a_message_over_the_limit_is_refused_1009(wire: Wire) -> None:
    wire.feed(frame(b"x" * (LIMIT + 1)))
    assert await wire.close_code() == 1009
    assert wire.messages == []


async def test_a_length_over_the_limit_is_refused_1009_before_its_payload(wire: Wire) -> None:
    """Nothing of it is buffered: the header is enough."""
    wire.feed(frame(b"", length=1 << 40))
    assert await wire.close_code() == 1009


async def test_a_fragmented_message_at_the_limit_in_sum_is_read(wire: Wire) -> None:
    half = LIMIT // 2
    wire.feed(frame(b"x" * half, final=False) + frame(b"y" * (LIMIT - half), 0x0))
    assert wire.messages == ["x" * half + "y" * (LIMIT - half)]


async def test_a_fragmented_message_over_the_limit_in_sum_is_refused_1009(wire: Wire) -> None:
    """Each fragment under the limit, their sum over it: refused at the fragment that tips it."""
    third = LIMIT // 3
    wire.feed(
        frame(b"x" * third, final=False)
        + frame(b"x" * third, 0x0, final=False)
        + frame(b"x" * third, 0x0, final=False)
    )
    assert wire.is_open()
    wire.feed(frame(b"x" * 2, 0x0, final=False)[:2])
    assert await wire.close_code() == 1009
    assert wire.messages == []


async def test_many_small_fragments_take_no_more_memory_than_their_bytes(wire: Wire) -> None:
    """The fragments are one growing buffer: as a list they cost ~40 bytes of objects per
    2-byte fragment, and each frame summed the list (quadratic in the number of frames)."""
    count = 5_000  # 10 000 bytes: under the limit
    data = frame(b"ab", final=False) + frame(b"ab", 0x0, final=False) * count
    tracemalloc.start()
    try:
        wire.feed(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 2 * count, peak
    wire.feed(frame(b"!", 0x0))
    assert wire.messages == ["ab" * (count + 1) + "!"]


async def test_a_paused_reader_refuses_more_than_max_buffered_with_1008(wire: Wire) -> None:
    """While the reading is paused what arrives is kept, up to MAX_BUFFERED bytes."""
    wire.reader.hold = True
    wire.feed(frame(b"first"), b"x" * MAX_BUFFERED)
    assert wire.is_open() and wire.messages == ["first"]
    wire.feed(b"x")
    assert await wire.close_code() == 1008


# Property-based: any bytes, any chunking


FUZZ_LIMIT = 200
MAX_HEADER = 14  # 2 bytes, a 64-bit length, the mask
masks = st.binary(min_size=4, max_size=4)
forms = st.sampled_from([7, 7, 7, 16, 64])


FAULTS = [
    "bytes",  # random bytes in place of a frame
    "unmasked",
    "reserved bit",
    "reserved opcode",
    "out of sequence",  # a continuation of nothing, or a new message inside another
    "fragmented control",
    "long control",
    "lying length",  # announcing more or less than the payload, or over the limit
    "not UTF-8",
    "close",  # with any code, valid or not, and any reason
]


@st.composite
def plausible_streams(draw: st.DrawFn) -> bytes:
    """Frames as a client might send them, following the fragmentation's state, each one now
    and then wrong in one of the :data:`FAULTS`."""
    stream = b""
    fragmented = False  # a fragmented message under way
    for _ in range(draw(st.integers(0, 12))):
        fault = draw(st.sampled_from([None] * 70 + FAULTS))  # 1 in 8
        if fault == "bytes":
            stream += draw(st.binary(min_size=1, max_size=16))
            continue
        control = draw(st.sampled_from([None, None, None, 0x9, 0xA]))
        opcode = control or (0x0 if fragmented else draw(st.sampled_from([0x1, 0x2])))
        final = control is not None or draw(st.booleans())
        if opcode == 0x1 or (opcode == 0x0 and fragmented):
            payload = draw(st.text(max_size=40)).encode()
        else:
            payload = draw(st.binary(max_size=FUZZ_LIMIT if control is None else 125))
        big = draw(st.sampled_from([0] * 4 + [FUZZ_LIMIT // 2 + 1, FUZZ_LIMIT]))
        if big and control is None:  # two of them are over the limit
            payload = b"a" * big
        mask: bytes | None = draw(masks)
        rsv, length = 0, None
        if fault == "unmasked":
            mask = None
        elif fault == "reserved bit":
            rsv = draw(st.sampled_from([0x10, 0x20, 0x40]))
        elif fault == "reserved opcode":
            opcode = draw(st.sampled_from([0x3, 0x7, 0xB, 0xF]))
        elif fault == "out of sequence":
            opcode = draw(st.sampled_from([0x1, 0x2])) if fragmented else 0x0
        elif fault == "fragmented control":
            opcode, final = draw(st.sampled_from([0x8, 0x9, 0xA])), False
        elif fault == "long control":
            opcode, payload = draw(st.sampled_from([0x8, 0x9, 0xA])), bytes(126)
        elif fault == "lying length":
            length = draw(st.sampled_from([0, 3, 126, FUZZ_LIMIT + 1, 1 << 63]))
        elif fault == "not UTF-8":
            opcode = 0x0 if fragmented else 0x1
            bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82"]))
            payload = draw(st.text(max_size=4)).encode() + bad
        elif fault == "close":
            code = draw(st.sampled_from(VALID_CLOSE_CODES + INVALID_CLOSE_CODES))
            reason = draw(st.one_of(st.text(max_size=4).map(str.encode), st.binary(max_size=4)))
            opcode, final = 0x8, True
            payload = draw(st.one_of(st.binary(max_size=1), st.just(close_payload(code, reason))))
        form = draw(forms)
        stream += frame(payload, opcode, final=final, mask=mask, rsv=rsv, form=form, length=length)
        if opcode < 0x8 and fault is None:
            fragmented = not final
    return stream


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


async def outcome(chunks: list[bytes]) -> tuple[list[str | bytes], bytes, bool]:
    """What a fresh reader makes of ``chunks``: its messages, what it wrote, whether it closed;
    checking after each chunk that it buffers at most one partial frame."""
    wire = await Wire.open(FUZZ_LIMIT)
    try:
        for chunk in chunks:
            wire.feed(chunk)
            assert len(wire.reader._buffer) < MAX_HEADER + max(FUZZ_LIMIT, 125)
            assert len(wire.reader._fragments or b"") <= FUZZ_LIMIT
        ended = await wire.ended()
        frames = wire.sent()
        if ended or 0x8 in (opcode for opcode, _ in frames):
            assert ended and frames[-1][0] == 0x8
            code = int.from_bytes(frames[-1][1], "big")
            assert code in VALID_CLOSE_CODES or 3000 <= code <= 4999, code
        sizes = [len(m if isinstance(m, bytes) else m.encode()) for m in wire.messages]
        assert all(size <= FUZZ_LIMIT for size in sizes)
        return wire.messages, wire.received, ended
    finally:
        await wire.shut()


@settings(max_examples=300, deadline=None)
@given(stream=st.one_of(plausible_streams(), plausible_streams(), st.binary()), data=st.data())
async def test_any_bytes_in_any_chunks_are_read_as_when_whole(
    stream: bytes, data: st.DataObject
) -> None:
    """Nothing raises (every error is a close frame), nothing is buffered past one frame of the
    limit, and how the bytes are split changes nothing."""
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    whole = await outcome([stream])
    assert await outcome(chunked(stream, cuts)) == whole
    messages, written, ended = whole
    event(f"closed {int.from_bytes(written[-2:], 'big')}" if ended else "open")
    event(f"{min(len(messages), 3)}+ messages")


longs = st.integers(0, 70_000).map(lambda size: bytes(i % 251 for i in range(size)))
"""Binary messages of any length form (their frames' lengths too, once fragmented)."""


@st.composite
def conversations(draw: st.DrawFn) -> tuple[bytes, list[str | bytes], list[bytes]]:
    """Valid frames: messages fragmented at random bytes (inside code points too), each frame
    with its own mask and length form, pings and pongs between any two; the messages and the
    pings' payloads."""
    messages = draw(
        st.lists(st.one_of(st.text(max_size=60), st.binary(max_size=300), longs), max_size=6)
    )
    stream = b""
    pings: list[bytes] = []
    for message in messages:
        binary = isinstance(message, bytes)
        encoded = message if isinstance(message, bytes) else message.encode()
        pieces = chunked(encoded, draw(st.lists(st.integers(0, len(encoded)), max_size=4)))
        for i, piece in enumerate(pieces):
            control = draw(st.sampled_from([None, None, None, 0x9, 0xA]))
            if control is not None:
                payload = draw(st.binary(max_size=125))
                stream += frame(payload, control, mask=draw(masks), form=draw(forms))
                if control == 0x9:
                    pings.append(payload)
            opcode = (0x2 if binary else 0x1) if i == 0 else 0x0
            final = i == len(pieces) - 1
            stream += frame(piece, opcode, final=final, mask=draw(masks), form=draw(forms))
    return stream, messages, pings


@settings(max_examples=300, deadline=None)
@given(conversation=conversations(), data=st.data())
async def test_valid_frames_in_any_chunks_yield_exactly_the_messages_sent(
    conversation: tuple[bytes, list[str | bytes], list[bytes]], data: st.DataObject
) -> None:
    """Every message, whole and in order, every ping answered in order, nothing left over."""
    stream, messages, pings = conversation
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    wire = await Wire.open(limit=100_000)
    try:
        wire.feed(*chunked(stream, cuts))
        assert wire.messages == messages
        assert wire.sent() == [(0xA, payload) for payload in pings]
        assert wire.is_open()
        assert wire.reader._buffer == b"" and wire.reader._fragments is None
    finally:
        await wire.shut()
