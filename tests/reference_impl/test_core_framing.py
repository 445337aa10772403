"""The framing fast path of :class:`reference_impl.context.ContextCore` against the LBT-TCP
framer of :mod:`wire.lbttcp` (the oracle), and the coalescing of a core's writes.

Every core slices messages straight out of each received chunk and buffers a cut message
itself; only broken framing goes to the connection's :class:`LbttcpStream`.  Whatever the
bytes and however TCP cuts them, a core must see exactly the messages the oracle frames from
the whole stream, then one framing drop and a close when the oracle breaks, or one drop for the
bytes of an unfinished message when the peer closes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impl.context import Connection, ContextCore
from reference_impl.events import InputDropped
from reference_impl.fastmsg import data_message
from reference_impl.sim import (
    Connect,
    ConnKey,
    StreamClose,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from tests.reference_impl.strategies import chunked, noise, undecodable_frames, valid_messages
from wire.errors import WireError
from wire.lbmc import CONTROL_BASE
from wire.lbttcp import LbttcpStream

ME = ("10.0.0.9", 14391)
PEER = ("10.0.0.8", 50000)
KEY: ConnKey = (ME, PEER)
MANY = settings(max_examples=max(settings().max_examples, 100), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


class Recorder(ContextCore):
    """A core that only records what the base class hands it."""

    def __init__(self) -> None:
        super().__init__("recorder", ME[0])
        self.raws: list[bytes] = []
        self.chunks_done = 0
        self.lost: list[Connection] = []

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        self.raws.append(raw)

    def on_chunk_done(self, conn: Connection) -> None:
        self.chunks_done += 1

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        self.lost.append(conn)


def oracle(stream: bytes) -> tuple[list[bytes], bool, int]:
    """(frames, framing broken, bytes left inside an unfinished message) per LbttcpStream."""
    framer = LbttcpStream(decode=False)
    try:
        items = framer.feed(stream)
    except WireError:
        return [], True, 0
    broken = framer.broken is not None
    return [i.raw for i in items], broken, 0 if broken else framer.pending


def breaker(msglen: int) -> bytes:
    return CONTROL_BASE.pack({"ver_type": 0, "next_hdr": 0xFF, "msglen": msglen})


pieces = st.one_of(valid_messages, undecodable_frames(), noise,
                   st.integers(0, CONTROL_BASE.size - 1).map(breaker),
                   st.binary(min_size=200, max_size=2000).map(
                       lambda body: data_message(1, 7, body)))


@MANY
@given(parts=st.lists(pieces, max_size=12), data=st.data())
def test_a_core_sees_what_the_framer_frames_in_any_chunking(parts: list[bytes],
                                                           data: st.DataObject) -> None:
    stream = b"".join(parts)
    chunks = data.draw(chunked(stream), label="chunks")
    frames, broken, unfinished = oracle(stream)
    core = Recorder()
    core.stream_event(StreamEvent(StreamEventKind.ACCEPTED, KEY), 1.0)
    for chunk in chunks:
        core.stream_event(StreamEvent(StreamEventKind.DATA, KEY, chunk), 1.0)
    core.stream_event(StreamEvent(StreamEventKind.CLOSED, KEY), 1.0)
    events = core.events()
    drops = [e for e in events if isinstance(e, InputDropped)]

    assert core.raws == frames
    assert all(type(raw) is bytes for raw in core.raws)
    assert (core.chunks_done > 0) == bool(frames)
    assert core.chunks_done <= len(chunks)
    if broken:
        assert [("framing" in d.reason) for d in drops] == [True]
        assert core.stream_commands(1.0) == [StreamClose(KEY)]
        assert len(core.lost) == 1
    elif unfinished:
        assert [(d.size, "inside a message" in d.reason) for d in drops] == [(unfinished, True)]
    else:
        assert drops == []
    assert KEY not in core.connections


@given(size=st.integers(100, 60_000), cut=st.data())
def test_a_long_message_in_small_pieces_arrives_once(size: int, cut: st.DataObject) -> None:
    """A big message in tiny pieces is buffered, not re-scanned: it arrives whole, once."""
    raw = data_message(1, 3, b"x" * size)
    step = cut.draw(st.integers(1, 7))
    core = Recorder()
    core.stream_event(StreamEvent(StreamEventKind.ACCEPTED, KEY), 1.0)
    for i in range(0, len(raw), max(step, len(raw) // 500)):
        core.stream_event(StreamEvent(StreamEventKind.DATA, KEY,
                                      raw[i:i + max(step, len(raw) // 500)]), 1.0)
    assert core.raws == [raw]
    assert core.connections[KEY].unframed == 0


def test_bytes_after_broken_framing_are_never_framed() -> None:
    core = Recorder()
    core.stream_event(StreamEvent(StreamEventKind.ACCEPTED, KEY), 1.0)
    good = data_message(1, 1, b"ok")
    core.stream_event(StreamEvent(StreamEventKind.DATA, KEY, good + breaker(1) + good), 1.0)
    assert core.raws == [good]
    assert KEY not in core.connections
    core.stream_event(StreamEvent(StreamEventKind.DATA, KEY, good), 1.0)  # after our close
    assert core.raws == [good]


def test_consecutive_writes_to_one_connection_become_one_send() -> None:
    """Writes are coalesced per connection in order; any other command ends a run."""
    core = Recorder()
    other: ConnKey = (ME, ("10.0.0.7", 50001))
    for key in (KEY, other):
        core.stream_event(StreamEvent(StreamEventKind.ACCEPTED, key), 1.0)
    a, b = core.connections[KEY], core.connections[other]
    core.write(a, b"1")
    core.write(a, b"2")
    core.write(b, b"3")
    core.write(a, b"4")
    core.send_to(("10.0.0.6", 14567), b"5")
    core.write(a, b"6")
    core.close_connection(a)
    assert core.stream_commands(1.0) == [
        StreamWrite(KEY, b"12"), StreamWrite(other, b"3"), StreamWrite(KEY, b"4"),
        Connect((ME[0], 0), ("10.0.0.6", 14567)), StreamWrite(KEY, b"6"), StreamClose(KEY)]
    assert core.stream_commands(1.0) == []
