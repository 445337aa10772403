"""LBT-RM codec: struct and packet round trips, options, bad input."""

from __future__ import annotations

from typing import Any

import construct as cs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.strategies import transport_packets, values_for
from tests.wire.test_lbtru import at_least
from tests.wire.transport_fuzz import check_mutations, check_parse_or_raise
from wire import lbtrm
from wire.errors import WireError
from wire.lbmc import LbmcMessage, MessageType, Topicname, build_messages
from wire.lbtrm import (
    FORMAT_PARITY,
    LbtrmData,
    LbtrmNak,
    LbtrmNcf,
    LbtrmOption,
    LbtrmPacket,
    LbtrmSm,
    LbtrmUnknown,
    NcfReason,
    parse_packet,
)
from wire.lbtru import Record

PACKET_TYPES = [LbtrmData, LbtrmSm, LbtrmNak, LbtrmNcf]
VERSIONS = st.integers(0, 15)


def rm_options() -> st.SearchStrategy[LbtrmOption]:
    return st.builds(lambda code, v: LbtrmOption(code, **v), st.integers(1, 255),
                     values_for(lbtrm.OptionStruct, skip=("next_hdr",)))


def lbtrm_packets(cls: type[LbtrmPacket], *, options: bool = True, max_messages: int = 3,
                  lbmc: st.SearchStrategy[LbmcMessage] | None = None,
                  versions: st.SearchStrategy[int] = VERSIONS) -> st.SearchStrategy[LbtrmPacket]:
    """Random packets of one type: every member, options, LBMC payload (DATA) and trailer.

    ``options=False`` (and version 0) gives packets tshark's heuristic accepts.
    """
    option_lists = st.lists(rm_options(), max_size=3) if options else st.just([])
    return transport_packets(cls, option_lists, versions=versions, max_messages=max_messages,
                             payload_messages=lbmc)


any_packet = st.sampled_from(PACKET_TYPES).flatmap(lbtrm_packets)


def _plain(value: Any) -> Any:
    if isinstance(value, cs.ListContainer):
        return [_plain(v) for v in value]
    if isinstance(value, cs.Container):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("_")}
    return value


@pytest.mark.parametrize("cls", [*PACKET_TYPES, LbtrmOption], ids=lambda c: c.__name__)
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
    record = LbtrmOption(1, **values) if cls is LbtrmOption else cls(**values)
    assert cls.encode_values(record.resolved()) == raw


def test_fixed_layouts_are_derived_from_the_structs() -> None:
    assert lbtrm.DATA_FAST.size == 20
    assert LbtrmSm.fast.size == 24
    assert LbtrmNak.fast.size == 12 and LbtrmNcf.fast.size == 16
    assert LbtrmOption.fast.size == 4


@at_least(300)
@given(any_packet)
def test_packet_round_trip(packet: LbtrmPacket) -> None:
    raw = packet.build()
    again = parse_packet(raw)
    assert again == packet
    assert again.build() == raw
    lazy = parse_packet(raw, decode_lbmc=False)
    assert lazy.build() == raw
    if isinstance(packet, LbtrmData):
        assert lazy.payload == ((build_messages(packet.messages()) + packet.trailer) or [])


@given(lbtrm_packets(LbtrmData))
def test_data_hot_path_agrees_with_the_full_parse(packet: LbtrmData) -> None:
    raw = packet.build()
    full = parse_packet(raw)
    resolved = full.resolved()
    assert lbtrm.data_header(raw) == tuple(resolved[n] for n in lbtrm.DATA_FAST.names)


def test_data_layout_byte_for_byte() -> None:
    """docs/wire-transports.md §2.2/§2.3: 8-byte header, 12-byte DATA body, then LBMC at 20."""
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[Topicname(topic="rm.topic")],
                          payload=b"hi", tidx=3, sqn=9)
    packet = LbtrmData(ucast_port=14390, session_id=0xDEADBEEF, sqn=1, trail_sqn=2, rx=1,
                       ucast_naks=1, flags_tgsz=0x12, fec_symbol=0x3456, payload=[message])
    raw = packet.build()
    assert raw[:20] == bytes.fromhex("0000 3836 deadbeef 00000001 00000002 a0 12 3456"
                                     .replace(" ", ""))
    assert raw[20:] == message.build()
    parsed = parse_packet(raw)
    assert parsed == packet and parsed.rx == 1 and parsed.ucast_naks == 1
    assert parsed.info() == "DATA(RX) sqn 0x1 Port 14390 ID 0xdeadbeef"
    assert parsed.expert_items() == [("Notes", "RX 0x00000001")]
    names = [n for n, _ in parsed.tshark_fields()]
    assert "lbtrm.data.flags_fec_type.rx" in names
    assert not any("late_join" in n or "mcast_naks" in n or "fec_type.fec" in n for n in names)


def test_nak_and_ncf_bodies() -> None:
    nak = LbtrmNak(ucast_port=14391, session_id=7, naks=[5, 6], format=FORMAT_PARITY)
    assert nak.build() == bytes.fromhex("0300 3837 00000007 0002 0001 00000005 00000006"
                                        .replace(" ", ""))
    assert nak.expert_items() == [("Warns", "NAK")] and nak.info().startswith("NAK 2 naks")
    ncf = LbtrmNcf(trail_sqn=4, reason=NcfReason.SHED, format=1, ncfs=[5])
    assert ncf.build()[8:] == bytes.fromhex("00000004 0001 00 31 00000005".replace(" ", ""))
    assert ncf.expert_items() == [("Notes", "NCF NAK Shed")]
    assert LbtrmNcf(reason=7).expert_items() == [("Notes", "NCF Unknown (0x07)")]
    assert LbtrmSm(sm_sqn=3).expert_items() == [("Chats", "SM")]


def test_options_are_chained_and_opaque() -> None:
    packet = LbtrmData(sqn=1, options=[LbtrmOption(0x05, data=b"abcd"),
                                       LbtrmOption(0x42, data=b"", res=0x8000)],
                       payload=[LbmcMessage(type=MessageType.MESSAGE, payload=b"x")])
    raw = packet.build()
    assert raw[1] == 0x05
    assert raw[20:32] == bytes.fromhex("42080000 61626364 00048000".replace(" ", ""))
    again = parse_packet(raw)
    assert again == packet and [o.code for o in again.options] == [0x05, 0x42]
    assert all(not n.startswith("lbtrm.opt") for n, _ in again.tshark_fields())


@pytest.mark.parametrize("ptype", [0x1, *range(0x5, 0x10)])
def test_unknown_types_are_rejected(ptype: int) -> None:
    raw = LbtrmUnknown(type=ptype, ucast_port=1, session_id=2).build()
    assert raw == bytes([ptype, 0, 0, 1, 0, 0, 0, 2])
    with pytest.raises(WireError, match=f"type 0x{ptype:02x}") as info:
        parse_packet(raw + bytes(20))
    assert (info.value.header, info.value.offset) == ("lbtrm", 0)


@pytest.mark.parametrize(("raw", "header", "offset", "reason"), [
    (b"", "lbtrm", 0, "common header"),
    (bytes(7), "lbtrm", 0, "common header"),
    (bytes(19), "lbtrm.data", 0, "fixed layout"),
    (bytes.fromhex("02000000 00000000") + bytes(15), "lbtrm.sm", 0, "fixed layout"),
    (bytes.fromhex("03000000 00000000 0003 0000 00000001"), "lbtrm.nak", 8, "num_naks 3"),
    (bytes.fromhex("04000000 00000000 00000000 0002 0000 00000001"), "lbtrm.ncf", 12,
     "num_ncfs 2"),
    (bytes.fromhex("03010000 00000000 0000 0000 0000"), "lbtrm.opt", 13, "zero"),
    (bytes.fromhex("03010000 00000000 0000 0000 0002 0000"), "lbtrm.opt", 13, "shorter"),
    (bytes.fromhex("03010000 00000000 0000 0000 0009 0000"), "lbtrm.opt", 13, "past"),
    (bytes.fromhex("03010000 00000000 0000 0000 00"), "lbtrm.opt", 12, "ends"),
    (bytes.fromhex("03010000 00000000 0000 0000 0004"), "lbtrm.opt", 12, "fixed layout"),
])
def test_bad_datagrams(raw: bytes, header: str, offset: int, reason: str) -> None:
    with pytest.raises(WireError, match=reason) as info:
        parse_packet(raw)
    assert (info.value.header, info.value.offset) == (header, offset)


def test_explicit_counts_and_chain_for_crafting() -> None:
    raw = LbtrmNcf(ncfs=[1], num_ncfs=0).build()
    parsed = parse_packet(raw)
    assert parsed.ncfs == [] and parsed.trailer == b"\x00\x00\x00\x01"
    raw = LbtrmSm(options=[LbtrmOption(3, hdr_len=0)]).build()
    with pytest.raises(WireError, match="hdr_len is zero") as info:
        parse_packet(raw)
    assert info.value.offset == 25
    bad_lbmc = LbtrmData(payload=b"\x00\x00\x00\x05\x00").build()
    with pytest.raises(WireError) as info:
        parse_packet(bad_lbmc)
    assert info.value.header.startswith("lbtrm/lbmc") and info.value.offset == 22


@pytest.mark.parametrize("cls", PACKET_TYPES, ids=lambda c: c.__name__)
def test_every_truncation_is_a_clean_error(cls: type[LbtrmPacket]) -> None:
    kwargs: dict[str, Any] = {"options": [LbtrmOption(1, data=b"abcd")]}
    if cls is LbtrmNak:
        kwargs["naks"] = [1, 2, 3]
    if cls is LbtrmNcf:
        kwargs["ncfs"] = [4, 5]
    if cls is LbtrmData:
        kwargs["payload"] = [LbmcMessage(type=MessageType.MESSAGE, payload=b"hello")]
    raw = cls(**kwargs).build()
    for cut in range(len(raw)):
        try:
            packet = parse_packet(raw[:cut])
        except WireError as exc:
            assert 0 <= exc.offset <= cut, (cut, exc)
            assert exc.header.startswith("lbtrm")
        else:
            assert packet.build() == raw[:cut]


@at_least(500)
@given(st.binary(max_size=120))
def test_random_bytes_parse_or_raise_wire_error(raw: bytes) -> None:
    check_parse_or_raise(parse_packet, raw)


@at_least(400)
@given(any_packet, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                            min_size=1, max_size=4), st.integers(0, 10_000))
def test_mutated_packets_parse_or_raise_wire_error(packet: LbtrmPacket,
                                                   edits: list[tuple[int, int]],
                                                   cut: int) -> None:
    check_mutations(parse_packet, packet.build(), edits, cut)


def test_api_errors() -> None:
    with pytest.raises(ValueError):
        LbtrmOption(0)
    with pytest.raises(TypeError):
        LbtrmSm(naks=[1])
    with pytest.raises(WireError, match="only DATA"):
        LbtrmNak(payload=[LbmcMessage()]).build()
    with pytest.raises(WireError, match="cannot encode"):
        LbtrmData(sqn=1 << 40).build()


def test_heuristic_acceptance() -> None:
    """docs/wire-transports.md §2.1: version 0, a defined type and next_hdr 0."""
    assert LbtrmData(sqn=1).heuristic_accepts()
    assert not LbtrmData(options=[LbtrmOption(1)]).heuristic_accepts()
    assert not LbtrmData(next_hdr=1).heuristic_accepts()
    assert not LbtrmSm(version=1).heuristic_accepts()
    assert not LbtrmUnknown(type=5).heuristic_accepts()


@at_least(200)
@given(any_packet)
def test_heuristic_content_test_matches_the_packet_view(packet: LbtrmPacket) -> None:
    """ump dissect's byte-level test (derived from the common header struct) agrees with the
    packet's own reading of tshark's heuristic."""
    raw = packet.build()
    assert lbtrm.heuristic_content_test(raw) == packet.heuristic_accepts()
    assert not lbtrm.heuristic_content_test(raw[: lbtrm.HEADER_SIZE - 1])
