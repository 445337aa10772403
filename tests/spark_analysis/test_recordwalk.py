"""The compiled record walk (spark_analysis/_recordwalk.c) against its definition.

The walk over real captures, with every split count and both walks, is tested in
test_splits.py; here the C function alone meets a reference written the plainest way, on
arbitrary bytes (lengths that point anywhere, headers cut by the buffer end, starts past it),
and refuses arguments that would make it loop forever or write out of bounds.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_analysis import capture_files, splits

walk = pytest.importorskip("spark_analysis._recordwalk").walk


def test_the_compiled_walk_is_built_and_used() -> None:
    """The decode's speed figures assume the compiled walk: a missing build must fail here,
    not go unnoticed (``pip install -e .`` builds it; it needs a C compiler)."""
    assert splits.RECORD_WALK == "compiled"
    assert splits._compiled_walk is walk


def reference(buf: bytes, pos: int, limit: int, header: int, at: int, big: bool,
              ) -> tuple[list[int], int]:
    """The walk by its definition: take the record at ``pos`` while it starts before
    ``limit`` and its header and body lie inside ``buf``."""
    fmt = ">I" if big else "<I"
    starts = []
    while pos < limit and pos + header <= len(buf):
        end = pos + header + struct.unpack_from(fmt, buf, pos + at)[0]
        if end > len(buf):
            break
        starts.append(pos)
        pos = end
    return starts, pos


def run(buf: bytes, pos: int, limit: int, header: int, at: int, big: bool,
        ) -> tuple[list[int], int]:
    out = np.full(max(0, len(buf) - pos) // header + 1, -1, np.int64)
    count, end = walk(buf, pos, limit, header, at, big, out)
    assert (out[count:] == -1).all()  # nothing written past the count
    return out[:count].tolist(), end


@st.composite
def record_streams(draw: st.DrawFn) -> tuple[bytes, int, int, int, int, bool]:
    """Mostly well-formed records (so walks run long), with junk, cut ends and odd limits."""
    header = draw(st.integers(4, 24))
    at = draw(st.integers(0, header - 4))
    big = draw(st.booleans())
    fmt = ">I" if big else "<I"
    out = bytearray()
    for body in draw(st.lists(st.binary(max_size=40), max_size=30)):
        head = bytearray(draw(st.binary(min_size=header, max_size=header)))
        length = len(body) if draw(st.integers(0, 9)) else draw(st.integers(0, 2**32 - 1))
        head[at:at + 4] = struct.pack(fmt, length)
        out += head + body
    cut = draw(st.integers(0, min(len(out), 2 * header)))
    data = bytes(out[:len(out) - cut])
    pos = draw(st.integers(0, len(data) + 3))
    limit = draw(st.integers(0, len(data) + 50))
    return data, pos, limit, header, at, big


PCAP_RECORD = capture_files.PCAP_RECORD["<"]  # the wire/ layout of a little-endian record header
HEADER, AT = PCAP_RECORD.size, splits._INCL_AT


def pcap_record(body: bytes) -> bytes:
    return PCAP_RECORD.pack({"ts_sec": 0, "ts_frac": 0, "incl_len": len(body),
                             "orig_len": len(body)}) + body


EMPTY_LAST = pcap_record(b"ab") + pcap_record(b"")


@settings(max_examples=400)
@given(record_streams())
@example((EMPTY_LAST, 0, 99, HEADER, AT, False))  # an empty record that ends the buffer exactly
@example((EMPTY_LAST[:-1], 0, 99, HEADER, AT, False))  # ... and one byte short of it
@example((EMPTY_LAST, HEADER + 2, HEADER + 3, HEADER, AT, False))  # one record may start
def test_same_as_the_definition(case: tuple[bytes, int, int, int, int, bool]) -> None:
    assert run(*case) == reference(*case)


@given(st.binary(max_size=300), st.integers(0, 310), st.booleans())
def test_arbitrary_bytes_with_the_pcap_record_layout(data: bytes, pos: int, big: bool) -> None:
    """The layout the decode uses (16-byte header, incl_len at 8), on bytes of any content."""
    assert run(data, pos, len(data), HEADER, AT, big) == reference(
        data, pos, len(data), HEADER, AT, big)


def test_accepts_any_buffer() -> None:
    record = pcap_record(b"abc")
    for buf in (record * 2, bytearray(record * 2), memoryview(record * 2)):
        assert run(buf, 0, 99, HEADER, AT, False) == (  # type: ignore[arg-type]
            [0, len(record)], 2 * len(record))


@pytest.mark.parametrize(("header", "at"), [(0, 0), (3, 0), (8, 5), (16, -1)])
def test_refuses_a_length_field_outside_the_header(header: int, at: int) -> None:
    with pytest.raises(ValueError, match="length field"):
        walk(b"\0" * 64, 0, 64, header, at, False, np.empty(100, np.int64))


def test_refuses_a_negative_start() -> None:
    with pytest.raises(ValueError, match="negative"):
        walk(b"\0" * 64, -1, 64, 16, 8, False, np.empty(100, np.int64))


def test_refuses_too_little_room_for_the_offsets() -> None:
    # 64 zero bytes are four empty 16-byte records: five slots are the worst case
    with pytest.raises(ValueError, match="room for 4 offsets; the walk may need 5"):
        walk(b"\0" * 64, 0, 64, 16, 8, False, np.empty(4, np.int64))
    assert walk(b"\0" * 64, 0, 64, 16, 8, False, np.empty(5, np.int64)) == (4, 64)


def test_refuses_a_read_only_output() -> None:
    with pytest.raises((TypeError, BufferError)):
        walk(b"\0" * 64, 0, 64, 16, 8, False, bytes(80))
