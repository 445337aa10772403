"""The Scapy layers agree with the Construct codec, and are derived from it (no second layout)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import construct as cs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.fields import (
    ConditionalField,
    Field,
    FieldListField,
    PacketListField,
    StrField,
    StrFixedLenField,
)
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Padding, Raw, raw
from scapy.utils import rdpcap

from tests.wire.strategies import header_of, messages, values_for
from wire import lbmc
from wire import scapy_layers as sl
from wire.errors import WireError
from wire.fields import Auto, fixed_format, members, unwrap
from wire.lbttcp import frame_messages
from wire.pcap import TcpConversation, udp_frame, write_pcap

try:  # the LBMR codec's own strategy (written with wire/lbmr.py)
    from tests.wire.test_lbmr import packets as lbmr_packets
except ImportError:  # pragma: no cover - wire.lbmr missing
    lbmr_packets = None

KINDS = lbmc.header_kinds()
FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _kind_id(kind: lbmc.HeaderKind) -> str:
    return kind.name


def _scapy_size(fld: Field[Any, Any]) -> int | None:
    """Bytes a field takes on the wire, or None when its length depends on other fields."""
    fld = fld.fld if isinstance(fld, ConditionalField) else fld
    if isinstance(fld, StrFixedLenField):
        return int(fld.length_from(None))
    if isinstance(fld, StrField | PacketListField | FieldListField):  # sized by other members
        return None
    return int(fld.sz)


def _construct_size(member: cs.Construct) -> int | None:
    letter = fixed_format(member)
    return None if letter is None else struct.calcsize(">" + letter)


def _assert_mirrors(struct_def: cs.Struct, layer: type[Packet]) -> None:
    """fields_desc has exactly the struct's members, in order, with the same sizes."""
    fields = layer.fields_desc
    assert [f.name for f in fields] == [m.name for m in members(struct_def)]
    for fld, member in zip(fields, members(struct_def), strict=True):
        assert _scapy_size(fld) == _construct_size(member), member.name
        plain = fld.fld if isinstance(fld, ConditionalField) else fld
        if isinstance(member.subcon, Auto):
            assert plain.default is None, f"{member.name} is computed, so defaults to None"
        inner = unwrap(member)
        if isinstance(inner, cs.Array):
            assert isinstance(plain, PacketListField | FieldListField)
            if isinstance(inner.subcon, cs.Struct):
                _assert_mirrors(inner.subcon, plain.cls)


# --- derivation ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=_kind_id)
def test_fields_desc_is_read_off_the_construct_struct(kind: lbmc.HeaderKind) -> None:
    layer = sl.layer_for_code(kind.code)
    assert layer.ump_struct is kind.struct
    assert layer.ump_code == kind.code
    assert kind.struct is not None
    _assert_mirrors(kind.struct, layer)
    if kind.fixed:  # a default layer is exactly the fixed layout
        assert kind.fast is not None
        assert len(raw(layer())) == kind.fast.size


def test_every_code_tshark_knows_has_a_layer() -> None:
    layers = sl.lbmc_layers()
    assert set(layers) == {k.code for k in KINDS} | set(lbmc.KNOWN_CODES)
    names = [cls.__name__ for cls in layers.values()]
    assert len(set(names)) == len(names)
    assert sl.LBMC_UmePreg is layers[0x12]  # type: ignore[attr-defined]
    assert sl.layer_for_code(0x99) is sl.LBMC_Unknown
    for code in lbmc.KNOWN_CODES:
        _assert_mirrors(sl.OPAQUE_STRUCT, layers[code])


def test_base_layer_is_read_off_the_data_header() -> None:
    _assert_mirrors(lbmc.DataHeader, sl.LBMC)
    control = {m.name for m in members(lbmc.ControlHeader)}
    conditional = {f.name for f in sl.LBMC.fields_desc if isinstance(f, ConditionalField)}
    assert conditional == {m.name for m in members(lbmc.DataHeader)} - control
    assert len(raw(sl.LBMC(ver_type=lbmc.MessageType.CONTROL, tidx=5))) == 4
    for mtype in lbmc.DATA_TYPES:
        assert len(raw(sl.LBMC(ver_type=mtype))) == lbmc.DATA_BASE.size


def test_variable_lengths_evaluate_the_construct_expression() -> None:
    # Topicname: text(this.hdr_len - size); a crafted hdr_len decides what is read.
    pkt = sl.LBMC(raw(sl.LBMC() / sl.LBMC_Topicname(hdr_len=6, topic="abcdef")))
    assert pkt[sl.LBMC_Topicname].topic == b"ab"  # type: ignore[attr-defined]
    # Tsni: Array((this.hdr_len - 4) // 8, record) and trailing (this.hdr_len - 4) % 8.
    tsni = sl.LBMC(raw(sl.LBMC() / sl.LBMC_Tsni(hdr_len=23, records=[  # type: ignore[attr-defined]
        sl.LBMC_Tsni_records(tidx=1, sqn=2), sl.LBMC_Tsni_records(tidx=3, sqn=4)],  # type: ignore[attr-defined]
        trailing=b"xyz")))[sl.LBMC_Tsni]  # type: ignore[attr-defined]
    assert [(r.tidx, r.sqn) for r in tsni.records] == [(1, 2), (3, 4)]
    assert tsni.trailing == b"xyz"


def test_bit_views_are_attributes() -> None:
    preg = sl.LBMC_UmePreg(s_flag=1, marker=2, w_flag=1)  # type: ignore[attr-defined]
    assert preg.marker_byte == 0x82 and preg.flags == 0x10
    preg.d_flag = 1
    assert preg.flags == 0x18 and preg.d_flag == 1 and preg.ignore == 0
    base = sl.LBMC(ver_type=0x0A)
    assert base.type == lbmc.MessageType.RETRANS and base.version == 0
    assert "w_flag=1" in preg.show(dump=True)


# --- agreement with wire.lbmc ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=_kind_id)
@FAST
@given(data=st.data())
def test_each_header_kind_matches_wire_lbmc(kind: lbmc.HeaderKind, data: st.DataObject) -> None:
    header = data.draw(header_of(kind))
    mtype = data.draw(st.sampled_from(list(lbmc.MessageType)))
    message = lbmc.LbmcMessage(type=mtype, headers=[header], tidx=7, sqn=9)
    wire_bytes = message.build()
    parsed, _ = lbmc.parse_message(wire_bytes)

    # bytes built by wire.lbmc dissect in Scapy with the same values
    pkt = sl.LBMC(wire_bytes)
    layer = pkt[sl.layer_for_code(kind.code)]
    first = parsed.headers[0]
    assert isinstance(first, lbmc.Header)
    assert sl.construct_values(layer) == first.wire_values(parsed.chain_end())
    assert raw(pkt) == wire_bytes

    # a Scapy-crafted header (only the member values set) parses back with wire.lbmc
    crafted = sl.LBMC(ver_type=mtype) / sl.from_values(sl.layer_for_code(kind.code),
                                                       header.values)
    back, used = lbmc.parse_message(raw(crafted))
    assert used == len(raw(crafted))
    assert back.headers == [header]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_whole_messages_round_trip(message: lbmc.LbmcMessage) -> None:
    wire_bytes = message.build()
    parsed, _ = lbmc.parse_message(wire_bytes)
    pkt = sl.LBMC(wire_bytes)
    assert sl.to_message(pkt) == parsed
    assert raw(pkt) == wire_bytes
    # Scapy layers made field by field (lengths, chain codes left to Scapy) give the same bytes
    crafted = sl.to_scapy(message)
    assert raw(crafted) == wire_bytes
    assert lbmc.parse_message(raw(crafted))[0] == parsed


OPAQUE_CODES = sorted(lbmc.OPAQUE_MIN_LEN)


@pytest.mark.parametrize("code", OPAQUE_CODES)
def test_opaque_known_codes(code: int) -> None:
    # at least the code's minimum hdr_len (wire.lbmc refuses shorter opaque headers)
    data = b"\x80\x00abc".ljust(lbmc.OPAQUE_MIN_LEN[code] - 2, b"z")
    message = lbmc.LbmcMessage(headers=[lbmc.OpaqueHeader(code, data),
                                        lbmc.UmeStoreid(store_id=5)])
    wire_bytes = message.build()
    pkt = sl.LBMC(wire_bytes)
    layer = pkt[sl.layer_for_code(code)]
    assert layer.data == data and layer.hdr_len == len(data) + 2
    assert pkt[sl.LBMC_UmeStoreid].store_id == 5  # type: ignore[attr-defined]
    assert sl.to_message(pkt) == lbmc.parse_message(wire_bytes)[0]
    crafted = sl.LBMC() / sl.layer_for_code(code)(data=data) / sl.LBMC_UmeStoreid(  # type: ignore[attr-defined]
        store_id=5)
    assert raw(crafted) == wire_bytes


@pytest.mark.parametrize("code", OPAQUE_CODES)
def test_opaque_layer_defaults_to_the_minimum_length(code: int) -> None:
    """A default opaque layer is what lbmc.OpaqueHeader(code) builds: the code's minimum."""
    default = raw(sl.LBMC() / sl.layer_for_code(code)())
    assert default == lbmc.LbmcMessage(headers=[lbmc.OpaqueHeader(code)]).build()
    assert default[5] == lbmc.OPAQUE_MIN_LEN[code]
    assert lbmc.parse_message(default)[0].headers == [lbmc.OpaqueHeader(code)]
    # one byte short: Scapy dissects it (no validation), wire.lbmc refuses it as tshark does
    short = raw(sl.LBMC() / sl.layer_for_code(code)(data=bytes(lbmc.OPAQUE_MIN_LEN[code] - 3))
                / sl.LBMC_UmeStoreid())  # type: ignore[attr-defined]
    assert sl.LBMC(short)[sl.layer_for_code(code)].hdr_len == lbmc.OPAQUE_MIN_LEN[code] - 1
    with pytest.raises(WireError) as info:
        lbmc.parse_message(short)
    assert (info.value.header, info.value.offset) == (lbmc.KNOWN_CODES[code][1], 4)


def test_chain_ends_trailer_and_next_message() -> None:
    ctl = lbmc.LbmcMessage(headers=[lbmc.UmeAck(seqnum=3)], terminator=0xFF, trailer=b"zz")
    data = lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE, payload=b"hello", tidx=1, sqn=2)
    pkt = sl.LBMC(ctl.build() + data.build())
    assert pkt[sl.LBMC_Trailer].load == b"zz"
    assert pkt[Padding].load == data.build()  # the next message is not part of this one
    nxt = sl.LBMC(pkt[Padding].load)
    assert nxt.tidx == 1 and nxt.sqn == 2 and nxt[Raw].load == b"hello"
    # a chain that runs out with fewer than 4 bytes left keeps them as trailer
    dangling = lbmc.LbmcMessage(headers=[lbmc.UmeStoreid(store_id=1, next_hdr=0x12)],
                                terminator=0x12, trailer=b"abc")
    assert sl.to_message(sl.LBMC(dangling.build())) == lbmc.parse_message(dangling.build())[0]


# --- invalid packets ---------------------------------------------------------------------------


@pytest.mark.parametrize("crafted", [
    pytest.param(lambda: sl.LBMC() / sl.LBMC_UmePreg(hdr_len=10), id="short-hdr_len"),  # type: ignore[attr-defined]
    pytest.param(lambda: sl.LBMC() / sl.LBMC_UmePreg(hdr_len=0), id="zero-hdr_len"),  # type: ignore[attr-defined]
    pytest.param(lambda: sl.LBMC() / sl.LBMC_UmeAck(hdr_len=200), id="hdr_len-past-msglen"),  # type: ignore[attr-defined]
    pytest.param(lambda: sl.LBMC(msglen=0) / sl.LBMC_UmeAck(), id="zero-msglen"),  # type: ignore[attr-defined]
    pytest.param(lambda: sl.LBMC(msglen=3), id="msglen-below-base"),
    pytest.param(lambda: sl.LBMC(msglen=500) / sl.LBMC_UmeAck(), id="msglen-past-end"),  # type: ignore[attr-defined]
    pytest.param(lambda: sl.LBMC(ver_type=0x05), id="undefined-type"),
    pytest.param(lambda: sl.LBMC(next_hdr=0x99) / sl.LBMC_Unknown(data=b"ab"), id="unknown-code"),
])
def test_invalid_values_build_and_wire_lbmc_rejects_them(crafted: Any) -> None:
    pkt = crafted()
    wire_bytes = raw(pkt)
    with pytest.raises(WireError):
        lbmc.parse_message(wire_bytes)
    again = sl.LBMC(wire_bytes)  # and Scapy still dissects what was crafted
    if pkt.msglen is not None:
        assert again.msglen == pkt.msglen
    assert raw(again) == wire_bytes


def test_crafted_hdr_len_is_kept() -> None:
    pkt = sl.LBMC(raw(sl.LBMC() / sl.LBMC_UmePreg(hdr_len=10, reg_id=77)))  # type: ignore[attr-defined]
    preg = pkt[sl.LBMC_UmePreg]  # type: ignore[attr-defined]
    assert preg.hdr_len == 10 and preg.reg_id == 77


# --- LBT-TCP --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(max_headers=3), min_size=1, max_size=5))
def test_lbttcp_segment_holds_back_to_back_messages(batch: list[lbmc.LbmcMessage]) -> None:
    segment = frame_messages(batch)
    pkt = sl.LBTTCP(segment)
    assert [sl.to_message(m) for m in pkt.messages] == [
        lbmc.parse_message(m.build())[0] for m in batch]
    assert raw(pkt) == segment
    assert raw(sl.LBTTCP(messages=[sl.to_scapy(m) for m in batch])) == segment


def _tcp(sport: int, dport: int, payload: bytes) -> Packet:
    return Ether(raw(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=sport, dport=dport)
                     / Raw(payload)))


def test_lbttcp_binds_to_default_ports_and_store_ports() -> None:
    segment = frame_messages([lbmc.LbmcMessage(headers=[lbmc.UmeKeepalive(type=1)])] * 2)
    for sport, dport in ((14371, 50000), (50000, 14390), (14391, 40000), (40000, 14395)):
        pkt = _tcp(sport, dport, segment)
        assert sl.LBTTCP in pkt and len(pkt[sl.LBTTCP].messages) == 2
    assert sl.LBTTCP not in _tcp(40000, 14370, segment)
    assert sl.LBTTCP not in _tcp(14396, 40000, segment)
    assert sl.LBTTCP not in _tcp(14567, 40000, segment)  # no store ports by default (tshark)
    sl.bind_store_port(14567)
    assert sl.LBTTCP in _tcp(40000, 14567, segment)
    assert sl.LBTTCP in _tcp(14567, 40000, segment)


def test_rdpcap_and_show(tmp_path: Path) -> None:
    preg = lbmc.LbmcMessage(headers=[lbmc.UmePreg(reg_id=0x1234, s_flag=1, resp_ip="10.9.8.7",
                                                  resp_port=14000),
                                     lbmc.Topicname(topic="orders")])
    data = lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE, tidx=4, sqn=77, payload=b"body",
                            headers=[lbmc.Srcidx(srcidx=3)])
    conv = TcpConversation(("10.0.0.2", 40000), ("10.0.0.1", 14371))
    frames = [*conv.handshake(), conv.send(True, frame_messages([preg])),
              conv.send(False, frame_messages([data, data])), *conv.close()]
    path = tmp_path / "um.pcap"
    write_pcap(path, frames)
    packets = rdpcap(str(path))
    um = [p for p in packets if sl.LBTTCP in p]
    assert len(um) == 2
    shown = um[0].show(dump=True)
    for text in ("LBT-TCP", "LBMC UME persistent registration", "reg_id", "= 4660",
                 "resp_ip", "10.9.8.7", "LBMC Topic name", "b'orders'", "s_flag=1",
                 "next_hdr  = 0x12 (UME persistent registration)"):
        assert text in shown, text
    second = um[1][sl.LBTTCP]
    assert [m.sqn for m in second.messages] == [77, 77]
    assert "srcidx" in um[1].show(dump=True)
    assert sl.to_message(second.messages[0]) == data


# --- UDP transports (LBT-RU, LBT-RM) ---------------------------------------------------------

TRANSPORTS = sl.transports()
UDP_TRANSPORTS = [t for name, t in TRANSPORTS.items() if name in ("lbtru", "lbtrm")]


def _transport_id(t: sl.Transport) -> str:
    return t.name


def _transport_layers(t: sl.Transport) -> list[tuple[Any, type[Packet]]]:
    return list(t.by_record.items())


@pytest.mark.parametrize("transport", UDP_TRANSPORTS, ids=_transport_id)
def test_transport_layers_are_read_off_the_construct_structs(transport: sl.Transport) -> None:
    records = {*transport.codec.packets.values(), *transport.codec.options.values()}
    if transport.codec.unknown_option is not None:
        records.add(transport.codec.unknown_option)
    assert records <= set(transport.by_record)
    for record, layer in _transport_layers(transport):
        assert layer.ump_struct is record.struct
        _assert_mirrors(record.struct, layer)
    for code, layer in transport.types.items():
        assert issubclass(layer, transport.base)
        assert transport.base(raw(layer())).__class__ is layer  # dispatch on the type nibble
        assert layer.ump_record.type_code == code


def _packets(transport: sl.Transport, cls: Any) -> st.SearchStrategy[Any]:
    """Random datagrams of one type, read off the codec's structs (like the codec's tests)."""
    codec = transport.codec
    option_kinds = [values_for(o.struct).map(lambda v, o=o: o(**v))
                    for o in codec.options.values()]
    if codec.unknown_option is not None:
        unknown = codec.unknown_option
        codes = st.integers(1, 255).filter(lambda c: c not in codec.options)
        option_kinds.append(st.builds(lambda c, v: unknown(c, **v), codes,
                                      values_for(unknown.struct)))
    options = st.lists(st.one_of(option_kinds), max_size=3)
    if "allow_options" in getattr(cls, "__slots__", ()):  # LBT-RU RST: see wire.lbtru
        options = st.just([])
    if cls.carries_lbmc:
        payload, trailer = st.lists(messages(max_headers=2), max_size=3), st.binary(max_size=3)
    else:
        payload, trailer = st.just([]), st.binary(max_size=8)

    def make(values: dict[str, Any], version: int, opts: list[Any], msgs: list[Any],
             tail: bytes) -> Any:
        packet = cls(options=opts, payload=msgs, trailer=tail, **values)
        packet.version = version
        return packet

    return st.builds(make, values_for(cls.struct, skip=("next_hdr", "ver_type")),
                     st.integers(0, 15), options, payload, trailer)


def _transport_cases() -> list[Any]:
    return [pytest.param(t, cls, id=f"{t.name}-{cls.__name__}")
            for t in UDP_TRANSPORTS for cls in t.codec.packets.values()]


@pytest.mark.parametrize(("transport", "cls"), _transport_cases())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_transport_datagrams_match_the_codec(transport: sl.Transport, cls: Any,
                                             data: st.DataObject) -> None:
    packet = data.draw(_packets(transport, cls))
    wire_bytes = packet.build()
    parsed = transport.codec.parse(wire_bytes)
    pkt = transport.base(wire_bytes)
    assert isinstance(pkt, transport.types[cls.type_code])
    assert sl.construct_values(pkt) == cls.struct_values(parsed.resolved())
    layer = pkt.payload
    for option, code in zip(parsed.options, parsed.chain()[1:], strict=True):
        assert isinstance(layer, transport.by_record[type(option)])
        assert sl.construct_values(layer) == option.struct_values(option.chained(code))
        layer = layer.payload
    found = []
    if isinstance(layer, sl.LBMCMessages):  # (no layer at all when the datagram ends here)
        assert cls.carries_lbmc
        found = [sl.to_message(m) for m in layer.messages]
        layer = layer.payload
    assert found == parsed.payload
    assert (layer.load if isinstance(layer, Raw) else b"") == parsed.trailer
    assert raw(pkt) == wire_bytes
    # field by field through Scapy: the same bytes, and the codec reads them back
    crafted = raw(sl.to_scapy(packet))
    assert crafted == wire_bytes
    assert transport.codec.parse(crafted) == parsed


def _udp(sport: int, dport: int, payload: bytes, dst: str = "10.0.0.2") -> Packet:
    return Ether(raw(Ether() / IP(src="10.0.0.1", dst=dst) / UDP(sport=sport, dport=dport)
                     / Raw(payload)))


@pytest.mark.skipif("lbtru" not in TRANSPORTS, reason="wire.lbtru not available")
def test_lbtru_binds_to_source_and_receiver_ranges() -> None:
    from wire import lbtru

    sm = lbtru.LbtruSm(sm_sqn=1, lead_sqn=2, syn=1).build()
    lbtru_layer = TRANSPORTS["lbtru"].base
    for sport, dport in ((14380, 14360), (14389, 14379), (14360, 14380), (14379, 14389)):
        pkt = _udp(sport, dport, sm)
        assert lbtru_layer in pkt and pkt[lbtru_layer].sm_sqn == 1, (sport, dport)
    for sport, dport in ((14380, 14380), (14360, 14370), (40000, 14380), (14390, 14360)):
        assert lbtru_layer not in _udp(sport, dport, sm), (sport, dport)


@pytest.mark.skipif("lbtrm" not in TRANSPORTS, reason="wire.lbtrm not available")
def test_lbtrm_binds_to_data_and_nak_ports() -> None:
    from wire import lbtrm

    data = lbtrm.LbtrmData(ucast_port=14390, session_id=7, sqn=1,
                           payload=[lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE,
                                                     payload=b"x")]).build()
    nak = lbtrm.LbtrmNak(ucast_port=14390, naks=[1, 2]).build()
    lbtrm_layer = TRANSPORTS["lbtrm"].base
    pkt = _udp(40000, 14400, data, dst="224.10.10.10")
    assert lbtrm_layer in pkt and pkt[lbtrm_layer].session_id == 7
    assert pkt[sl.LBMCMessages].messages[0][Raw].load == b"x"
    pkt = _udp(40001, 14395, nak)
    assert [n.nak for n in pkt[lbtrm_layer].naks] == [1, 2]
    assert lbtrm_layer not in _udp(40000, 14402 + 1000, data)


@pytest.mark.parametrize("transport", UDP_TRANSPORTS, ids=_transport_id)
def test_transport_invalid_values_build_and_the_codec_rejects_them(
        transport: sl.Transport) -> None:
    types = {layer.ump_record.__name__[len(transport.name):].upper(): layer
             for layer in transport.types.values()}
    option = transport.unknown_option
    assert option is not None
    bad = [
        types["NAK"](num_naks=5, naks=[{"nak": 1}]),  # count larger than the list
        transport.base(ver_type=0x09),  # undefined type
        types["SM"](next_hdr=0x33) / option(hdr_len=0),  # zero-length option
        types["SM"](next_hdr=0x33) / option(hdr_len=200, data=b"ab"),  # option past the end
        types["DATA"]() / sl.LBMCMessages(messages=[sl.LBMC(msglen=2)]),  # bad LBMC inside
    ]
    for pkt in bad:
        wire_bytes = raw(pkt)
        with pytest.raises(WireError):
            transport.codec.parse(wire_bytes)
        assert raw(transport.base(wire_bytes)) == wire_bytes


@pytest.mark.skipif("lbtru" not in TRANSPORTS, reason="wire.lbtru not available")
def test_rdpcap_lbtru_show(tmp_path: Path) -> None:
    from wire import lbtru

    data = lbtru.LbtruData(sqn=0x10, trail_sqn=1, options=[lbtru.SidOption(session_id=0xBEEF)],
                           payload=[lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE, tidx=1,
                                                     sqn=2, payload=b"hello")])
    path = tmp_path / "ru.pcap"
    write_pcap(path, [udp_frame("10.0.0.1", 14380, "10.0.0.2", 14360, data.build())])
    (pkt,) = rdpcap(str(path))
    shown = pkt.show(dump=True)
    for text in ("LBT-RU DATA", "trail_sqn = 1", "LBT-RU SidOption", "session_id= 48879",
                 "LBMC messages", "tidx      = 1", "b'hello'"):
        assert text in shown, text


# --- LBMR -------------------------------------------------------------------------------------

LBMR = sl.lbmr_layers()
needs_lbmr = pytest.mark.skipif(LBMR is None, reason="wire.lbmr not available")


@needs_lbmr
def test_lbmr_layers_are_read_off_the_construct_structs() -> None:
    assert LBMR is not None
    records = set(LBMR.module.record_classes()) - {LBMR.module.ExtUnknown}
    assert records <= set(LBMR.by_record)
    for record, layer in LBMR.by_record.items():
        struct_def = layer.ump_struct
        if record in records:
            assert struct_def is record.kind.struct
        # the struct's members first, then the children the struct does not hold
        names = [f.name for f in layer.fields_desc][:len(list(members(struct_def)))]
        assert names == [m.name for m in members(struct_def)]
        fields = layer.fields_desc[:len(names)]
        for fld, member in zip(fields, members(struct_def), strict=True):
            assert _scapy_size(fld) == _construct_size(member), (layer.__name__, member.name)


def _same_record(layer: Packet, record: Any) -> None:
    """A Scapy record layer shows what wire.lbmr parsed (children included)."""
    assert LBMR is not None
    m = LBMR.module
    assert type(layer) is LBMR.by_record[type(record)], (layer, record)
    values = sl.construct_values(layer)
    wanted = record.resolved()
    for member in members(record.kind.struct):
        assert values[member.name] == wanted[member.name], (type(record).__name__, member.name)
    if isinstance(record, m.Tir | m.Qir):
        _same_options(layer.options, record.options)
        if isinstance(record, m.Tir):
            _same_record(layer.info, record.info)
        else:
            for got, want in zip(layer.groups + layer.queues, record.groups + record.queues,
                                 strict=True):
                _same_record(got, want)
    elif isinstance(record, m.Tmb):
        for got, want in zip(layer.records, record.records, strict=True):
            _same_record(got, want)
    elif isinstance(record, m.Pser):
        if record.options is None:
            assert layer.options is None
        else:
            assert layer.options.optlen == record._options_header().resolved()["optlen"]
            for got, want in zip(layer.options.options, record.options, strict=True):
                _same_record(got, want)


def _same_options(block: Packet | None, options: list[Any] | None) -> None:
    if options is None:
        assert block is None
        return
    assert block is not None
    for got, want in zip(block.options, options, strict=True):
        _same_record(got, want)


def _lbmr_packets() -> st.SearchStrategy[Any]:
    return lbmr_packets()


@needs_lbmr
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(data=st.data())
def test_lbmr_packets_match_the_codec(data: st.DataObject) -> None:
    assert LBMR is not None
    m = LBMR.module
    packet = data.draw(_lbmr_packets())
    wire_bytes = packet.build()
    parsed = m.parse_packet(wire_bytes)
    pkt = LBMR.base(wire_bytes)
    assert type(pkt) is LBMR.types.get(parsed.type, LBMR.base)
    assert pkt.ver_type == parsed.ver_type()
    layer: Packet = pkt.payload
    if parsed.type == m.PacketType.EXT:
        assert parsed.ext is not None
        assert pkt.ext_type == parsed.ext.code
        # (no layer for an unknown ext type; Scapy makes no layer of zero bytes)
        if not isinstance(parsed.ext, m.ExtUnknown) and (layer or parsed.ext.encode()):
            _same_record(layer, parsed.ext)
            layer = layer.payload
    else:
        assert (pkt.tqrs, pkt.tirs) == parsed.counts()
        if parsed.type == m.PacketType.TOPIC_MGMT:
            _same_record(pkt.tmb, parsed.tmb)
        elif pkt.ump_lists:
            for got, want in zip(pkt.tqr_list + pkt.tir_list, parsed.tqrs + parsed.tirs,
                                 strict=True):
                _same_record(got, want)
    if parsed.options_bit():
        assert isinstance(layer, sl.LBMR_Options) or (not parsed.options and not layer)
        for got, want in zip(layer.options if layer else [], parsed.resolved_options(),
                             strict=True):
            _same_record(got, want)
    else:
        assert (layer.load if isinstance(layer, Raw) else b"") == parsed.trailer
    assert raw(pkt) == wire_bytes
    crafted = raw(sl.to_scapy(packet))
    assert crafted == wire_bytes
    assert m.parse_packet(crafted) == parsed


@needs_lbmr
def test_lbmr_computed_members_and_ports() -> None:
    assert LBMR is not None
    m = LBMR.module
    tir = LBMR.by_record[m.Tir](name="t", info=LBMR.by_record[m.LbtruInfo](port=14380),
                                options=LBMR.topt_block(options=[
                                    LBMR.by_record[m.ToptUme](store=1)]))
    crafted = LBMR.types[m.PacketType.NORMAL](tir_list=[tir]) / sl.LBMR_Options(
        options=[LBMR.by_record[m.OptVersion](version=3), LBMR.by_record[m.OptLen]()])
    parsed = m.parse_packet(raw(crafted))
    assert parsed.type == m.PacketType.NORMAL and parsed.options_bit()
    assert parsed.counts() == (0, 1) and parsed.tirs[0].name == "t"
    assert parsed.tirs[0].info == m.LbtruInfo(port=14380)
    assert parsed.tirs[0].options == [m.ToptUme(store=1)]
    assert parsed.options == m.with_length_option([m.OptVersion(version=3)])
    for sport, dport in ((50000, 12965), (14402, 15380), (15380, 14406)):
        assert LBMR.base in _udp(sport, dport, raw(crafted), dst="224.9.10.11"), (sport, dport)
    for sport, dport in ((50000, 15380), (14402, 50000), (12965, 50000)):
        assert LBMR.base not in _udp(sport, dport, raw(crafted)), (sport, dport)
    # invalid counts and lengths still build; the codec rejects them
    for bad in (LBMR.types[m.PacketType.NORMAL](tirs=3, tir_list=[tir]),
                LBMR.types[m.PacketType.NORMAL](tir_list=[tir.copy()]),
                LBMR.types[m.PacketType.NORMAL](tqrs=1)):
        if not bad.tqrs:
            bad.tir_list[0].tlen = 99
        with pytest.raises(WireError):
            m.parse_packet(raw(bad))
    assert "LBMR ToptUme" in LBMR.base(raw(crafted)).show(dump=True)


@needs_lbmr
def test_lbmr_ext_record_and_rdpcap(tmp_path: Path) -> None:
    assert LBMR is not None
    m = LBMR.module
    pser = LBMR.ext_records[m.ExtType.PSER](topic="orders", store_port=14567,
                                            options=LBMR.pser_block(options=[
                                                LBMR.by_record[m.PserCtxinst](ctxinst=b"8bytes!!")]))
    crafted = LBMR.types[m.PacketType.EXT]() / pser
    parsed = m.parse_packet(raw(crafted))
    assert isinstance(parsed.ext, m.Pser) and parsed.ext.topic == "orders"
    assert parsed.ext.options == [m.PserCtxinst(ctxinst=b"8bytes!!")]
    path = tmp_path / "lbmr.pcap"
    write_pcap(path, [udp_frame("10.0.0.1", 50000, "224.9.10.11", 12965, raw(crafted))])
    (pkt,) = rdpcap(str(path))
    shown = pkt.show(dump=True)
    for text in ("LBMR Ext", "ext_type  = 0x1 (Proxy Source Election)", "LBMR Pser",
                 "topic     = b'orders'", "store_port= 14567", "LBMR PserCtxinst"):
        assert text in shown, text
