"""LBT-TCP framing: any chunking yields the same messages; bad framing is one clear error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.strategies import messages
from wire.errors import WireError
from wire.lbmc import LbmcMessage, MessageType, UmeAck, UmePreg
from wire.lbttcp import LbttcpStream, entry_test, frame_messages


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in [*points, len(data)]:
        out.append(data[last:p])
        last = p
    return out


@given(st.lists(messages(), min_size=1, max_size=6), st.lists(st.integers(0, 10_000)))
def test_any_chunking_gives_the_same_messages(msgs: list[LbmcMessage], cuts: list[int]) -> None:
    data = frame_messages(msgs)
    stream = LbttcpStream()
    items = []
    for chunk in _chunks(data, cuts):
        items += stream.feed(chunk)
    assert [i.message for i in items] == msgs
    assert [i.offset for i in items] == [sum(len(m.build()) for m in msgs[:k])
                                         for k in range(len(msgs))]
    assert stream.pending == 0
    stream.close()


def test_partial_message_waits_and_close_reports_truncation() -> None:
    raw = LbmcMessage(headers=[UmeAck(type=1, seqnum=7)]).build()
    stream = LbttcpStream()
    assert stream.feed(raw[:10]) == []
    assert stream.pending == 10
    with pytest.raises(WireError, match="ended inside a message"):
        stream.close()


def test_bad_message_is_reported_and_stream_continues() -> None:
    good = LbmcMessage(headers=[UmeAck(type=1, seqnum=1)]).build()
    bad = bytearray(LbmcMessage(headers=[UmePreg()]).build())
    bad[5] = 20  # ume_preg hdr_len shorter than its 28-byte layout
    stream = LbttcpStream()
    items = stream.feed(good + bytes(bad) + good)
    assert [i.error is None for i in items] == [True, False, True]
    assert items[1].error is not None
    assert items[1].error.header == "lbmc.ume_preg"
    assert items[1].error.offset == 4
    assert items[1].offset == len(good)


@pytest.mark.parametrize("msglen", [0, 1, 2, 3])
def test_unframeable_msglen_breaks_the_stream(msglen: int) -> None:
    good = LbmcMessage(headers=[UmeAck()]).build()
    stream = LbttcpStream()
    items = stream.feed(good + bytes([0x08, 0x14, 0, msglen]) + b"rest")
    assert len(items) == 1  # the good message is still delivered
    with pytest.raises(WireError) as info:
        stream.feed(b"more")
    assert info.value.offset == len(good) + 2
    assert stream.broken is not None


@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=5))
def test_fuzz_stream_only_raises_wire_error(data: bytes, cuts: list[int]) -> None:
    stream = LbttcpStream()
    fed = 0
    for chunk in _chunks(data, cuts):
        try:
            for item in stream.feed(chunk):
                assert (item.message is None) != (item.error is None)
        except WireError:
            break
        fed += len(chunk)
    assert stream.offset <= len(data)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (bytes([0x08, 0x12, 0x00, 0x20]), None),
        (bytes([0x00, 0x00, 0x00, 0x10]), None),
        (bytes([0x08, 0x03, 0x00, 0x10]), None),  # TGIDX passes the entry test
        (bytes([0x08, 0xFF, 0x00, 0x04]), "0xff"),
        (bytes([0x08, 0x21, 0x00, 0x10]), "0x21"),
        (bytes([0x18, 0x12, 0x00, 0x20]), "version 1"),
        (bytes([0x03, 0x12, 0x00, 0x20]), "type 0x3"),
        (bytes([0x08, 0x12, 0x00, 0x00]), "zero"),
        (bytes([0x08, 0x12]), "at least 4"),
    ],
)
def test_entry_test_matches_tshark_rules(head: bytes, expected: str | None) -> None:
    why = entry_test(head)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_decode_false_returns_raw_frames() -> None:
    msgs = [LbmcMessage(type=MessageType.CONTROL, headers=[UmeAck(seqnum=i)]) for i in range(3)]
    items = LbttcpStream(decode=False).feed(frame_messages(msgs))
    assert [i.raw for i in items] == [m.build() for m in msgs]
