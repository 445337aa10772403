"""LBT-RU codec: struct and packet round trips, the fact sheet's example, bad input."""

from __future__ import annotations

from typing import Any

import construct as cs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wire.strategies import transport_packets, values_for
from tests.wire.transport_fuzz import check_mutations, check_parse_or_raise
from wire import lbtru
from wire.errors import WireError
from wire.lbmc import LbmcMessage, MessageType, Topicname, build_messages
from wire.lbtru import (
    CidOption,
    LbtruAck,
    LbtruCreq,
    LbtruData,
    LbtruNak,
    LbtruNcf,
    LbtruPacket,
    LbtruRst,
    LbtruSm,
    LbtruUnknown,
    NcfReason,
    Record,
    SidOption,
    TransportPacket,
    UnknownOption,
    parse_packet,
)

# --- strategies (read off the Construct definitions) -------------------------------------------

OPTION_CLASSES: list[type[Record]] = [SidOption, CidOption]


def record_of(cls: type[Any], *, skip: tuple[str, ...] = ("next_hdr",),
              **extra: Any) -> st.SearchStrategy[Any]:
    """An instance of a Record subclass with every non-computed member drawn at random."""
    return values_for(cls.struct, skip=skip).map(lambda v: cls(**v, **extra))


def at_least(n: int) -> settings:
    """``n`` examples, or more when the active profile (``fuzz``) asks for more."""
    return settings(max_examples=max(n, settings.default.max_examples))


UNKNOWN_CODES = st.integers(3, 255)
VERSIONS = st.integers(0, 15)


def unknown_options() -> st.SearchStrategy[UnknownOption]:
    return st.builds(lambda code, v: UnknownOption(code, **v), UNKNOWN_CODES,
                     values_for(lbtru.UnknownOpt, skip=("next_hdr",)))


def known_options() -> st.SearchStrategy[lbtru.LbtruOption]:
    return st.one_of(record_of(SidOption), record_of(CidOption))


def lbtru_packets(cls: type[LbtruPacket], *, unknown: bool = True, max_messages: int = 3,
                  lbmc: st.SearchStrategy[LbmcMessage] | None = None,
                  versions: st.SearchStrategy[int] = VERSIONS,
                  ) -> st.SearchStrategy[LbtruPacket]:
    """Random packets of one type: every member, options, LBMC payload (DATA) and trailer."""
    opts = st.one_of(known_options(), unknown_options()) if unknown else known_options()
    option_lists = st.lists(opts, max_size=3) if cls is not LbtruRst else st.just([])
    return transport_packets(cls, option_lists, versions=versions, max_messages=max_messages,
                             payload_messages=lbmc)


PACKET_TYPES = [LbtruData, LbtruSm, LbtruNak, LbtruNcf, LbtruAck, LbtruCreq, LbtruRst]
any_packet = st.sampled_from(PACKET_TYPES).flatmap(lbtru_packets)

STRUCTS: list[tuple[type[Record], cs.Struct]] = [
    (cls, cls.struct) for cls in [*PACKET_TYPES, SidOption, CidOption, UnknownOption]
]


# --- struct level -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, cs.ListContainer):
        return [_plain(v) for v in value]
    if isinstance(value, cs.Container):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("_")}
    return value


def _make(cls: type[Record], values: dict[str, Any]) -> Record:
    return UnknownOption(9, **values) if cls is UnknownOption else cls(**values)


@pytest.mark.parametrize("cls", [c for c, _ in STRUCTS], ids=lambda c: c.__name__)
@at_least(60)
@given(data=st.data())
def test_struct_round_trip_and_fast_path_agree(cls: type[Record], data: st.DataObject) -> None:
    """Construct and the codec's derived layouts agree byte for byte, both ways."""
    values = data.draw(values_for(cls.struct, skip=()))
    raw = cls.struct.build(values)
    parsed = _plain(cls.struct.parse(raw))
    assert cls.struct.build(parsed) == raw
    for name, value in values.items():
        assert parsed[name] == value, name
    decoded, used = cls.decode_values(raw, 0, len(raw))
    assert used == len(raw)
    assert cls.struct_values(decoded) == parsed
    assert cls.encode_values(decoded) == raw
    assert cls.encode_values(_make(cls, values).resolved()) == raw


def test_fixed_layouts_are_derived_from_the_structs() -> None:
    assert lbtru.DATA_FAST.size == 12
    assert LbtruSm.fast.size == 16 and LbtruAck.fast.size == 8
    assert LbtruCreq.fast.size == LbtruRst.fast.size == 4
    assert LbtruNak.fast.names[-2:] == ("num_naks", "format_word")
    assert SidOption.fast.size == CidOption.fast.size == 8


# --- packet level -------------------------------------------------------------------------------


@at_least(300)
@given(any_packet)
def test_packet_round_trip(packet: LbtruPacket) -> None:
    if isinstance(packet, LbtruRst) and packet.options:
        packet.allow_options = True
    raw = packet.build()
    again = parse_packet(raw)
    assert again == packet
    assert again.build() == raw
    lazy = parse_packet(raw, decode_lbmc=False)
    assert lazy.build() == raw
    if isinstance(packet, LbtruData):
        assert lazy.payload == ((build_messages(packet.messages()) + packet.trailer) or [])


@given(lbtru_packets(LbtruData))
def test_data_hot_path_agrees_with_the_full_parse(packet: LbtruData) -> None:
    raw = packet.build()
    ver_type, next_hdr, flags, sqn, trail = lbtru.data_header(raw)
    full = parse_packet(raw)
    assert (ver_type, next_hdr, flags, sqn, trail) == (
        full.ver_type, full.next_hdr, full.flags, full.sqn, full.trail_sqn)


@given(st.lists(known_options(), max_size=4))
def test_rst_options_need_explicit_consent(options: list[Any]) -> None:
    """Decision: tshark reads RST options at offset 2, so we refuse to emit them by default;
    with ``allow_options`` they go at offset 4 and parse back (flag set by the parser)."""
    rst = LbtruRst(reason=0, options=options)
    if options:
        with pytest.raises(WireError, match="RST options"):
            rst.build()
        rst.allow_options = True
    raw = rst.build()
    again = parse_packet(raw)
    assert isinstance(again, LbtruRst) and again == rst
    assert again.allow_options == bool(options)
    assert again.build() == raw
    assert all(not name.startswith("lbtru.opt") for name, _ in rst.tshark_fields())


def test_rst_options_are_at_offset_4() -> None:
    raw = LbtruRst(allow_options=True, options=[SidOption(session_id=0x42)]).build()
    assert raw == bytes.fromhex("07010000" "00080000 00000042".replace(" ", ""))


# --- the fact sheet's verified datagram (docs/wire-transports.md §7.1, frame 2) -------------------

FRAME2 = bytes.fromhex(
    "00 01 00 00 00 00 00 00 00 00 00 00 00 08 00 00"
    "00 00 12 34 00 05 00 23 00 00 00 01 00 00 00 00"
    "00 12 00 00 75 6d 65 2e 74 65 73 74 2e 74 6f 70"
    "69 63 68 65 6c 6c 6f"
)


def test_fact_sheet_frame_2_byte_for_byte() -> None:
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[Topicname(topic="ume.test.topic")],
                          payload=b"hello", tidx=1, sqn=0)
    packet = LbtruData(sqn=0, trail_sqn=0, options=[SidOption(session_id=0x1234)],
                       payload=[message])
    assert packet.build() == FRAME2
    parsed = parse_packet(FRAME2)
    assert parsed == packet
    assert isinstance(parsed, LbtruData)
    assert parsed.session_id == 0x1234 and parsed.client_id is None
    assert parsed.next_hdr == lbtru.OptionCode.SID
    assert parsed.messages()[0].header(Topicname).topic == "ume.test.topic"
    assert parsed.messages()[0].payload == b"hello"
    assert parsed.info() == "DATA sqn 0x0" and parsed.expert_items() == []
    assert ("lbtru.opt_sid.session_id", 0x1234) in parsed.tshark_fields()
    assert parsed.lbmc_tshark_fields() == [message.tshark_fields()]


# --- API details --------------------------------------------------------------------------------


def test_bit_views_and_computed_members() -> None:
    data = LbtruData(rx=1, sqn=5)
    assert data.flags == lbtru.FLAG_RX and data.rx == 1 and data.info() == "DATA(RX) sqn 0x5"
    sm = LbtruSm(syn=1, sm_sqn=2)
    assert sm.flags == 0x8000 and sm.info() == "SM sqn 0x2 SYN"
    assert sm.expert_items() == [("Chats", "SM SYN")]
    ncf = LbtruNcf(reason=NcfReason.RX_DELAY, format=0, ncfs=[1, 2])
    assert ncf.reason_format == 0x20 and ncf.expert_items() == [("Notes", "NCF Retransmit Delay")]
    assert ncf.header_values()["num_ncfs"] == 2 and ncf.info() == "NCF 2 ncfs"
    nak = LbtruNak(naks=[{"nak": 7}, 8])  # Construct's element form is accepted too
    assert nak.naks == [7, 8] and nak.build()[4:6] == b"\x00\x02"
    assert LbtruCreq(request=5).expert_items() == [("Chats", "CREQ Unknown (0x0005)")]
    assert LbtruRst().expert_items() == [("Chats", "RST Default")]
    assert LbtruAck(ack_sqn=3, options=[UnknownOption(9, data=b"abcd")]).expert_items() == [
        ("Chats", "ACK"), ("Errors", "Unrecognized header 0x09")]
    data.version = 3
    assert data.build()[0] == 0x30
    with pytest.raises(TypeError):
        LbtruData(bogus=1)
    with pytest.raises(AttributeError):
        _ = data.bogus
    with pytest.raises(ValueError):
        UnknownOption(0)


def test_session_id_is_the_last_sid() -> None:
    packet = LbtruAck(options=[SidOption(session_id=1), CidOption(client_id=9),
                               SidOption(session_id=2)])
    assert packet.session_id == 2 and packet.client_id == 9
    assert LbtruAck().session_id == 0


def test_explicit_lengths_and_chain_are_kept_for_crafting() -> None:
    raw = LbtruNak(naks=[1, 2], num_naks=7).build()
    assert raw[4:6] == b"\x00\x07" and len(raw) == 16
    with pytest.raises(WireError) as info:
        parse_packet(raw)
    assert (info.value.header, info.value.offset) == ("lbtru.nak", 4)
    raw = LbtruAck(options=[SidOption(session_id=1, hdr_len=0)]).build()
    with pytest.raises(WireError, match="hdr_len is zero") as info:
        parse_packet(raw)
    assert (info.value.header, info.value.offset) == ("lbtru.opt_sid", 9)
    raw = LbtruAck(next_hdr=0, options=[SidOption(session_id=1)]).build()
    assert parse_packet(raw).trailer == raw[8:]  # chain says "no options": bytes are trailer
    raw = LbtruAck(options=[SidOption(session_id=1, next_hdr=2)]).build()
    with pytest.raises(WireError) as info:
        parse_packet(raw)  # dangling chain: a CID announced but the datagram ends
    assert info.value.offset == 16


def test_unknown_options_round_trip_opaquely() -> None:
    packet = LbtruData(sqn=1, options=[UnknownOption(0x09, data=b"\x01\x02\x03\x04\x05"),
                                       SidOption(session_id=3, trailing=b"xy")])
    raw = packet.build()
    assert raw[1] == 0x09 and raw[13] == 9 and raw[12] == lbtru.OptionCode.SID
    again = parse_packet(raw)
    assert again == packet
    assert isinstance(again.options[0], UnknownOption) and again.options[0].code == 9
    assert again.options[1].trailing == b"xy"
    names = [n for n, _ in again.tshark_fields()]
    assert "lbtru.opt_unknown.hdr_len" in names and "lbtru.opt_unknown.data" not in names


def test_payload_only_on_data_and_raw_payload_crafting() -> None:
    with pytest.raises(WireError, match="only DATA"):
        LbtruSm(payload=[LbmcMessage()]).build()
    raw = LbtruData(payload=b"\x08\xff\x00\x00garbage").build()
    assert parse_packet(raw, decode_lbmc=False).payload == b"\x08\xff\x00\x00garbage"
    with pytest.raises(WireError) as info:
        parse_packet(raw)
    assert info.value.header.startswith("lbtru/lbmc") and info.value.offset == 14


def test_lbmc_errors_point_into_the_datagram() -> None:
    good = LbmcMessage(type=MessageType.MESSAGE, payload=b"x").build()
    raw = LbtruData(options=[SidOption()], payload=good + b"\x00\x00\x00\x00").build()
    with pytest.raises(WireError) as info:
        parse_packet(raw)
    assert info.value.offset == 20 + len(good) + 2  # msglen of the second message is zero
    assert "msglen" in info.value.reason


def test_short_tail_after_lbmc_is_kept_as_trailer() -> None:
    good = LbmcMessage(type=MessageType.MESSAGE, payload=b"x").build()
    raw = LbtruData(payload=good + b"\x01\x02").build()
    parsed = parse_packet(raw)
    assert parsed.trailer == b"\x01\x02" and len(parsed.messages()) == 1
    assert parsed.build() == raw


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ptype", [0x1, *range(0x8, 0x10)])
def test_unknown_types_are_rejected(ptype: int) -> None:
    raw = LbtruUnknown(type=ptype).build()
    assert raw == bytes([ptype, 0, 0, 0])
    with pytest.raises(WireError, match=f"type 0x{ptype:02x}") as info:
        parse_packet(raw + bytes(20))
    assert (info.value.header, info.value.offset) == ("lbtru", 0)


@pytest.mark.parametrize("cls", PACKET_TYPES, ids=lambda c: c.__name__)
def test_every_truncation_is_a_clean_error(cls: type[LbtruPacket]) -> None:
    kwargs: dict[str, Any] = {"options": [SidOption(session_id=1), CidOption(client_id=2)]}
    if cls is LbtruNak:
        kwargs["naks"] = [1, 2, 3]
    if cls is LbtruNcf:
        kwargs["ncfs"] = [4, 5]
    if cls is LbtruRst:
        kwargs["allow_options"] = True
    if cls is LbtruData:
        kwargs["payload"] = [LbmcMessage(type=MessageType.MESSAGE, payload=b"hello")]
    raw = cls(**kwargs).build()
    for cut in range(len(raw)):
        try:
            packet = parse_packet(raw[:cut])
        except WireError as exc:
            assert 0 <= exc.offset <= cut, (cut, exc)
            assert exc.header.startswith("lbtru")
        else:  # a cut that ends exactly on a boundary of the chain is still a datagram
            assert packet.build() == raw[:cut]


@pytest.mark.parametrize(("raw", "header", "offset", "reason"), [
    (b"", "lbtru", 0, "common header"),
    (b"\x00\x00\x00", "lbtru", 0, "common header"),
    (b"\x00\x00\x00\x00\x00\x00\x00", "lbtru.data", 0, "fixed layout"),
    (bytes.fromhex("02000000 00000001"), "lbtru.sm", 0, "fixed layout"),
    (bytes.fromhex("03000000 ffff0000 00000001"), "lbtru.nak", 4, "num_naks 65535"),
    (bytes.fromhex("04000000 00000000 00030000 00000001"), "lbtru.ncf", 8, "num_ncfs 3"),
    (bytes.fromhex("05010000 00000001 00080000"), "lbtru.opt_sid", 8, "fixed layout"),
    (bytes.fromhex("05020000 00000001 00060000 00000000"), "lbtru.opt_cid", 9, "shorter"),
    (bytes.fromhex("05090000 00000001 00030000"), "lbtru.opt_unknown", 9, "shorter"),
    (bytes.fromhex("05090000 00000001 00100000 00000000"), "lbtru.opt_unknown", 9, "past"),
    (bytes.fromhex("05090000 00000001 0004"), "lbtru.opt_unknown", 8, "fixed layout"),
    (bytes.fromhex("05090000 00000001 00"), "lbtru.opt_unknown", 8, "ends"),
    (bytes.fromhex("05090000 00000001"), "lbtru.opt_unknown", 8, "ends"),
    (bytes.fromhex("0501 0000 00000001 00000000 00000000"), "lbtru.opt_sid", 9, "zero"),
])
def test_bad_datagrams(raw: bytes, header: str, offset: int, reason: str) -> None:
    with pytest.raises(WireError, match=reason) as info:
        parse_packet(raw)
    assert (info.value.header, info.value.offset) == (header, offset)


@at_least(500)
@given(st.binary(max_size=120))
def test_random_bytes_parse_or_raise_wire_error(raw: bytes) -> None:
    check_parse_or_raise(parse_packet, raw)


@at_least(400)
@given(any_packet, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                            min_size=1, max_size=4), st.integers(0, 10_000))
def test_mutated_packets_parse_or_raise_wire_error(packet: LbtruPacket,
                                                   edits: list[tuple[int, int]],
                                                   cut: int) -> None:
    if isinstance(packet, LbtruRst):
        packet.allow_options = True
    check_mutations(parse_packet, packet.build(), edits, cut)


def test_parse_accepts_bytearray_and_memoryview() -> None:
    raw = LbtruNak(naks=[1, 2]).build()
    assert parse_packet(bytearray(raw)) == parse_packet(memoryview(raw)) == parse_packet(raw)


def test_base_classes_are_abstract_records() -> None:
    assert issubclass(LbtruPacket, TransportPacket)
    assert not hasattr(TransportPacket, "struct")
