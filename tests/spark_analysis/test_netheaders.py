"""The compiled header decode (spark_analysis/_netheaders.c) against the numpy version.

``framing._decode_network_numpy`` is the reference: the compiled decode must give the same
L4 view of every frame (protocol, addresses, ports, payload range, TCP sequence and flags,
fragment flag) and skip the same frames for the same reasons.  Frames are generated
header by header with the values the rules test (every supported link type, VLAN stacks,
IHL and TCP data offsets in and out of range, fragments, other protocols) and then cut
anywhere; arbitrary bytes under any link type come on top.  The argument checks stop a bad
call before it reads or writes out of bounds.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_analysis import arrow_build, columnar, framing, schemas
from spark_analysis.splits import SplitReader, plan
from wire import pcap
from wire.fastpath import FastLayout
from wire.tshark import PortMap

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"

netheaders = pytest.importorskip("spark_analysis._netheaders")

NETWORK_FIELDS = ("proto", "src", "dst", "sport", "dport", "pstart", "pend", "seq",
                  "tcp_flags", "fragment")
LINKTYPES = (pcap.LINKTYPE_ETHERNET, pcap.LINKTYPE_LINUX_SLL, pcap.LINKTYPE_LINUX_SLL2,
             pcap.LINKTYPE_NULL, pcap.LINKTYPE_RAW, pcap.LINKTYPE_IPV4, 12)


def test_the_compiled_decode_is_built_and_used() -> None:
    """The decode's speed figures assume the compiled header decode: a missing build must
    fail here, not go unnoticed (``pip install -e .`` builds it; it needs a C compiler)."""
    assert framing.NETWORK_DECODE == "compiled"
    assert framing._compiled_network is netheaders.decode


def test_every_parameter_comes_from_python_by_name() -> None:
    """The C side names its parameters; Python provides exactly those (no drift either
    way), in the C order."""
    params = framing._network_params()
    assert set(params) == set(netheaders.PARAMS)
    assert framing._NETWORK_PARAM_ARRAY.tolist() == [params[n] for n in netheaders.PARAMS]


def test_every_skip_reason_has_a_text() -> None:
    assert netheaders.REASONS[0] == "decoded"
    assert set(netheaders.REASONS[1:]) == set(framing._NETWORK_SKIPS)
    assert set(netheaders.OUTPUTS) == {*NETWORK_FIELDS, "status", "value"}


def test_a_layout_read_with_another_width_is_refused() -> None:
    with pytest.raises(TypeError, match="big-endian 4-byte"):
        framing._be_member(pcap.TCP, "sport", 4)
    assert framing._be_member(pcap.TCP, "seq", 4) == 4


# --- frames ---------------------------------------------------------------------------------
# Every header is packed through its wire/ layout (wire.pcap): random members, with the ones a
# rule tests fixed.  Only the null/loopback header, a bare host-order u32 that wire/ gives no
# layout, is packed here.


def packed(layout: FastLayout, **values: Any) -> bytes:
    """``layout`` with ``values``, its other members zero."""
    zeros = {name: 0 if size is None else bytes(size)
             for name, size in zip(layout.names, layout.sizes, strict=True)}
    return layout.pack({**zeros, **values})


@st.composite
def random_header(draw: st.DrawFn, layout: FastLayout, **fixed: Any) -> bytes:
    """``layout`` with arbitrary members except ``fixed``."""
    fields = layout.dtype().fields
    assert fields is not None
    values = {name: draw(st.binary(min_size=size, max_size=size)) if size is not None
              else draw(st.integers(0, 2 ** (8 * fields[name][0].itemsize) - 1))
              for name, size in zip(layout.names, layout.sizes, strict=True)}
    return layout.pack({**values, **fixed})


@st.composite
def link_headers(draw: st.DrawFn, linktype: int, ethertype: int) -> bytes:
    if linktype == pcap.LINKTYPE_ETHERNET:
        tags = draw(st.lists(st.sampled_from([0x8100, 0x88A8]), max_size=3))
        types = [*tags, ethertype]
        out = draw(random_header(pcap.ETH, ethertype=types[0]))
        for following in types[1:]:
            out += draw(random_header(pcap.VLAN, ethertype=following))
        return out
    if linktype == pcap.LINKTYPE_LINUX_SLL:
        return draw(random_header(pcap.SLL, protocol=ethertype))
    if linktype == pcap.LINKTYPE_LINUX_SLL2:
        return draw(random_header(pcap.SLL2, protocol=ethertype))
    if linktype == pcap.LINKTYPE_NULL:
        family = draw(st.sampled_from([2, 2, 24, 0x20000, draw(st.integers(0, 2**32 - 1))]))
        return struct.pack(draw(st.sampled_from(["<I", ">I"])), family)
    return b""  # raw IP: the IP header's version nibble decides


@st.composite
def frames(draw: st.DrawFn) -> tuple[int, bytes]:
    """A frame whose headers take the values the decode tests, cut anywhere (or not)."""
    linktype = draw(st.sampled_from([*LINKTYPES, *LINKTYPES, draw(st.integers(0, 300))]))
    ethertype = draw(st.sampled_from([0x0800, 0x0800, 0x0800, 0x86DD, 0]))
    out = draw(link_headers(linktype, ethertype))
    ihl = draw(st.sampled_from([5, 5, 5, 6, 4, 15, 0]))
    version = draw(st.sampled_from([4, 4, 4, 6]))
    protocol = draw(st.sampled_from([17, 6, 17, 6, 1, draw(st.integers(0, 255))]))
    flags_frag = draw(st.sampled_from([0, 0, 0x4000, 0x2000, 0x0001, 0x2001,
                                       draw(st.integers(0, 0xFFFF))]))
    if protocol == 6:
        words = draw(st.sampled_from([5, 5, 6, 4, 15, 0]))
        l4 = (draw(random_header(pcap.TCP,
                                 offset_flags=words << 12 | draw(st.integers(0, 0xFFF))))
              + bytes(max(0, 4 * words - pcap.TCP.size)))
    else:
        l4 = draw(random_header(pcap.UDP))
    l4 += draw(st.one_of(st.just(b""), st.binary(max_size=40)))  # often none: a pure ACK
    total = 4 * ihl + len(l4) + draw(st.sampled_from([0, 0, -3, 7, -4 * ihl - 1]))
    if draw(st.integers(0, 9)) == 0:
        total = draw(st.integers(0, 0xFFFF))
    ip = draw(random_header(pcap.IP4, ver_ihl=version << 4 | ihl,
                            total_length=max(0, min(total, 0xFFFF)), flags_frag=flags_frag,
                            protocol=protocol))
    out += ip + bytes(max(0, 4 * ihl - pcap.IP4.size)) + l4
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]
    return linktype, out


@st.composite
def junk_frames(draw: st.DrawFn) -> tuple[int, bytes]:
    return draw(st.sampled_from(LINKTYPES)), draw(st.binary(max_size=70))


def batch(items: list[tuple[int, bytes]], gaps: list[int]) -> framing.Frames:
    """The frames in one buffer with ``gaps`` bytes of filler between them (so the decode
    must keep to each frame's range)."""
    data, starts = bytearray(), []
    for (_, frame), gap in zip(items, gaps, strict=True):
        data += b"\xAA" * gap
        starts.append(len(data))
        data += frame
    n = len(items)
    binary = arrow_build.BinaryColumn(
        arrow_build.ByteView(np.frombuffer(bytes(data), np.uint8)), np.array(starts, np.int64),
        np.array([len(f) for _, f in items], np.int64))
    return framing.Frames(n, arrow_build.constant_strings("f.pcap", n),
                          np.arange(n, dtype=np.int64), pa.array(range(n), pa.int64()),
                          np.array([lt for lt, _ in items], np.int64), binary, "f.pcap")


def assert_same_decode(fr: framing.Frames) -> None:
    compiled_skips, numpy_skips = framing.Skips(), framing.Skips()
    compiled = framing.decode_network(fr, compiled_skips)
    # (both decodes give a fragment's identification with its VLAN ID; decode_network keys it)
    reference = framing._keyed(framing._decode_network_numpy(fr, numpy_skips))
    for name in NETWORK_FIELDS:
        assert getattr(compiled, name).tolist() == getattr(reference, name).tolist(), name
    assert compiled.fragment.dtype == reference.fragment.dtype
    assert (compiled_skips.table(fr.files, fr.file_offset).to_pylist()
            == numpy_skips.table(fr.files, fr.file_offset).to_pylist())


@st.composite
def batches(draw: st.DrawFn, frame: st.SearchStrategy[tuple[int, bytes]],
            ) -> framing.Frames:
    items = draw(st.lists(frame, max_size=25))
    gaps = draw(st.lists(st.integers(0, 3), min_size=len(items), max_size=len(items)))
    return batch(items, gaps)


UDP_FRAME = (pcap.LINKTYPE_ETHERNET, packed(pcap.ETH, ethertype=0x0800)
             + packed(pcap.IP4, ver_ihl=0x45, total_length=pcap.IP4.size + pcap.UDP.size,
                      ident=1, ttl=64, protocol=17, src="10.0.0.1", dst="239.0.0.1")
             + packed(pcap.UDP, sport=14400, dport=14401, length=pcap.UDP.size))
TCP_FRAME = (pcap.LINKTYPE_LINUX_SLL2, packed(pcap.SLL2, protocol=0x0800)
             + packed(pcap.IP4, ver_ihl=0x45, total_length=pcap.IP4.size + pcap.TCP.size,
                      ident=1, flags_frag=0x4000, ttl=64, protocol=6, src="10.0.0.1",
                      dst="10.0.0.2")
             + packed(pcap.TCP, sport=14371, dport=5000, seq=2**32 - 1,
                      offset_flags=5 << 12 | 0x18)
             + b"abc")  # past the IPv4 total length: not payload
UDP_LENGTH = len(UDP_FRAME[1])


@settings(max_examples=300)
@given(batches(frames()))
@example(batch([UDP_FRAME, TCP_FRAME], [0, 1]))
@example(batch([(pcap.LINKTYPE_ETHERNET, UDP_FRAME[1][:13]), (pcap.LINKTYPE_NULL, b"\2\0\0")],
               [0, 0]))  # a link header one byte short
@example(batch([(pcap.LINKTYPE_ETHERNET,
                 packed(pcap.ETH, ethertype=0x8100) + packed(pcap.VLAN, ethertype=0x0800))],
               [0]))  # a VLAN tag, then nothing
@example(batch([(TCP_FRAME[0], TCP_FRAME[1][:-3])], [0]))  # no payload: data offset = end
def test_same_as_numpy_on_header_by_header_frames(fr: framing.Frames) -> None:
    assert_same_decode(fr)


@settings(max_examples=200)
@given(batches(junk_frames()))
def test_same_as_numpy_on_arbitrary_bytes(fr: framing.Frames) -> None:
    assert_same_decode(fr)


def test_known_frames() -> None:
    """Two frames decoded by hand: what both versions must give."""
    fr = batch([UDP_FRAME, TCP_FRAME], [0, 1])
    net = framing.decode_network(fr, framing.Skips())
    tcp_start = UDP_LENGTH + 1
    assert net.proto.tolist() == [17, 6]
    assert net.src.tolist() == [0x0A000001, 0x0A000001]
    assert net.dst.tolist() == [0xEF000001, 0x0A000002]
    assert net.sport.tolist() == [14400, 14371] and net.dport.tolist() == [14401, 5000]
    # both payloads are empty: "abc" lies past the IPv4 total length
    udp_end = pcap.ETH.size + pcap.IP4.size + pcap.UDP.size
    tcp_end = tcp_start + pcap.SLL2.size + pcap.IP4.size + pcap.TCP.size
    assert net.pstart.tolist() == [udp_end, tcp_end]
    assert net.pend.tolist() == [udp_end, tcp_end]
    assert net.seq.tolist() == [0, 2**32 - 1] and net.tcp_flags.tolist() == [0, 0x18]
    assert net.fragment.tolist() == [False, False]


@pytest.mark.parametrize("name", ["qc3.pcap", "lossy-lbtrm.pcap", "restarts.pcap",
                                  "planted.pcap", "not-um.pcap"])
def test_the_whole_decode_is_the_same_with_the_numpy_version(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build without the C module (``_compiled_network`` is None) decodes every table of a
    real capture to the same rows."""
    options = schemas.DecodeOptions(PortMap(store_ports=[14567]))
    chunks = [(s.capture.name, chunk) for s in plan([str(CORPUS / name)], 64 << 10)
              for chunk in SplitReader(s).chunks()]
    assert chunks

    def decode_all() -> list[schemas.DecodedTables]:
        return [columnar.decode_chunk(file, chunk, options) for file, chunk in chunks]

    compiled = decode_all()
    monkeypatch.setattr(framing, "_compiled_network", None)
    reference = decode_all()
    for ours, theirs in zip(compiled, reference, strict=True):
        for table in ("packets", "messages", "advertisements", "skipped", "tcp_segments"):
            assert getattr(ours, table).equals(getattr(theirs, table)), table


# --- arguments ------------------------------------------------------------------------------

PARAMS = framing._NETWORK_PARAM_ARRAY


def call(data: bytes, starts: list[int], lengths: list[int], linktypes: list[int],
         out_rows: int | None = None, params: np.ndarray = PARAMS) -> np.ndarray:
    n = len(starts)
    out = np.full((out_rows or len(netheaders.OUTPUTS), n), -7, np.int64)
    netheaders.decode(data, np.array(starts, np.int64), np.array(lengths, np.int64),
                      np.array(linktypes, np.int64), params, out)
    return out


def test_every_output_item_is_written() -> None:
    n = UDP_LENGTH
    out = call(UDP_FRAME[1] * 2, [0, n], [n, n], [pcap.LINKTYPE_ETHERNET, 999])
    assert (out != -7).all()
    status = dict(zip(netheaders.OUTPUTS, out, strict=True))["status"]
    assert [netheaders.REASONS[s] for s in status] == ["decoded", "link"]


@pytest.mark.parametrize(("start", "length"), [(-1, 4), (0, -1), (UDP_LENGTH - 2, 3),
                                               (UDP_LENGTH + 1, 0), (0, UDP_LENGTH + 1)])
def test_refuses_a_frame_outside_the_data(start: int, length: int) -> None:
    with pytest.raises(ValueError, match=f"lies outside the {UDP_LENGTH} bytes"):
        call(UDP_FRAME[1], [0, start], [UDP_LENGTH, length], [1, 1])


def test_refuses_buffers_of_the_wrong_size() -> None:
    data = UDP_FRAME[1]
    rows = len(netheaders.OUTPUTS)
    with pytest.raises(ValueError, match="one length"):
        netheaders.decode(data, np.zeros(2, np.int64), np.zeros(1, np.int64),
                          np.zeros(2, np.int64), PARAMS, np.zeros((rows, 2), np.int64))
    with pytest.raises(ValueError, match="params must hold"):
        call(data, [0], [UDP_LENGTH], [1], params=PARAMS[:-1])
    with pytest.raises(ValueError, match="out must hold"):
        call(data, [0], [UDP_LENGTH], [1], out_rows=rows - 1)
    with pytest.raises((TypeError, BufferError)):
        netheaders.decode(data, np.zeros(1, np.int64), np.full(1, UDP_LENGTH, np.int64),
                          np.ones(1, np.int64), PARAMS, bytes(rows * 8))
