"""LBMR codec: round trips of every struct and of whole packets, and bad input.

The Hypothesis strategies here are read off the Construct definitions (via
:func:`tests.wire.strategies.values_for`); ``test_lbmr_oracle`` reuses them to draw packets
for tshark.  ``printable=True`` keeps names to printable ASCII (tshark escapes the rest) and
``known=True`` leaves out the kinds tshark warns about (unknown options, transports, types).
"""

from __future__ import annotations

import struct as pystruct
from typing import Any

import construct as cs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.wire.strategies import values_for
from wire import lbmr as L
from wire.errors import WireError
from wire.fields import Auto, members, value_kind

# Scaled from the active Hypothesis profile (tests/conftest.py): 30 examples by default,
# thousands under HYPOTHESIS_PROFILE=fuzz.
_BASE = settings.default.max_examples
SETTINGS = settings(max_examples=max(_BASE, 120), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RECORD_SETTINGS = settings(SETTINGS, max_examples=max(_BASE, 40))  # per class; 50 classes
MUTATION_SETTINGS = settings(SETTINGS, max_examples=max(_BASE, 250))

# --- strategies -----------------------------------------------------------------------------


def names(printable: bool, *, min_size: int = 0, max_size: int = 24) -> st.SearchStrategy[str]:
    """Names without NUL; printable ASCII when the text goes to tshark."""
    low, high = (0x21, 0x7E) if printable else (0x01, 0xFF)
    return st.text(st.characters(min_codepoint=low, max_codepoint=high),
                   min_size=min_size, max_size=max_size)


def record_of(cls: type[L.Record], *, printable: bool = False,
              **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[L.Record]:
    """A record with every non-computed member drawn from its Construct definition."""
    over: dict[str, st.SearchStrategy[Any]] = {}
    for member in members(cls.kind.struct):
        if member.name == "type" and cls.kind.code is not None:
            over["type"] = st.just(cls.kind.code)
        elif member.name == "trailing":
            over["trailing"] = st.binary(max_size=6)
        elif value_kind(member) == "text":
            over[member.name] = names(printable)
    over.update(overrides)
    return values_for(cls.kind.struct, skip=(), overrides=over).map(lambda v: cls(**v))


def topic_options(*, printable: bool = False, known: bool = False,
                  ) -> st.SearchStrategy[L.Record]:
    kinds = [record_of(cls, printable=printable) for cls in L.TOPIC_OPTIONS.values()]
    if not known:
        kinds.append(record_of(L.ToptUnknown, type=st.integers(0, 255).filter(
            lambda t: t not in L.TOPIC_OPTIONS)))
    return st.one_of(kinds)


def transport_infos(*, known: bool = False) -> st.SearchStrategy[L.Record]:
    kinds = [record_of(cls) for cls in L.TRANSPORTS.values()]
    if not known:
        unknown_codes = st.integers(0, 0x7F).filter(lambda c: c not in L.TRANSPORT_NAMES)
        kinds.append(st.builds(lambda code, data: L.OpaqueTransport(code, data=data),
                               st.sampled_from([L.TransportType.TCP6, L.TransportType.PGM])
                               | unknown_codes, st.binary(max_size=20)))
    return st.one_of(kinds)


@st.composite
def tirs(draw: st.DrawFn, *, printable: bool = False, known: bool = False) -> L.Record:
    options = draw(st.none() | st.lists(topic_options(printable=printable, known=known),
                                        max_size=5))
    return L.Tir(name=draw(names(printable)), ttl=draw(st.integers(0, 0xFFFF)),
                 index=draw(st.integers(0, 0xFFFFFFFF)), info=draw(transport_infos(known=known)),
                 options=options)


@st.composite
def qirs(draw: st.DrawFn, *, printable: bool = False, known: bool = False) -> L.Record:
    head = draw(values_for(L.QirHead, overrides={"qname": names(printable),
                                                  "tname": names(printable)}))
    return L.Qir(options=draw(st.none() | st.lists(topic_options(printable=printable,
                                                                 known=known), max_size=3)),
                 groups=draw(st.lists(record_of(L.QirGroup), max_size=3)),
                 queues=draw(st.lists(record_of(L.QirQueue), max_size=3)), **head)


@st.composite
def tmbs(draw: st.DrawFn, *, printable: bool = False, known: bool = False) -> L.Record:
    # tshark marks a TMB without TMRs malformed when it ends the body view: keep one for it.
    return L.Tmb(records=draw(st.lists(record_of(L.Tmr, printable=printable),
                                       min_size=1 if known else 0, max_size=4)))


@st.composite
def psers(draw: st.DrawFn, *, printable: bool = False, known: bool = False) -> L.Record:
    option = record_of(L.PserCtxinst, type=st.sampled_from(list(L.PserOptType)))
    if not known:
        option = option | record_of(L.PserOptUnknown, type=st.integers(2, 255))
    head = draw(values_for(L.PserStruct, overrides={"topic": names(printable)}))
    return L.Pser(options=draw(st.none() | st.lists(option, max_size=4)), **head)


QMGMT_IKA = bytes([0x00, 0x04]) + bytes(42)
"""An opaque queue-management body tshark decodes cleanly: flags 0, packet type 4 (instance
keepalive), zeros to the end of its 44-byte header, plus 2 bytes because tshark 4.0.17 starts
the packet options 2 bytes after that header (it counts ver_type/ext_type twice)."""


def ext_records(*, printable: bool = False, known: bool = False,
                ) -> st.SearchStrategy[L.Record]:
    # Gateway sub-bodies tshark parses cleanly: TRREQ with len 2, INTEREST with no records.
    tnwg_bodies = st.sampled_from([(L.TnwgType.TRREQ, b"\x00\x02"),
                                   (L.TnwgType.INTEREST, b"\x00\x04\x00\x00")])
    tnwg = tnwg_bodies.flatmap(lambda tb: record_of(L.Tnwg, type=st.just(tb[0]),
                                                    body=st.just(tb[1])))
    rctx_record = values_for(L.RctxRecord, overrides={"data": st.just(b"")} if known else None)
    kinds = [
        psers(printable=printable, known=known),
        record_of(L.CtxInfo, printable=printable),
        record_of(L.TopicResRequest),
        record_of(L.RemoteDomainRoute),
        record_of(L.RemoteCtxInfo, records=st.lists(rctx_record, max_size=4)),
        tnwg,
    ]
    if known:
        kinds.append(record_of(L.QueueMgmt, data=st.just(QMGMT_IKA)))
    else:
        kinds += [record_of(L.Tnwg), record_of(L.QueueMgmt),
                  st.integers(0, 255).filter(lambda t: t not in L.EXT_RECORDS).map(
                      lambda t: L.ExtUnknown(t))]
    return st.one_of(kinds)


def packet_options(*, known: bool = False) -> st.SearchStrategy[list[L.Record]]:
    kinds = [record_of(cls) for cls in L.PACKET_OPTIONS.values() if cls is not L.OptLen]
    if not known:
        kinds.append(record_of(L.OptUnknown, type=st.integers(0, 255).filter(
            lambda t: t not in L.PACKET_OPTIONS)))
    plain = st.lists(st.one_of(kinds), max_size=4)
    return st.one_of(
        plain,
        plain.map(lambda o: L.with_length_option(o, last=True)),
        plain.map(lambda o: L.with_length_option(o, last=False)),
    )


def _accidental_trim(packet: L.LbmrPacket) -> bool:
    """True when the last four bytes look like an option-length option by accident.

    tshark (and :func:`wire.lbmr.parse_packet`) would then shorten the body view, so such a
    packet is not the packet its fields describe.
    """
    data = packet.build()
    tail_is_optlen = bool(packet.options) and isinstance(packet.options[-1], L.OptLen)
    return (bool(data[0] & L.OPTS_FLAG) and not tail_is_optlen and len(data) > 4
            and data[-4] == 0x80 and data[-3] == 4)


@st.composite
def packets(draw: st.DrawFn, *, printable: bool = False, known: bool = False,
            ) -> L.LbmrPacket:
    """Well-formed packets of every type; ``known`` keeps to what tshark decodes silently."""
    types = [0, 1, 2, 3, 4, 6, 7] + ([] if known else [5])
    ptype = draw(st.sampled_from(types))
    packet = L.LbmrPacket(type=ptype, version=draw(st.integers(0, 1) if known
                                                   else st.integers(0, 15)))
    if ptype in (0, 1):
        query = (record_of(L.Tqr, printable=printable) if ptype == 0
                 else record_of(L.WcTqr, printable=printable,
                                pattern_type=st.sampled_from(list(L.PatternType))))
        packet.tqrs = draw(st.lists(query, max_size=3))
        packet.tirs = draw(st.lists(tirs(printable=printable, known=known), max_size=3))
    elif ptype == 6:
        packet.tqrs = draw(st.lists(record_of(L.Qqr, printable=printable), max_size=3))
        packet.tirs = draw(st.lists(qirs(printable=printable, known=known), max_size=2))
    elif ptype == 4:
        packet.tmb = draw(tmbs(printable=printable, known=known))
    elif ptype == 7:
        packet.ext = draw(ext_records(printable=printable, known=known))
    packet.options = draw(packet_options(known=known))
    if isinstance(packet.ext, L.QueueMgmt) and packet.options:
        # An opaque body is delimited only by a trailing option-length option.
        packet.options = L.with_length_option(
            [o for o in packet.options if not isinstance(o, L.OptLen)])
    if not packet.options and not isinstance(packet.ext, L.QueueMgmt) and not known:
        packet.trailer = draw(st.binary(max_size=6))
    if not known and ptype in (2, 3, 5):
        packet.tqr_count = draw(st.integers(0, 255))
        packet.tir_count = draw(st.integers(0, 0xFFFF))
    assume(not _accidental_trim(packet))
    return packet


# --- the definitions themselves --------------------------------------------------------------

ALL_RECORDS = L.record_classes()
LEAF_RECORDS = [c for c in ALL_RECORDS if c not in (L.Tir, L.Qir, L.Tmb, L.Pser)]


def _id(cls: type[L.Record]) -> str:
    return cls.__name__


@pytest.mark.parametrize("cls", ALL_RECORDS, ids=_id)
def test_record_attributes_are_the_construct_members(cls: type[L.Record]) -> None:
    """A record's fields are exactly its struct members; no bit view shadows a member."""
    member_names = {m.name for m in members(cls.kind.struct)}
    assert set(cls().values) == member_names
    assert not set(cls.kind.views) & member_names
    computed = {m.name for m in members(cls.kind.struct) if isinstance(m.subcon, Auto)}
    assert {k for k, v in cls().values.items() if v is None} == computed


@pytest.mark.parametrize("cls", LEAF_RECORDS, ids=_id)
@RECORD_SETTINGS
@given(data=st.data())
def test_record_round_trip(cls: type[L.Record], data: st.DataObject) -> None:
    """decode(encode(v)) == v, encode(decode(b)) == b, and Construct agrees with the codec."""
    record = data.draw(record_of(cls))
    raw = record.encode()
    back = cls.decode(raw, 0, len(raw))
    for extra in ("transport", "ext_type"):  # codes carried by the enclosing record
        if extra in getattr(cls, "__slots__", ()):
            setattr(back, extra, getattr(record, extra))
    assert back == record
    assert back.encode() == raw
    resolved = record.resolved()
    assert bytes(cls.kind.struct.build(resolved)) == raw
    parsed = cls.kind.struct.parse(raw)
    assert {m.name: L._plain(parsed[m.name]) for m in members(cls.kind.struct)} == resolved
    if cls.kind.fixed:  # the derived struct.Struct decodes the same values
        fast = cls.kind.prefix.decode(raw, 0)
        assert {k: resolved[k] for k in fast} == fast


COMPOSED = {"LbmrHeader": L.LbmrHeader, "ExtHeader": L.ExtHeader,
            "ToptLenStruct": L.ToptLenStruct, "TirHead": L.TirHead, "QirHead": L.QirHead,
            "PserStruct": L.PserStruct, "RctxRecord": L.RctxRecord, "RdrDomain": L.RdrDomain}


@pytest.mark.parametrize("struct_def", list(COMPOSED.values()), ids=list(COMPOSED))
@RECORD_SETTINGS
@given(data=st.data())
def test_struct_round_trip(struct_def: cs.Struct, data: st.DataObject) -> None:
    """The structs the codec composes by hand round-trip through Construct and the fast path."""
    values = data.draw(values_for(struct_def, skip=()))
    raw = struct_def.build(values)
    parsed = struct_def.parse(raw)
    assert bytes(struct_def.build(parsed)) == raw
    for name, value in values.items():
        assert parsed[name] == value


def test_fixed_tails_are_derived() -> None:
    """The fast decoders of TIR/QIR heads cover exactly the members after the names."""
    assert L.TIR_FIXED.names == ("transport", "tlen", "ttl", "index")
    assert L.QIR_FIXED.names == ("queue_id", "queue_ver", "queue_prev_ver", "grp_blks",
                                 "queue_blks")
    assert L.HEADER.size == 4 and L.EXT_HEADER.size == 2 and L.TOPT_LEN.size == 4


def test_layout_sizes_match_the_fact_sheet() -> None:
    sizes = {cls: cls.kind.min_size for cls in L.TOPIC_OPTIONS.values()}
    assert [sizes[L.TOPIC_OPTIONS[c]] for c in range(1, 15)] == [
        32, 16, 8, 24, 8, 4, 8, 36, 12, 12, 28, 12, 8, 16]
    assert {k: v.kind.min_size for k, v in L.PACKET_OPTIONS.items()} == {
        0x80: 4, 0x81: 12, 0x82: 4, 0x83: 8, 0x84: 8}
    assert sorted(L.TRANSPORTS) == sorted([(0x00, 6), (0x00, 10), (0x01, 6), (0x01, 10),
                                           (0x10, 16), (0x40, 10), (0x20, 10), (0x04, 10)])
    assert L.PserCtxinst.kind.min_size == 10


# --- the verified example (docs/wire-transports.md §7.1, frame 1) ---------------------------------

EXAMPLE_FRAME_1 = bytes.fromhex("""
    00 00 00 01 75 6d 65 2e 74 65 73 74 2e 74 6f 70
    69 63 00 81 0a 00 01 00 00 00 01 00 04 00 4c 01
    20 60 00 38 e7 38 37 7f 00 00 01 7f 00 00 01 00
    00 03 e8 00 00 00 01 00 00 00 00 00 00 00 00 02
    10 00 00 38 e7 00 00 7f 00 00 01 00 00 03 e8 03
    08 00 00 00 01 00 00 0e 10 00 00 38 37 00 00 7f
    00 00 01 00 00 00 03 7f 00 00 01 00 00 12 34 38
    2c""")
"""docs/wire-transports.md §7.1, frame 1: the UDP payload tshark decoded cleanly."""


def example_packet() -> L.LbmrPacket:
    """Frame 1 of the fact sheet, written with the API."""
    return L.LbmrPacket(tirs=[L.Tir(
        name="ume.test.topic", ttl=1, index=1,
        info=L.LbtruSidInfo(ip="127.0.0.1", session_id=0x1234, port=14380),
        options=[
            L.ToptUme(latejoin=1, store=1, store_tcp_port=14567, src_tcp_port=14391,
                      store_tcp_addr="127.0.0.1", src_tcp_addr="127.0.0.1", src_reg_id=1000,
                      transport_idx=1),
            L.ToptUmeStore(grp_idx=0, store_tcp_port=14567, store_idx=0,
                           store_ip_addr="127.0.0.1", src_reg_id=1000),
            L.ToptUmeStoreGroup(grp_idx=0, grp_sz=1),
            L.ToptExfunc(src_tcp_port=14391, src_ip_addr="127.0.0.1", ume=1, lj=1),
        ])])


def test_example_frame_built_byte_for_byte() -> None:
    assert len(EXAMPLE_FRAME_1) == 113
    assert example_packet().build() == EXAMPLE_FRAME_1


def test_example_frame_parsed_back() -> None:
    packet = L.parse_packet(EXAMPLE_FRAME_1)
    assert packet == example_packet()
    tir = packet.tirs[0]
    assert isinstance(tir, L.Tir)
    assert (tir.name, tir.tlen, tir.transport_type, tir.transport_opts) == (
        "ume.test.topic", 10, 1, 1)
    assert L.LbmrPacket.parse(EXAMPLE_FRAME_1) == packet
    assert tir.opt_total_len is None and tir.options is not None
    assert L.Tir(name="x", info=tir.info, options=tir.options).encode()[2:5] == b"\x81\x0a\x00"
    ume = tir.options[0]
    assert (ume.flags, ume.store, ume.latejoin, ume.src_reg_id) == (0x6000, 1, 1, 1000)
    assert isinstance(tir.info, L.LbtruSidInfo) and tir.info.session_id == 0x1234
    assert packet.info() == "TQRs 0 TIRs 1"
    fields = dict(packet.tshark_fields())
    assert fields["lbmr.topt.len.total_len"] == 76
    assert fields["lbmr.topt.exfunc.functionality_flags.ume"] == 1
    assert fields["lbmr.tir.lbtru.port"] == 14380


# --- packets ---------------------------------------------------------------------------------


@SETTINGS
@given(packets())
def test_packet_round_trip(packet: L.LbmrPacket) -> None:
    raw = packet.build()
    back = L.parse_packet(raw)
    assert back == packet
    assert back.build() == raw
    assert back.tshark_fields() == packet.tshark_fields()


@SETTINGS
@given(st.binary(max_size=120))
def test_random_bytes_give_a_packet_or_wire_error(raw: bytes) -> None:
    try:
        packet = L.parse_packet(raw)
    except WireError as exc:
        assert 0 <= exc.offset <= len(raw) and exc.header.startswith("lbmr") and exc.reason
        return
    assert packet.build() == raw  # everything accepted round-trips byte for byte


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(packets()).build())
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "cut", "grow", "set"]))
        if action == "cut" and raw:
            del raw[draw(st.integers(0, len(raw) - 1)):]
        elif action == "grow":
            raw += draw(st.binary(min_size=1, max_size=8))
        elif raw:
            at = draw(st.integers(0, len(raw) - 1))
            raw[at] = (raw[at] ^ draw(st.integers(1, 255)) if action == "flip"
                       else draw(st.sampled_from([0, 1, 4, 0x80, 0xFF])))
    return bytes(raw)


@MUTATION_SETTINGS
@given(mutated())
def test_mutated_packets_give_a_packet_or_wire_error(raw: bytes) -> None:
    try:
        packet = L.parse_packet(raw)
    except WireError as exc:
        assert 0 <= exc.offset <= len(raw) and exc.header.startswith("lbmr")
        return
    assert packet.build() == raw


def test_every_packet_type_has_a_body_codec() -> None:
    keepalive = L.LbmrPacket()
    assert keepalive.build() == b"\x00\x00\x00\x00"
    assert keepalive.info() == "Unicast Resolver Keepalive"
    assert L.LbmrPacket(type=L.PacketType.SRC_ALIVE).info() == "Source Alive"
    assert L.LbmrPacket(type=L.PacketType.RCV_ALIVE).info() == "Receiver Alive"
    assert L.LbmrPacket(type=4, tmb=L.Tmb()).info() == "Topic Management"
    assert L.LbmrPacket(type=6).info() == "QQRs 0 QIRs 0"
    assert L.LbmrPacket(type=7, ext=L.Pser()).info() == "ExtType Proxy Source Election"
    assert L.LbmrPacket(type=7, ext=L.ExtUnknown(9)).info() == "ExtType Unknown(0x09)"
    # Type 5 is undefined: the counts are kept, nothing is parsed.
    odd = L.parse_packet(b"\x05\x02\x00\x03junk")
    assert (odd.tqr_count, odd.tir_count, odd.trailer) == (2, 3, b"junk")


def test_wildcard_tqr_pattern_display_quirk() -> None:
    packet = L.LbmrPacket(type=L.PacketType.WC_TQR,
                          tqrs=[L.WcTqr(pattern_type=L.PatternType.PCRE, pattern="^ume\\..*")])
    assert packet.build() == b"\x01\x01\x00\x00\x01^ume\\..*\x00"
    assert ("lbmr.tqr.pattern", "\x01^ume\\..*") in packet.tshark_fields()


def test_ext_records_compute_their_lengths() -> None:
    pser = L.Pser(topic="t", options=[L.PserCtxinst(type=0, ctxinst=b"A" * 8)])
    raw = L.LbmrPacket(type=7, ext=pser).build()
    assert raw[:8] == b"\x07\x01\x00\x00\x00\x1d\x80\x00"  # len 29 = 28 + topic, option flag
    assert raw[29:33] == b"\x00\x00\x00\x0e"  # optlen = 4 + one 10-byte option
    ctx = L.CtxInfo(name="store1\0", name_flag=1, port=14567)
    assert L.LbmrPacket(type=7, ext=ctx).build()[2] == 27
    assert dict(L.LbmrPacket(type=7, ext=ctx).tshark_fields())["lbmr.ctxinfo.name"] == "store1\0"
    assert "lbmr.ctxinfo.name" not in dict(L.CtxInfo(name="x").tshark_fields())
    rdr = L.RemoteDomainRoute(domains=[{"domain": 5}, {"domain": 6}])
    assert rdr.resolved()["length"] == 24 and rdr.num_domains == 2


def test_explicit_lengths_craft_invalid_packets() -> None:
    """Computed members can be overridden; the result is what tshark would call broken."""
    bad_tlen = L.LbmrPacket(tirs=[L.Tir(name="t", info=L.TcpInfo(), tlen=7)])
    with pytest.raises(WireError) as info:
        L.parse_packet(bad_tlen.build())
    assert info.value.header == "lbmr.tir.tcp" and "wrong transport length 7" in info.value.reason
    zero = L.LbmrPacket(tirs=[L.Tir(name="t", info=L.TcpInfo(),
                                    options=[L.ToptCost(len=0)])]).build()
    with pytest.raises(WireError) as info:
        L.parse_packet(zero)
    assert info.value.header == "lbmr.topt.cost" and info.value.reason == "zero-length option"
    assert info.value.offset == 4 + 2 + 8 + 4 + 1  # header, "t\0", TIR fixed, block header, type
    counts = L.LbmrPacket(tqrs=[L.Tqr(name="a")], tqr_count=2).build()
    assert counts[1] == 2
    with pytest.raises(WireError):
        L.parse_packet(counts)
    wrong_total = L.LbmrPacket(tirs=[L.Tir(name="t", info=L.TcpInfo(), options=[],
                                           opt_total_len=3)]).build()
    with pytest.raises(WireError, match="total_len 3"):
        L.parse_packet(wrong_total)


BAD_INPUTS: list[tuple[str, bytes, str, int]] = [
    ("empty", b"", "lbmr.hdr", 0),
    ("short header", b"\x00\x01\x00", "lbmr.hdr", 0),
    ("short ext header", b"\x07", "lbmr.hdr", 0),
    ("TQR without NUL", b"\x00\x01\x00\x00abc", "lbmr.tqr", 4),
    ("missing TQR", b"\x00\x01\x00\x00", "lbmr.tqr", 4),
    ("TIR name without NUL", b"\x00\x00\x00\x01topic", "lbmr.tir", 4),
    ("TIR truncated after name", b"\x00\x00\x00\x01t\x00\x00\x06", "lbmr.tir", 6),
    ("TIR transport info truncated",
     b"\x00\x00\x00\x01t\x00\x01\x0a\x00\x01\x00\x00\x00\x01" + b"\x7f\x00", "lbmr.tir", 14),
    ("LBT-RM with tlen 10",
     b"\x00\x00\x00\x01t\x00\x10\x0a\x00\x01\x00\x00\x00\x01" + bytes(10), "lbmr.tir.lbtrm", 14),
    ("options header not type 0/len 4",
     b"\x00\x00\x00\x01t\x00\x80\x00\x00\x00\x00\x00\x00\x00\x05\x04\x00\x04",
     "lbmr.topt.len", 14),
    ("option longer than the block",
     b"\x00\x00\x00\x01t\x00\x80\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x08"
     b"\x07\x08\x00\x00", "lbmr.topt.cost", 19),
    ("known option shorter than its layout",
     b"\x00\x00\x00\x01t\x00\x80\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x08"
     b"\x01\x04\x00\x00", "lbmr.topt.ume", 19),
    ("unknown packet option len 2", b"\x08\x00\x00\x00\x99\x02", "lbmr.opt.unknown", 5),
    ("truncated packet option", b"\x08\x00\x00\x00\x83\x08\x00\x00", "lbmr.opt.version", 4),
    ("PSER len below 28", b"\x07\x01\x00\x00\x00\x10" + bytes(30), "lbmr.pser", 4),
    ("PSER options past the end",
     b"\x07\x01\x00\x00\x00\x1c\x80\x00" + bytes(20) + b"\x00\x00\x00\x30",
     "lbmr.pser.opt.optlen", 30),
    ("context info len below 20", b"\x07\x03\x10\x00" + bytes(20), "lbmr.ctxinfo", 2),
    ("TMR len below 5", b"\x04\x00\x00\x00\x00\x0a\x00\x01\x00\x02\x01\x00", "lbmr.tmb.tmr", 8),
    ("TMR name without NUL", b"\x04\x00\x00\x00\x00\x0d\x00\x01\x00\x09\x01\x00topic",
     "lbmr.tmb.tmr", 12),
    ("QIR truncated", b"\x06\x00\x00\x01q\x00t\x00\x00\x00", "lbmr.qir", 8),
]


@pytest.mark.parametrize(("label", "raw", "header", "offset"), BAD_INPUTS,
                         ids=[b[0] for b in BAD_INPUTS])
def test_bad_input(label: str, raw: bytes, header: str, offset: int) -> None:
    with pytest.raises(WireError) as info:
        L.parse_packet(raw)
    assert (info.value.header, info.value.offset) == (header, offset), info.value
    assert info.value.reason


def test_option_length_option_first_or_last() -> None:
    """Both placements parse; only the last one shortens the body view (as in tshark)."""
    opts = [L.OptSrcType(src_type=L.SourceType.STORE), L.OptVersion(ume=1)]
    for last in (True, False):
        packet = L.LbmrPacket(tqrs=[L.Tqr(name="t")],
                              options=L.with_length_option(opts, last=last))
        raw = packet.build()
        assert L.parse_packet(raw) == packet
        optlen = raw.index(b"\x80\x04")
        assert raw[optlen + 2:optlen + 4] == pystruct.pack(">H", 16)
    # A trailing length option shortens the body view by its total_len, so with a
    # total_len one too large the TQR's NUL falls outside the body: tshark's malformed case.
    tail = L.OptSrcType().encode()
    good = b"\x08\x01\x00\x00abc\x00" + tail + L.OptLen(total_len=8).encode()
    assert L.parse_packet(good).tqrs == [L.Tqr(name="abc")]
    with pytest.raises(WireError) as info:
        L.parse_packet(b"\x08\x01\x00\x00abc\x00" + tail + L.OptLen(total_len=9).encode())
    assert (info.value.header, info.value.offset) == ("lbmr.tqr", 4)


def test_known_packet_options_step_by_their_size() -> None:
    """tshark ignores the len byte of known packet options; so do we (and keep it)."""
    raw = b"\x08\x00\x00\x00" + b"\x82\x09\x00\x02" + b"\x84\x08\x00\x00\x00\x00\x00\x07"
    packet = L.parse_packet(raw)
    assert [type(o) for o in packet.options] == [L.OptSrcType, L.OptLocalDomain]
    assert packet.options[0].len == 9 and packet.build() == raw


def test_build_refuses_what_cannot_be_encoded() -> None:
    with pytest.raises(WireError):
        L.LbmrPacket(tqrs=[L.Tqr(name="a\0b")]).build()
    with pytest.raises(WireError):
        L.LbmrPacket(tqrs=[L.WcTqr(pattern="x")]).build()  # wildcard TQR in a NORMAL packet
    with pytest.raises(WireError):
        L.LbmrPacket(type=7).build()
    with pytest.raises(WireError):
        L.LbmrPacket(type=7, ext=L.ToptUme()).build()
    with pytest.raises(WireError):
        L.LbmrPacket(type=4).tshark_fields()
    with pytest.raises(WireError):
        L.LbmrPacket(version=16).build()
    with pytest.raises(WireError):
        L.LbmrPacket(tirs=[L.Tir(name="t", info=L.TcpInfo(ip="300.1.1.1"))]).build()
    with pytest.raises(WireError):
        L.LbmrPacket(tqrs=[L.Tqr(name="t")] * 256).build()


def test_bit_views_read_and_write_members() -> None:
    ume = L.ToptUme(store=1, acktosrc=1)
    assert ume.flags == 0x2800 and ume.ignore == 0
    ume.ignore = 1
    assert ume.flags == 0xA800
    domain = L.ToptDomainId(flags=0x8012)
    assert domain.ignore == 1 and dict(domain.tshark_fields())["lbmr.topt.domain_id.flags"] == 0x80
    assert "lbmr.topt.domain_id.flags.ignore" not in dict(domain.tshark_fields())
    unknown = L.ToptUnknown(type=0x33, flags=0xABCD)
    assert dict(unknown.tshark_fields())["lbmr.topt.unknown.flags"] == 0xCD
    assert "lbmr.topt.unknown.data" not in dict(unknown.tshark_fields())

