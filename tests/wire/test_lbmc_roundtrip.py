"""Round trips of the LBMC codec (wire/lbmc.py).

* Construct level, for every header kind: ``parse(build(v)) == v`` and ``build(parse(b)) == b``;
* message level: ``parse_message(m.build()) == m`` and back to the same bytes, for random
  messages, chains ending in 0xFF or 0x00, ``hdr_len`` longer than the layout, opaque headers,
  unfinished chains;
* apphdr_chain elements, typed attribute access and named bit views;
* the bytes of docs/wire-lbmc.md §6.3 frame 4, built byte for byte.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import construct as cs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire import strategies
from wire import WireError, lbmc
from wire.fields import Bit, bit_views, fixed_format, members, value_kind
from wire.lbmc import (
    AckType,
    AppHdrChain,
    ChainElement,
    HeaderKind,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    OpaqueHeader,
    PregError,
    UmeAck,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmePsrcElectionToken,
    UmeRxreq,
    UmeStore,
    UmeStoreid,
    build_apphdr_chain,
    parse_apphdr_chain,
    parse_message,
)

KINDS = lbmc.header_kinds()
FIXED_KINDS = [k for k in KINDS if k.fixed]
OPAQUE_CODES = sorted(c for c in lbmc.KNOWN_CODES if c != 0x03)


def plain(value: Any) -> Any:
    """Construct containers as plain dicts/lists (without Construct's ``_io`` bookkeeping)."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not k.startswith("_")}
    return value


def raw_header(kind: HeaderKind) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes of one header of ``kind``: its hdr_len byte is its length."""
    return st.binary(min_size=kind.min_len, max_size=255).map(
        lambda b: b[:1] + bytes([len(b)]) + b[2:])


def kind_param(kind: HeaderKind) -> Any:
    return pytest.param(kind, id=kind.name)


ALL_KINDS = [kind_param(k) for k in KINDS]


# --- Construct level --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL_KINDS)
@given(data=st.data())
def test_construct_parse_of_build_is_identity(kind: HeaderKind, data: st.DataObject) -> None:
    assert kind.struct is not None
    header = data.draw(strategies.header_of(kind))
    values = header.resolved()
    values["next_hdr"] = data.draw(st.integers(0, 255))
    raw = kind.struct.build(values)
    assert len(raw) == values["hdr_len"]
    assert plain(kind.struct.parse(raw)) == plain(values)


@pytest.mark.parametrize("kind", ALL_KINDS)
@given(data=st.data())
def test_construct_build_of_parse_is_identity(kind: HeaderKind, data: st.DataObject) -> None:
    assert kind.struct is not None
    raw = data.draw(raw_header(kind))
    parsed = kind.struct.parse(raw)
    assert parsed.hdr_len == len(raw)
    assert kind.struct.build(parsed) == raw


@pytest.mark.parametrize("kind", ALL_KINDS)
@given(data=st.data())
def test_parse_message_decodes_every_header_like_construct(
        kind: HeaderKind, data: st.DataObject) -> None:
    """The message parser (fast path for fixed layouts) agrees with the Construct definition."""
    assert kind.struct is not None
    raw = bytearray(data.draw(raw_header(kind)))
    raw[0] = lbmc.NHDR_NONE
    message = bytes([0x08, kind.code]) + (4 + len(raw)).to_bytes(2, "big") + raw
    parsed, used = parse_message(message)
    assert used == len(message)
    (header,) = parsed.headers
    assert type(header) is lbmc.header_class(kind.code)
    assert header.wire_values(lbmc.NHDR_NONE) == plain(kind.struct.parse(bytes(raw)))
    # lengths and chain links equal to the computed ones are left to be recomputed
    assert header.values["next_hdr"] is None
    assert parsed.build() == message


def test_header_kinds_cover_the_modelled_codes() -> None:
    codes = [k.code for k in KINDS]
    assert codes == sorted(set(codes))
    for kind in KINDS:
        cls = lbmc.header_class(kind.code)
        assert cls is not None and cls.kind is kind
        assert lbmc.kind_by_code(kind.code) is kind
        assert kind.code not in lbmc.KNOWN_CODES
        assert lbmc.is_defined_code(kind.code)
        assert lbmc.title_of(kind.code) == kind.title
        assert kind.tshark.startswith("lbmc.")
        if kind.fixed:
            assert kind.fast is not None and kind.min_len == kind.fast.size
            assert kind.fast.names[:2] == ("next_hdr", "hdr_len")


# --- message level ------------------------------------------------------------------------------


@given(strategies.messages())
def test_message_round_trip(message: LbmcMessage) -> None:
    raw = message.build()
    parsed, used = parse_message(raw)
    assert used == len(raw) == parsed.resolved_msglen()
    assert parsed == message
    assert parsed.build() == raw
    assert parsed.tshark_fields() == message.tshark_fields()
    assert parsed.label() == message.label()


@given(strategies.messages(), st.binary(max_size=8), st.binary(max_size=8))
def test_message_parsed_at_an_offset(message: LbmcMessage, before: bytes, after: bytes) -> None:
    raw = message.build()
    parsed, used = parse_message(before + raw + after, len(before))
    assert used == len(raw)
    assert parsed == message


@given(strategies.messages())
def test_every_header_code_is_carried_by_its_predecessor(message: LbmcMessage) -> None:
    raw = message.build()
    codes = [h.header_code for h in message.headers] + [message.chain_end()]
    assert raw[1] == codes[0]
    assert int.from_bytes(raw[2:4], "big") == len(raw)
    assert raw[0] == message.type
    pos = message.base_size
    for nxt in codes[1:]:
        assert raw[pos] == nxt
        pos += raw[pos + 1]
    if message.chain_end() == lbmc.NHDR_DATA:
        assert raw[pos:] == message.payload
    else:
        assert raw[pos:] == message.trailer


@given(st.lists(strategies.messages(), max_size=6))
def test_back_to_back_messages(messages: list[LbmcMessage]) -> None:
    raw = lbmc.build_messages(messages)
    assert lbmc.parse_messages(raw) == messages
    sizes = [len(m.build()) for m in messages]
    offsets = list(itertools.accumulate(sizes, initial=0))[:-1]
    assert [pos for pos, _ in lbmc.iter_messages(raw)] == offsets


@pytest.mark.parametrize("mtype", list(MessageType), ids=lambda t: t.name)
def test_default_chain_end_depends_on_the_type(mtype: MessageType) -> None:
    """Data types end with DATA (0x00), CONTROL and EOT with NONE (0xFF)."""
    expected = lbmc.NHDR_DATA if mtype in lbmc.DATA_TYPES else lbmc.NHDR_NONE
    base = 12 if mtype in lbmc.DATA_TYPES else 4
    bare = LbmcMessage(type=mtype, tidx=5, sqn=6).build()
    assert bare[1] == expected
    assert len(bare) == base
    with_header = LbmcMessage(type=mtype, headers=[UmeKeepalive(reg_id=1)]).build()
    assert with_header[1] == UmeKeepalive.kind.code
    assert with_header[base] == expected
    assert with_header[base + 1] == 16


def test_data_message_bytes() -> None:
    raw = LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=2, payload=b"hello").build()
    assert raw == bytes.fromhex("00000011" "00000001" "00000002") + b"hello"
    retrans = LbmcMessage(type=MessageType.RETRANS, tidx=0xFFFFFFFF, sqn=7, payload=b"x")
    assert retrans.build() == bytes.fromhex("0a00000d" "ffffffff" "00000007") + b"x"
    assert parse_message(retrans.build())[0] == retrans


def test_control_chain_ending_in_data_carries_a_payload() -> None:
    message = LbmcMessage(type=MessageType.CONTROL, headers=[UmeAck(seqnum=9)],
                          terminator=lbmc.NHDR_DATA, payload=b"xyz")
    raw = message.build()
    assert raw[4] == lbmc.NHDR_DATA
    assert raw.endswith(b"xyz")
    parsed, _ = parse_message(raw)
    assert parsed.terminator == lbmc.NHDR_DATA
    assert parsed.payload == b"xyz"
    assert parsed.trailer == b""
    # tshark labels such a control message as data (docs/wire-lbmc.md §1.8), not "ACK"
    assert parsed.label() == "DATA"
    assert LbmcMessage(type=MessageType.CONTROL, headers=[UmeAck()]).label() == "ACK"


def test_data_message_chain_ending_in_none_has_no_payload() -> None:
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[UmeAck()],
                          terminator=lbmc.NHDR_NONE, trailer=b"ignored")
    raw = message.build()
    assert raw[12] == lbmc.NHDR_NONE
    parsed, _ = parse_message(raw)
    assert parsed.payload == b""
    assert parsed.trailer == b"ignored"
    assert parsed.build() == raw
    assert parsed.label() == "ACK"


def test_bytes_after_a_none_terminated_chain_are_kept() -> None:
    message = LbmcMessage(headers=[UmeStore(grp_idx=1)], trailer=b"\x01\x02\x03\x04\x05")
    raw = message.build()
    assert len(raw) == 4 + 16 + 5
    parsed, _ = parse_message(raw)
    assert parsed.trailer == b"\x01\x02\x03\x04\x05"
    assert parsed == message
    assert parsed.build() == raw


def test_payload_needs_a_chain_ending_in_data() -> None:
    with pytest.raises(WireError) as info:
        LbmcMessage(type=MessageType.CONTROL, payload=b"x").build()
    assert info.value.header == "lbmc"


@pytest.mark.parametrize(("mtype", "terminator"), [
    (MessageType.MESSAGE, None), (MessageType.CONTROL, lbmc.NHDR_DATA),
    (MessageType.RETRANS, lbmc.NHDR_DATA),
])
def test_trailer_needs_a_chain_not_ending_in_data(mtype: MessageType,
                                                  terminator: int | None) -> None:
    """After DATA (0x00) everything is payload: a trailer there could not round-trip."""
    message = LbmcMessage(type=mtype, headers=[UmeAck()], terminator=terminator,
                          trailer=b"tail")
    with pytest.raises(WireError) as info:
        message.build()
    assert (info.value.header, info.value.offset) == ("lbmc", 0)
    message.trailer = b""
    message.payload = b"tail"
    parsed, _ = parse_message(message.build())
    assert (parsed.payload, parsed.trailer) == (b"tail", b"")


@pytest.mark.parametrize("kind", [kind_param(k) for k in FIXED_KINDS])
@pytest.mark.parametrize("extra", [1, 5])
def test_longer_hdr_len_keeps_the_extra_bytes(kind: HeaderKind, extra: int) -> None:
    assert kind.fast is not None
    cls = lbmc.header_class(kind.code)
    assert cls is not None
    tail = bytes(range(0xA0, 0xA0 + extra))
    following = UmeKeepalive(reg_id=0x01020304, type=KeepaliveType.SOURCE)
    message = LbmcMessage(headers=[cls(trailing=tail), following])
    raw = message.build()
    assert raw[5] == kind.fast.size + extra
    assert raw[4 + kind.fast.size : 4 + kind.fast.size + extra] == tail
    parsed, _ = parse_message(raw)
    first = parsed.headers[0]
    assert isinstance(first, lbmc.Header)
    assert first.trailing == tail
    assert first.hdr_len == kind.fast.size + extra
    assert parsed.headers[1] == following
    assert parsed == message
    assert parsed.build() == raw


def test_spec_frame_11_preg_with_hdr_len_32() -> None:
    """docs/wire-lbmc.md §6.3 frame 11: a PREG with hdr_len 32 is fine; 4 extra bytes kept."""
    preg = UmePreg(s_flag=1, marker=2, reg_id=10, transport_idx=11, topic_idx=12, resp_port=1,
                   resp_ip="10.0.0.1", trailing=b"\0\0\0\0")
    raw = LbmcMessage(headers=[preg]).build()
    assert int.from_bytes(raw[2:4], "big") == 36
    assert raw[5] == 32
    parsed, _ = parse_message(raw)
    assert isinstance(parsed.headers[0], UmePreg)
    assert parsed.headers[0].trailing == b"\0\0\0\0"
    assert dict(parsed.tshark_fields())["lbmc.ume_preg.hdr_len"] == 32


def test_explicit_hdr_len_is_written_as_given() -> None:
    """An explicit hdr_len is put on the wire as is, after the layout is encoded with its real
    length: that is how a conformance case crafts a too-short or too-long header."""
    plain_preg = UmePreg(reg_id=5).encode(0xFF)
    assert UmePreg(reg_id=5, hdr_len=28).encode(0xFF) == plain_preg
    assert UmePreg(hdr_len=30, trailing=b"ab").encode(0xFF) == UmePreg(trailing=b"ab").encode(0xFF)
    for crafted in (0, 1, 20, 27, 29, 32, 255):
        raw = UmePreg(reg_id=5, hdr_len=crafted).encode(0xFF)
        assert len(raw) == 28
        assert raw == plain_preg[:1] + bytes([crafted]) + plain_preg[2:]
    # with trailing bytes (the Construct path) the bytes are those of the real length too
    raw = UmePreg(hdr_len=29, trailing=b"ab").encode(0xFF)
    assert raw == bytes([0xFF, 29]) + UmePreg(trailing=b"ab").encode(0xFF)[2:]
    # variable layouts as well
    topic = lbmc.Topicname(topic="abc").encode(0xFF)
    assert topic[1] == len(topic) != 4
    assert lbmc.Topicname(topic="abc", hdr_len=4).encode(0xFF) == topic[:1] + b"\x04" + topic[2:]
    with pytest.raises(WireError):
        UmePreg(hdr_len=256).encode(0xFF)
    with pytest.raises(WireError):
        UmePreg(hdr_len=-1).encode(0xFF)


def test_crafted_short_hdr_len_builds_and_is_rejected_by_the_parser() -> None:
    raw = LbmcMessage(headers=[UmePreg(hdr_len=20)]).build()
    assert (len(raw), raw[1], raw[5]) == (32, 0x12, 20)
    assert int.from_bytes(raw[2:4], "big") == 32
    with pytest.raises(WireError) as info:
        parse_message(raw)
    assert (info.value.header, info.value.offset) == ("lbmc.ume_preg", 4)
    assert "20" in info.value.reason and "28-byte" in info.value.reason
    # too long: runs past msglen
    raw = LbmcMessage(headers=[UmeStoreid(), UmePreg(hdr_len=40)]).build()
    with pytest.raises(WireError) as info:
        parse_message(raw)
    assert (info.value.header, info.value.offset) == ("lbmc.ume_preg", 8)


def test_a_parsed_header_changed_after_parsing_rebuilds_consistently() -> None:
    raw = LbmcMessage(headers=[lbmc.Topicname(topic="abc")]).build()
    parsed, _ = parse_message(raw)
    parsed.headers[0].topic = "abcdef"
    parsed.headers.append(lbmc.Srcidx(srcidx=5))  # and the chain grows by one header
    again, _ = parse_message(parsed.build())
    assert again.headers == [lbmc.Topicname(topic="abcdef"), lbmc.Srcidx(srcidx=5)]


def test_a_crafted_length_survives_a_round_trip() -> None:
    """A wire value that differs from the computed one is kept, so bad input re-encodes."""
    raw = bytearray(LbmcMessage(headers=[lbmc.UmeAck(seqnum=1)]).build())
    raw[5] = 24  # ume_ack hdr_len 24: 4 trailing bytes that are not there ...
    raw[2:4] = (len(raw) + 4).to_bytes(2, "big")
    raw += b"\xaa\xbb\xcc\xdd"  # ... now they are: a longer header, kept as trailing
    parsed, _ = parse_message(bytes(raw))
    assert parsed.headers[0].trailing == b"\xaa\xbb\xcc\xdd"
    assert parsed.build() == bytes(raw)


# --- opaque headers -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", OPAQUE_CODES, ids=lambda c: f"0x{c:02x}")
def test_opaque_header_round_trip(code: int) -> None:
    # at least 22 data bytes, and at least the code's minimum; byte 3 (data[1]) is 0, which
    # for authentication (0x60) is no known operation
    size = max(22, lbmc.OPAQUE_MIN_LEN[code] - 2)
    data = b"\x80\x00" + bytes(range(1, size - 1))
    opaque = OpaqueHeader(code, data)
    assert opaque.name == lbmc.KNOWN_CODES[code][0]
    message = LbmcMessage(headers=[UmeStoreid(store_id=3), opaque, UmeKeepalive(reg_id=7)])
    raw = message.build()
    assert raw[4] == code and raw[8] == UmeKeepalive.kind.code and raw[9] == len(data) + 2
    parsed, _ = parse_message(raw)
    got = parsed.headers[1]
    assert isinstance(got, OpaqueHeader)
    assert (got.header_code, got.data, got.length) == (code, data, len(data) + 2)
    assert got.hdr_len is None and got.next_hdr is None  # recomputed when rebuilt
    assert parsed.headers[2] == UmeKeepalive(reg_id=7)
    assert parsed == message
    assert parsed.build() == raw
    prefix = "lbmc.auth_unknown" if code == 0x60 else lbmc.KNOWN_CODES[code][1]
    assert (f"{prefix}.hdr_len", len(data) + 2) in parsed.tshark_fields()
    assert lbmc.label_of(code) == lbmc.KNOWN_CODES[code][3]
    assert lbmc.title_of(code) == lbmc.KNOWN_CODES[code][2]


@pytest.mark.parametrize(("opid", "prefix"), [
    (1, "lbmc.auth_request"), (2, "lbmc.auth_challenge"), (3, "lbmc.auth_challenge_rsp"),
    (4, "lbmc.auth_result"), (0, "lbmc.auth_unknown"), (5, "lbmc.auth_unknown"),
    (0xFF, "lbmc.auth_unknown"),
])
def test_authentication_header_export_follows_the_operation(opid: int, prefix: str) -> None:
    """tshark shows 0x60 under a prefix chosen by the operation id at offset 3 (data[1])."""
    auth = OpaqueHeader(0x60, bytes([0x80, opid]) + bytes(10))
    assert auth.tshark_fields(0xFF) == [(f"{prefix}.hdr_len", 14)]
    # the flags byte (offset 2) does not choose
    assert OpaqueHeader(0x60, bytes([opid, 0x00, 0x00])).tshark_fields(0xFF) == [
        ("lbmc.auth_unknown.hdr_len", 5)]
    parsed, _ = parse_message(LbmcMessage(headers=[auth]).build())
    assert parsed.tshark_fields()[-1] == (f"{prefix}.hdr_len", 14)


@pytest.mark.parametrize("code", OPAQUE_CODES, ids=lambda c: f"0x{c:02x}")
def test_opaque_header_defaults_to_its_minimum_length(code: int) -> None:
    opaque = OpaqueHeader(code)
    assert opaque.data == bytes(lbmc.OPAQUE_MIN_LEN[code] - 2)
    raw = opaque.encode(0xFF)
    assert raw == bytes([0xFF, lbmc.OPAQUE_MIN_LEN[code]]) + opaque.data
    message = LbmcMessage(headers=[opaque])
    assert parse_message(message.build())[0] == message
    assert OpaqueHeader(code, b"xy").data == b"xy"  # given data is kept as is


def test_opaque_header_only_for_known_unmodelled_codes() -> None:
    assert 0x03 in lbmc.KNOWN_CODES  # TGIDX: known, but tshark never dissects it cleanly
    with pytest.raises(ValueError):
        OpaqueHeader(0x03)
    with pytest.raises(ValueError):
        OpaqueHeader(UmePreg.kind.code)
    with pytest.raises(ValueError):
        OpaqueHeader(0x21)
    with pytest.raises(ValueError):
        OpaqueHeader(lbmc.NHDR_NONE)


# (was a bug: an opaque header with hdr_len 1 was accepted, and rebuilt one byte longer)
def test_opaque_header_with_hdr_len_1_is_rejected() -> None:
    # CONTROL, next_hdr UMQ_REG (0x30), msglen 10; the header says hdr_len 1
    raw = bytes.fromhex("0830000a" "ff01" "00000000")
    with pytest.raises(WireError) as info:
        parse_message(raw)
    assert (info.value.header, info.value.offset) == ("lbmc.umq_reg", 4)
    # the same bytes crafted through the builder
    crafted = LbmcMessage(headers=[OpaqueHeader(0x30, bytes(4), hdr_len=1)]).build()
    assert crafted == raw


# --- unfinished chains --------------------------------------------------------------------------


@given(code=st.sampled_from([k.code for k in KINDS] + OPAQUE_CODES),
       trailer=st.binary(max_size=3),
       mtype=st.sampled_from(list(MessageType)))
def test_unfinished_chain_round_trips(code: int, trailer: bytes, mtype: MessageType) -> None:
    """The message ends (fewer than 4 bytes left) while a header code is still pending."""
    message = LbmcMessage(type=mtype, headers=[UmeStoreid(store_id=9)], terminator=code,
                          trailer=trailer, tidx=1, sqn=2)
    raw = message.build()
    parsed, _ = parse_message(raw)
    assert parsed.terminator == code
    assert parsed.trailer == trailer
    assert parsed.payload == b""
    assert parsed.headers == [UmeStoreid(store_id=9)]
    assert parsed.build() == raw


def test_unfinished_chain_without_any_room() -> None:
    parsed, used = parse_message(bytes.fromhex("08120004"))
    assert used == 4
    assert parsed.headers == []
    assert parsed.terminator == UmePreg.kind.code
    assert parsed.build() == bytes.fromhex("08120004")


# --- application header chain --------------------------------------------------------------------

generic_elements = st.builds(
    ChainElement, type=st.integers(0, 254).filter(lambda t: t != lbmc.MSGPROP_ELEMENT),
    data=st.binary(min_size=1, max_size=20), res=st.integers(0, 0xFFFF))
msgprop_elements = st.builds(
    ChainElement, type=st.just(lbmc.MSGPROP_ELEMENT), proplen=st.integers(0, 0xFFFFFFFF),
    res=st.integers(0, 0xFFFF))
chain_elements = st.lists(st.one_of(generic_elements, msgprop_elements), max_size=6)


def as_sent(elements: list[ChainElement]) -> list[ChainElement]:
    """The elements as the parser gives them back: ``tag`` (byte 0) recorded, and by default
    each element's own type."""
    return [dataclasses.replace(e, tag=e.type if e.tag is None else e.tag) for e in elements]


@given(chain_elements, st.binary(max_size=16))
def test_apphdr_chain_round_trip(elements: list[ChainElement], payload: bytes) -> None:
    chain = build_apphdr_chain(elements)
    assert isinstance(chain, AppHdrChain)
    assert parse_apphdr_chain(chain) == as_sent(elements)
    # byte 0 of every element is its own type (tshark's reading, see lbmc.ChainElement)
    pos = 0
    for element in elements:
        assert chain.elements[pos] == element.type
        pos += chain.elements[pos + 1] if element.type != lbmc.MSGPROP_ELEMENT else 8
    assert pos == len(chain.elements)
    expected_first = elements[0].type if elements else 0xFF
    assert chain.first_chain_hdr == expected_first
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[chain], payload=payload)
    raw = message.build()
    parsed, _ = parse_message(raw)
    assert isinstance(parsed.headers[0], AppHdrChain)
    assert parse_apphdr_chain(parsed.headers[0]) == as_sent(elements)
    assert parsed.payload == payload
    assert lbmc.msgprop_length(parsed) == sum(
        e.proplen for e in elements if e.type == lbmc.MSGPROP_ELEMENT)


def test_apphdr_chain_bytes() -> None:
    """As tshark 4.0 reads a chain: the first type is first_chain_hdr, each element's byte 0 is
    its own type (not the next one's, as docs/wire-lbmc.md §3.2 words it); type 6 is 8 bytes."""
    chain = build_apphdr_chain([ChainElement(5, data=b"ab", res=0x0102),
                                ChainElement(lbmc.MSGPROP_ELEMENT, proplen=40)])
    raw = LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=2, headers=[chain],
                      payload=b"p").build()
    assert raw[12:] == bytes.fromhex("00 12 00 05" "05 06 0102 6162" "06 08 0000 00000028") + b"p"
    assert parse_apphdr_chain(parse_message(raw)[0].headers[0]) == [
        ChainElement(5, data=b"ab", res=0x0102, tag=5),
        ChainElement(lbmc.MSGPROP_ELEMENT, proplen=40, tag=6)]


def test_apphdr_chain_tags() -> None:
    """An explicit tag is written into byte 0: the first element's tag does not change its type
    (first_chain_hdr does), a later element's tag is the type the parser (and tshark) sees."""
    chain = build_apphdr_chain([ChainElement(5, data=b"a", tag=0xEE),
                                ChainElement(9, data=b"b", tag=0x06 + 1)])
    assert chain.first_chain_hdr == 5
    assert chain.elements == bytes.fromhex("ee05 0000 61" "0705 0000 62")
    assert parse_apphdr_chain(chain) == [ChainElement(5, data=b"a", tag=0xEE),
                                         ChainElement(7, data=b"b", tag=7)]
    # a generic element tagged 6 is read as a message-properties element after the first
    tagged = build_apphdr_chain([ChainElement(5, data=b"a"),
                                 ChainElement(1, data=b"abcd", tag=lbmc.MSGPROP_ELEMENT)])
    assert parse_apphdr_chain(tagged) == [
        ChainElement(5, data=b"a", tag=5),
        ChainElement(lbmc.MSGPROP_ELEMENT, proplen=int.from_bytes(b"abcd", "big"), tag=6)]


def test_msgprop_element_is_always_8_bytes_and_lengths_add_up() -> None:
    # the type-6 element claims hdr_len 9: tshark (and we) advance 8 whatever it says
    chain = AppHdrChain(first_chain_hdr=6,
                        elements=bytes.fromhex("06 09 0000 00000010" "05 05 0000 41"))
    assert parse_apphdr_chain(chain) == [ChainElement(6, proplen=16, tag=6),
                                         ChainElement(5, data=b"A", tag=5)]
    # the first element's type comes from first_chain_hdr whatever its byte 0 says
    odd = AppHdrChain(first_chain_hdr=6,
                      elements=bytes.fromhex("05 09 0000 00000010" "05 05 0000 41"))
    assert parse_apphdr_chain(odd) == [ChainElement(6, proplen=16, tag=5),
                                       ChainElement(5, data=b"A", tag=5)]
    second = build_apphdr_chain([ChainElement(6, proplen=3), ChainElement(6, proplen=4)])
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[chain, second], payload=b"x" * 23)
    assert lbmc.msgprop_length(message) == 23
    assert lbmc.msgprop_length(parse_message(message.build())[0]) == 23
    assert lbmc.msgprop_length(LbmcMessage(type=MessageType.MESSAGE)) == 0


def test_empty_apphdr_chain() -> None:
    chain = build_apphdr_chain([])
    assert chain.encode(0) == bytes.fromhex("00 04 00 ff")
    assert parse_apphdr_chain(chain) == []


# --- typed attribute access and named bit views --------------------------------------------------


def test_named_bit_views_compose_the_raw_member() -> None:
    preg = UmePreg(s_flag=1, marker=3)
    assert preg.marker_byte == 0x83
    assert (preg.s_flag, preg.marker) == (1, 3)
    preg = UmePreg(f_flag=1, w_flag=1)
    assert preg.flags == 0x50
    preg.d_flag = 1
    assert preg.flags == 0x58
    preg.flags = 0x20
    assert (preg.p_flag, preg.f_flag, preg.w_flag, preg.d_flag, preg.ignore) == (1, 0, 0, 0, 0)
    preg.marker_byte = 0x7F
    assert (preg.s_flag, preg.marker) == (0, 0x7F)
    assert UmeRxreq(t=1, marker=0x42).flags == 0x4042  # docs/wire-lbmc.md §2.1 (verified)
    assert UmePregResp(e_flag=1, error_code=PregError.EREGID).code == 0x23  # 6.3 frame 6
    assert UmePregResp(o_flag=1, n_flag=1, w_flag=1, d_flag=1).code == 0x53
    assert lbmc.Apphdr(code=0x1234, ignore=1).code_word == 0x9234
    assert UmeStoreid(store_id=0x7FFF, ignore=1).store_id_word == 0xFFFF
    assert UmeStoreid(store_id_word=0x8005).store_id == 5


def test_typed_attributes_and_defaults() -> None:
    preg = UmePreg(reg_id=7, resp_ip="10.0.0.1", resp_port=14391)
    assert (preg.reg_id, preg.resp_ip, preg.resp_port, preg.transport_idx) == (
        7, "10.0.0.1", 14391, 0)
    preg.reg_id = 8
    assert preg.reg_id == 8
    assert preg.header_code == 0x12 and preg.kind is UmePreg.kind
    assert preg.values["hdr_len"] is None and preg.hdr_len == 28
    assert preg.next_hdr is None and preg.trailing == b""
    assert UmeAck(type=AckType.STABLE).type == 1
    for kind in KINDS:
        cls = lbmc.header_class(kind.code)
        assert cls is not None and kind.struct is not None
        defaults = cls().values
        for member in members(kind.struct):
            value = defaults[member.name]
            if member.name in ("next_hdr", "hdr_len"):
                assert value is None
            elif isinstance(member.subcon, cs.Array):
                assert value == []
            elif value_kind(member) == "int":
                assert value == 0
            elif value_kind(member) == "ipv4":
                assert value == "0.0.0.0"
            elif value_kind(member) == "text":
                assert value == ""
            elif fixed_format(member) is not None:
                assert value == bytes(int(fixed_format(member)[:-1]))  # type: ignore[index]
            else:
                assert value == b""


def test_unknown_attributes_and_bad_view_values_are_refused() -> None:
    with pytest.raises(TypeError):
        UmePreg(no_such_field=1)
    preg = UmePreg()
    with pytest.raises(AttributeError):
        _ = preg.no_such_field
    with pytest.raises(AttributeError):
        preg.no_such_field = 1
    with pytest.raises(ValueError):
        UmePreg(marker=0x80)
    with pytest.raises(ValueError):
        preg.s_flag = 2


def test_header_equality_ignores_only_the_chain_link() -> None:
    assert UmePreg(reg_id=1) == UmePreg(reg_id=1, next_hdr=0x16)
    assert UmePreg(reg_id=1) == UmePreg(reg_id=1, hdr_len=28)
    assert UmePreg(reg_id=1) != UmePreg(reg_id=2)
    assert UmePreg(reg_id=1) != UmePreg(reg_id=1, trailing=b"x")
    assert UmePreg() != UmePregResp()


# A typed header cannot offer as attributes a name of Header's own API (it wins over a member
# or view of the same name) or a member's name as a bit view (the member wins).
# (ume_preg_resp's member 'code' and apphdr's view 'code' were shadowed by a Header.code
# property until it was renamed header_code; test_preg_resp_code_byte_is_readable guards it.
# ume_pser's flag views were named like its 8-byte ctxinst members until they got a _flag
# suffix; test_pser_flag_views_and_ctxinst_members guards it.)


def _views() -> list[Any]:
    out = []
    for kind in KINDS:
        assert kind.struct is not None
        for member in members(kind.struct):
            for view, bit in bit_views(member).items():
                out.append(pytest.param(kind, member.name, view, bit, id=f"{kind.name}.{view}"))
    return out


def test_no_bit_view_is_shadowed() -> None:
    api = set(dir(lbmc.Header))
    for kind in KINDS:
        assert kind.struct is not None
        names = {m.name for m in members(kind.struct)}
        assert names.isdisjoint(api - {"kind"}), kind.name
        for member in members(kind.struct):
            assert set(bit_views(member)).isdisjoint(names | api), kind.name


def test_register_refuses_bit_views_named_like_members() -> None:
    clash = cs.Struct(
        lbmc.field("next_hdr", lbmc.U8),
        lbmc.field("hdr_len", lbmc.U8),
        lbmc.field("flags", lbmc.U16, bits={"payload": 0x0001}),
        lbmc.field("payload", lbmc.U32),
    )
    with pytest.raises(TypeError, match="payload"):
        lbmc._register(0x7E, "clash_test", "Clash test", clash)
    assert lbmc.header_class(0x7E) is None
    assert 0x7E not in {k.code for k in lbmc.header_kinds()}


def test_pser_flag_views_and_ctxinst_members() -> None:
    pser = lbmc.UmePser(source_ctxinst_flag=1, store_ctxinst=b"ABCDEFGH")
    assert pser.flags == 0x4000
    assert (pser.source_ctxinst_flag, pser.store_ctxinst_flag, pser.reelect) == (1, 0, 0)
    assert (pser.source_ctxinst, pser.store_ctxinst) == (bytes(8), b"ABCDEFGH")
    pser.store_ctxinst_flag = 1
    pser.source_ctxinst = b"abcdefgh"
    assert pser.flags == 0x6000 and pser.source_ctxinst == b"abcdefgh"
    fields = dict(pser.tshark_fields(0xFF))
    # tshark's names are unchanged: the views export as flags.source_ctxinst/.store_ctxinst
    assert fields["lbmc.ume_pser.flags.source_ctxinst"] == 1
    assert fields["lbmc.ume_pser.flags.store_ctxinst"] == 1
    assert fields["lbmc.ume_pser.source_ctxinst"] == b"abcdefgh"
    assert fields["lbmc.ume_pser.store_ctxinst"] == b"ABCDEFGH"
    assert not any(name.endswith("_flag") and "ctxinst" in name for name in fields)
    parsed, _ = parse_message(LbmcMessage(headers=[pser]).build())
    assert parsed.headers == [pser]


@pytest.mark.parametrize(("kind", "member", "view", "bit"), _views())
@given(data=st.data())
def test_every_bit_view_reads_and_writes_its_bits(
        kind: HeaderKind, member: str, view: str, bit: Bit, data: st.DataObject) -> None:
    cls = lbmc.header_class(kind.code)
    assert cls is not None and kind.struct is not None
    width = next(m for m in members(kind.struct) if m.name == member).subcon.sizeof()
    raw = data.draw(st.integers(0, (1 << (8 * width)) - 1))
    value = data.draw(st.integers(0, bit.mask >> bit.shift))
    header = cls(**{member: raw})
    assert getattr(header, view) == (raw & bit.mask) >> bit.shift
    setattr(header, view, value)
    assert header.resolved()[member] == (raw & ~bit.mask) | (value << bit.shift)
    assert getattr(header, view) == value
    built = cls(**{member: raw, view: value})
    assert built.resolved()[member] == header.resolved()[member]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_member_and_view_is_reachable_by_name(kind: HeaderKind) -> None:
    cls = lbmc.header_class(kind.code)
    assert cls is not None and kind.struct is not None
    samples = {"int": 1, "ipv4": "1.2.3.4", "text": "t", "bytes": b"\x01"}
    for member in members(kind.struct):
        header = cls()
        if isinstance(member.subcon, cs.Array):
            value: Any = [{"tidx": 1, "sqn": 2}]
        elif fixed_format(member) is not None and value_kind(member) == "bytes":
            value = b"\x01" * int(fixed_format(member)[:-1])  # type: ignore[index]
        else:
            value = samples[value_kind(member)]
        setattr(header, member.name, value)
        assert getattr(header, member.name) == value, member.name
        assert header.resolved()[member.name] == value, member.name
        for view, bit in bit_views(member).items():
            header = cls(**{member.name: 0})
            top = bit.mask >> bit.shift
            setattr(header, view, top)
            assert getattr(header, view) == top, view
            assert header.resolved()[member.name] == bit.mask, view
            assert cls(**{view: top}).resolved()[member.name] == bit.mask, view


def test_preg_resp_code_byte_is_readable() -> None:
    resp = UmePregResp(code=0x23)
    assert resp.code == 0x23
    assert (resp.e_flag, resp.error_code, resp.header_code) == (1, 3, 0x13)
    assert lbmc.Apphdr(code=5).code == 5


def test_bit_view_names_are_unique_per_header() -> None:
    for kind in KINDS:
        assert kind.struct is not None
        views = [v for m in members(kind.struct) for v in bit_views(m)]
        assert len(views) == len(set(views)), kind.name


def test_flags16_quirk_export() -> None:
    """docs/wire-lbmc.md §2.1: tshark shows one-byte flags as a 16-bit item with the next byte."""
    store = dict(UmeStore(flags=0x80, grp_idx=5).tshark_fields(0xFF))
    assert store["lbmc.ume_store.flags"] == 0x8005
    assert store["lbmc.ume_store.flags.ignore"] == 1
    assert store["lbmc.ume_store.grp_idx"] == 5
    token = dict(UmePsrcElectionToken(flags=0x80, store_index=3).tshark_fields(0xFF))
    assert token["lbmc.ume_psrc_election_token.flags"] == 0x8003
    assert token["lbmc.ume_psrc_election_token.flags.ignore"] == 1


def test_conditional_views_follow_the_e_bit() -> None:
    """ume_preg_resp: N/W/D only when E is clear, the error code only when E is set."""
    ok = dict(UmePregResp(o_flag=1, n_flag=1).tshark_fields(0xFF))
    assert ok["lbmc.ume_preg_resp.code.n_flag"] == 1
    assert "lbmc.ume_preg_resp.code.code" not in ok
    err = dict(UmePregResp(e_flag=1, error_code=PregError.EREGID).tshark_fields(0xFF))
    assert err["lbmc.ume_preg_resp.code.code"] == 3
    assert {"lbmc.ume_preg_resp.code.n_flag", "lbmc.ume_preg_resp.code.w_flag",
            "lbmc.ume_preg_resp.code.d_flag"}.isdisjoint(err)


def test_labels_follow_tshark_priority() -> None:
    assert LbmcMessage(headers=[UmeKeepalive(), UmePreg()]).label() == "PREG"
    assert LbmcMessage(headers=[UmeStore(), UmeStoreid()]).label() == ""
    assert LbmcMessage(headers=[UmeStoreid(), UmeAck()]).label() == "ACK"
    data = LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.TcpRequest()])
    assert data.label() == "DATA[REQ]"
    assert LbmcMessage(type=MessageType.MESSAGE).label() == "DATA"
    positions = [lbmc.LABEL_ORDER.index(k.label) for k in KINDS if k.label]
    assert len(positions) == len({k.label for k in KINDS if k.label})


# --- docs/wire-lbmc.md §6.3, frame 4 --------------------------------------------------------------

FRAME4_PREG = bytes.fromhex(
    "08 12 00 20"
    "ff 1c 50 81 11 22 33 44 00 00 00 07 00 00 00 09 00 00 00 00 38 37 00 00 0a 00 00 01")


def frame4_preg() -> LbmcMessage:
    return LbmcMessage(type=MessageType.CONTROL, headers=[UmePreg(
        f_flag=1, w_flag=1, s_flag=1, marker=1, reg_id=0x11223344, transport_idx=7,
        topic_idx=9, src_reg_id=0, resp_port=14391, res2=0, resp_ip="10.0.0.1")])


def test_spec_frame_4_bytes() -> None:
    assert frame4_preg().build() == FRAME4_PREG


def test_spec_frame_4_decodes_as_tshark_shows_it() -> None:
    message, used = parse_message(FRAME4_PREG + b"trailing junk is another message")
    assert used == 32
    assert message == frame4_preg()
    preg = message.headers[0]
    assert isinstance(preg, UmePreg)
    assert (preg.flags, preg.f_flag, preg.w_flag, preg.p_flag, preg.d_flag, preg.ignore) == (
        0x50, 1, 1, 0, 0, 0)
    assert (preg.s_flag, preg.marker, preg.marker_byte) == (1, 1, 0x81)
    fields = dict(message.tshark_fields())
    assert fields == fields | {
        "lbmc.version": 0, "lbmc.type": 8, "lbmc.next_hdr": 0x12, "lbmc.msglen": 32,
        "lbmc.ume_preg.next_hdr": 0xFF, "lbmc.ume_preg.hdr_len": 28,
        "lbmc.ume_preg.flags": 0x50, "lbmc.ume_preg.flags.f_flag": 1,
        "lbmc.ume_preg.flags.w_flag": 1, "lbmc.ume_preg.s_flag": 1, "lbmc.ume_preg.marker": 1,
        "lbmc.ume_preg.reg_id": 287454020, "lbmc.ume_preg.transport_idx": 7,
        "lbmc.ume_preg.topic_idx": 9, "lbmc.ume_preg.src_reg_id": 0,
        "lbmc.ume_preg.resp_port": 14391, "lbmc.ume_preg.resp_ip": "10.0.0.1",
    }
    keepalive = LbmcMessage(headers=[UmeKeepalive(type=KeepaliveType.SOURCE, reg_id=287454020)])
    both = lbmc.parse_messages(FRAME4_PREG + keepalive.build())
    assert [m.label() for m in both] == ["PREG", "UME-KA"]  # tshark: "PREG UME-KA"
