"""Bad LBMC bytes (and unencodable values) give WireError with the right header, offset, reason.

Deterministic cases cover every rule ``parse_message`` enforces (docs/wire-lbmc.md §1.2-1.6): short
buffers, msglen 0 / too small / too large, hdr_len 0 / shorter than the layout / running past
msglen for every header kind, every undefined header code, every invalid type nibble.  Then
Hypothesis feeds random bytes, structured random chains and mutated valid messages: the parser
returns or raises WireError, never anything else, and never hangs.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wire import strategies
from wire import WireError, lbmc
from wire.lbmc import (
    ChainElement,
    HeaderKind,
    LbmcMessage,
    MessageType,
    OpaqueHeader,
    Topicname,
    UmePreg,
    UmeReceiverKeepalive,
    UmeStoreid,
    parse_message,
    parse_messages,
)

KINDS = lbmc.header_kinds()

# docs/wire-lbmc.md §1.6: the codes tshark's LBMC dissector defines (0x03 TGIDX is defined but
# unhandled: tshark flags it as "Invalid LBMC header type").
DEFINED_CODES = frozenset(
    [*range(0x01, 0x1F), 0x20, *range(0x30, 0x59), 0x60, *range(0x62, 0x66),
     *range(0x67, 0x6C), 0xFE])
UNDEFINED_CODES = sorted(set(range(0x01, 0xFF)) - DEFINED_CODES)
INVALID_TYPES = sorted(set(range(16)) - {t.value for t in MessageType})

# a CONTROL message: UME_STOREID at offset 4, UME_PREG at offset 8, msglen 36
PREG = LbmcMessage(headers=[UmeStoreid(store_id=1), UmePreg(reg_id=7)]).build()
# a DATA message: base 12 bytes, TOPICNAME at 12 (hdr_len 6), payload "abc"
DATA = LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=2, headers=[Topicname(topic="tt")],
                   payload=b"abc").build()


def patched(raw: bytes, **changes: Any) -> bytes:
    """``raw`` with bytes replaced: ``at_<offset>=value`` for one byte, ``msglen=n``."""
    out = bytearray(raw)
    for key, value in changes.items():
        if key == "msglen":
            out[2:4] = int(value).to_bytes(2, "big")
        else:
            out[int(key.removeprefix("at_"))] = value
    return bytes(out)


def expect_error(raw: bytes, header: str, offset: int, *reason_words: str) -> WireError:
    with pytest.raises(WireError) as info:
        parse_message(raw)
    error = info.value
    assert (error.header, error.offset) == (header, offset), error
    assert error.reason and str(error) == f"{header} at offset {offset}: {error.reason}"
    for word in reason_words:
        assert re.search(word, error.reason), (word, error.reason)
    return error


def test_fixtures_have_the_layout_the_cases_assume() -> None:
    assert len(PREG) == 36 and PREG[4] == 0x12 and PREG[5] == 4 and PREG[9] == 28
    assert len(DATA) == 21 and DATA[1] == 0x05 and DATA[13] == 6
    assert parse_message(PREG)[1] == 36 and parse_message(DATA)[1] == 21


@pytest.mark.parametrize(("raw", "header", "offset", "words"), [
    pytest.param(b"", "lbmc", 0, [r"\b0 bytes", r"\b4\b"], id="empty"),
    pytest.param(PREG[:3], "lbmc", 0, [r"\b3 bytes", r"\b4\b"], id="3-bytes"),
    pytest.param(PREG[:10], "lbmc", 2, [r"\b36\b", r"\b10\b", "truncated"], id="truncated"),
    pytest.param(DATA[:12], "lbmc", 2, [r"\b21\b", r"\b12\b"], id="truncated-data"),
    pytest.param(PREG[:-1], "lbmc", 2, [r"\b36\b", r"\b35\b"], id="one-byte-short"),
    pytest.param(patched(PREG, msglen=0), "lbmc", 2, ["zero"], id="msglen-0"),
    pytest.param(patched(DATA, msglen=0), "lbmc", 2, ["zero"], id="msglen-0-data"),
    pytest.param(patched(PREG, msglen=3), "lbmc", 2, [r"\b3\b", r"\b4-byte"],
                 id="msglen-below-control-base"),
    pytest.param(patched(DATA, msglen=11), "lbmc", 2, [r"\b11\b", r"\b12-byte"],
                 id="msglen-below-data-base"),
    pytest.param(patched(PREG, msglen=37), "lbmc", 2, [r"\b37\b", r"\b36\b"],
                 id="msglen-beyond-data"),
    pytest.param(patched(PREG, at_5=0), "lbmc.ume_storeid", 4, ["zero"], id="hdr_len-0-first"),
    pytest.param(patched(PREG, at_9=0), "lbmc.ume_preg", 8, ["zero"], id="hdr_len-0-second"),
    pytest.param(patched(DATA, at_13=0), "lbmc.topicname", 12, ["zero"], id="hdr_len-0-data"),
    pytest.param(patched(PREG, at_9=20), "lbmc.ume_preg", 8, [r"\b20\b", r"\b28-byte"],
                 id="spec-frame-8-preg-hdr_len-20"),
    pytest.param(patched(PREG, at_9=29), "lbmc.ume_preg", 8, [r"\b29\b", r"\b36\b"],
                 id="hdr_len-past-msglen"),
    pytest.param(patched(PREG, at_9=255), "lbmc.ume_preg", 8, [r"\b255\b"],
                 id="hdr_len-255"),
    # docs/wire-lbmc.md §6.3 frame 16: msglen 8 is shorter than the PREG it announces
    pytest.param(bytes.fromhex("08120008ff1c0081") + bytes(24), "lbmc.ume_preg", 4,
                 [r"\b28\b", r"\b8\b"], id="spec-frame-16-msglen-8"),
    pytest.param(patched(DATA, at_13=10), "lbmc.topicname", 12, [r"\b10\b", r"\b21\b"],
                 id="topicname-past-msglen"),
    # docs/wire-lbmc.md §6.3 frame 14: topicname with hdr_len 4 ("Header length incorrect")
    pytest.param(bytes.fromhex("08050008ff040000"), "lbmc.topicname", 4, [r"\b4\b", r"\b5\b"],
                 id="spec-frame-14-topicname-hdr_len-4"),
    # docs/wire-lbmc.md §6.3 frame 9: unknown code 0x21 after a STOREID
    pytest.param(patched(PREG, at_4=0x21), "lbmc", 8, ["0x21"], id="spec-frame-9-code-0x21"),
    pytest.param(patched(PREG, at_4=0x03), "lbmc", 8, ["0x03"], id="tgidx-0x03"),
    pytest.param(patched(PREG, at_1=0x21), "lbmc", 4, ["0x21"], id="unknown-first-code"),
    # docs/wire-lbmc.md §6.3 frame 17: invalid type 3
    pytest.param(patched(PREG, at_0=0x03), "lbmc", 0, ["0x03"], id="spec-frame-17-type-3"),
])
def test_error_cases(raw: bytes, header: str, offset: int, words: list[str]) -> None:
    expect_error(raw, header, offset, *words)


def _with(kind: HeaderKind) -> bytes:
    """A CONTROL message: UME_STOREID at 4, then one header of ``kind`` at 8, then NONE."""
    cls = lbmc.header_class(kind.code)
    assert cls is not None
    extra: dict[str, Any] = {}
    if kind.name == "topicname":
        extra = {"topic": "x"}
    elif kind.name == "ume_storename":
        extra = {"store": "x"}
    elif kind.name == "apphdr":
        extra = {"data": b"x"}
    raw = LbmcMessage(headers=[UmeStoreid(store_id=2), cls(**extra)]).build()
    assert raw[4] == kind.code and raw[9] >= kind.min_len
    return raw


KIND_PARAMS = [pytest.param(k, id=k.name) for k in KINDS]


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_hdr_len_shorter_than_the_layout(kind: HeaderKind) -> None:
    short = kind.min_len - 1
    raw = patched(_with(kind), at_9=short)
    expect_error(raw, kind.tshark, 8, rf"\b{short}\b", rf"\b{kind.min_len}-byte")


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_hdr_len_zero(kind: HeaderKind) -> None:
    expect_error(patched(_with(kind), at_9=0), kind.tshark, 8, "zero")


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_hdr_len_running_past_msglen(kind: HeaderKind) -> None:
    raw = _with(kind)
    expect_error(patched(raw, at_9=raw[9] + 1), kind.tshark, 8, rf"\b{raw[9] + 1}\b",
                 rf"\b{len(raw)}\b")


@pytest.mark.parametrize("code", [*UNDEFINED_CODES, 0x03], ids=lambda c: f"0x{c:02x}")
def test_undefined_header_codes(code: int) -> None:
    expect_error(patched(PREG, at_4=code), "lbmc", 8, f"0x{code:02x}")
    assert lbmc.is_defined_code(code) == (code == 0x03)


def test_the_defined_codes_are_those_of_the_fact_sheet() -> None:
    known = {k.code for k in KINDS} | set(lbmc.KNOWN_CODES)
    assert known == DEFINED_CODES
    for code in sorted(DEFINED_CODES - {0x03}):
        assert lbmc.is_defined_code(code)


@pytest.mark.parametrize("nibble", INVALID_TYPES, ids=lambda t: f"type-0x{t:x}")
@pytest.mark.parametrize("version", [0, 1])
def test_invalid_type_nibbles(nibble: int, version: int) -> None:
    expect_error(patched(PREG, at_0=(version << 4) | nibble), "lbmc", 0, f"0x{nibble:02x}")


def test_version_nibble_is_not_checked() -> None:
    """docs/wire-lbmc.md §1.1: LBT-TCP's entry test checks the version, the LBMC loop not."""
    message, _ = parse_message(patched(PREG, at_0=0x18))
    assert (message.version, message.type) == (1, MessageType.CONTROL)


def test_offsets_are_relative_to_the_given_offset() -> None:
    bad = patched(PREG, at_9=20)
    with pytest.raises(WireError) as info:
        parse_message(b"\xAA" * 5 + bad, 5)
    assert (info.value.header, info.value.offset) == ("lbmc.ume_preg", 8)


def test_parse_messages_reports_offsets_in_the_whole_buffer() -> None:
    with pytest.raises(WireError) as info:
        parse_messages(PREG + DATA + patched(PREG, at_9=20))
    assert (info.value.header, info.value.offset) == ("lbmc.ume_preg", 36 + 21 + 8)
    with pytest.raises(WireError) as info:
        parse_messages(PREG + PREG[:10])
    assert (info.value.header, info.value.offset) == ("lbmc", 36 + 2)


def test_parse_messages_stops_quietly_before_a_partial_base_header() -> None:
    """Like tshark: fewer than 4 bytes left end the buffer without an error."""
    assert len(parse_messages(PREG + b"\x08\x12\x00")) == 1
    assert parse_messages(b"") == []


# --- encoding errors ---------------------------------------------------------------------------


def test_values_that_do_not_fit_name_the_header_and_its_offset() -> None:
    message = LbmcMessage(headers=[UmeStoreid(), UmePreg(reg_id=1 << 32)])
    with pytest.raises(WireError) as info:
        message.build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.ume_preg", 8)
    data = LbmcMessage(type=MessageType.MESSAGE, headers=[UmePreg(resp_ip=-1)])
    with pytest.raises(WireError) as info:
        data.build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.ume_preg", 12)
    slow_path = LbmcMessage(headers=[UmePreg(resp_ip="1.2.3.256", trailing=b"x")])
    with pytest.raises(WireError) as info:
        slow_path.build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.ume_preg", 4)
    with pytest.raises(WireError) as info:
        LbmcMessage(headers=[UmePreg(resp_port=-1)]).build()
    assert info.value.header == "lbmc/lbmc.ume_preg"


def test_lengths_that_do_not_fit() -> None:
    with pytest.raises(WireError) as info:
        LbmcMessage(headers=[UmeStoreid(), Topicname(topic="t" * 252)]).build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.topicname", 8)
    with pytest.raises(WireError) as info:
        LbmcMessage(headers=[OpaqueHeader(0x30, b"\0" * 300)]).build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.umq_reg", 4)
    with pytest.raises(WireError) as info:
        LbmcMessage(type=MessageType.MESSAGE, payload=b"x" * 65524).build()
    assert (info.value.header, info.value.offset) == ("lbmc", 2)
    assert len(LbmcMessage(type=MessageType.MESSAGE, payload=b"x" * 65523).build()) == 65535
    with pytest.raises(WireError) as info:
        LbmcMessage(type=16).build()
    assert (info.value.header, info.value.offset) == ("lbmc", 0)
    with pytest.raises(WireError):
        LbmcMessage(version=16).build()


def test_apphdr_chain_errors() -> None:
    """Elements are walked as tshark does: the first type from first_chain_hdr, every later
    type from the element's own byte 0 (see lbmc.ChainElement)."""
    chain = lbmc.AppHdrChain(first_chain_hdr=5, elements=bytes.fromhex("ff00 0000"))
    with pytest.raises(WireError) as info:
        lbmc.parse_apphdr_chain(chain)
    assert (info.value.header, info.value.offset) == ("lbmc.apphdr_chain.element", 4)
    # a generic element of hdr_len 4 (no data) is "Header length incorrect" to tshark
    chain = lbmc.AppHdrChain(first_chain_hdr=5, elements=bytes.fromhex("0504 0000"))
    with pytest.raises(WireError) as info:
        lbmc.parse_apphdr_chain(chain)
    assert (info.value.header, info.value.offset) == ("lbmc.apphdr_chain.element", 4)
    assert re.search(r"\b4\b", info.value.reason)
    assert lbmc.parse_apphdr_chain(lbmc.AppHdrChain(
        first_chain_hdr=5, elements=bytes.fromhex("0505 0000 aa"))) == [
        ChainElement(5, data=b"\xaa", tag=5)]
    # the second element announces itself as type 6 in its own byte 0, and is cut after 4 bytes
    chain = lbmc.AppHdrChain(first_chain_hdr=5,
                             elements=bytes.fromhex("0505 0000 aa 0608 0000"))
    with pytest.raises(WireError) as info:
        lbmc.parse_apphdr_chain(chain)
    assert (info.value.header, info.value.offset) == ("lbmc.apphdr_chain.msgprop", 9)
    # fewer than 4 bytes left: not an element at all
    chain = lbmc.AppHdrChain(first_chain_hdr=5, elements=bytes.fromhex("0505 0000 aa 0608 00"))
    with pytest.raises(WireError) as info:
        lbmc.parse_apphdr_chain(chain)
    assert (info.value.header, info.value.offset) == ("lbmc.apphdr_chain.element", 9)
    chain = lbmc.AppHdrChain(first_chain_hdr=5, elements=bytes.fromhex("ff09 0000 00"))
    with pytest.raises(WireError) as info:
        lbmc.parse_apphdr_chain(chain)
    assert info.value.header == "lbmc.apphdr_chain.element"
    assert re.search(r"\b9\b", info.value.reason)


# (was a bug: the struct fast path's '8s' silently zero-padded b"abc" and cut a 10-byte value
# to 8, where the Construct path, taken when there are trailing bytes, raised)
@pytest.mark.parametrize("value", [b"", b"abc", b"abcdefg", b"abcdefghi", b"abcdefghij"])
@pytest.mark.parametrize("trailing", [b"", b"xy"], ids=["fast-path", "construct-path"])
def test_wrong_length_bytes_are_refused(value: bytes, trailing: bytes) -> None:
    message = LbmcMessage(headers=[UmeStoreid(),
                                   UmeReceiverKeepalive(ctxinst=value, trailing=trailing)])
    with pytest.raises(WireError) as info:
        message.build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.ume_receiver_keepalive", 8)
    assert "ctxinst" in info.value.reason or "8" in info.value.reason
    # the right length builds on both paths
    message.headers[1].ctxinst = b"abcdefgh"
    assert b"abcdefgh" + trailing in message.build()


# (was a bug: the fast path packed IPv4 text with inet_aton: '010.0.0.1' became 8.0.0.1)
@pytest.mark.parametrize("text", ["010.0.0.1", "127.1"])
def test_ambiguous_ipv4_text_is_refused(text: str) -> None:
    with pytest.raises(WireError):
        LbmcMessage(headers=[UmePreg(resp_ip=text)]).build()


# (was a bug: inet_aton's OSError escaped from Header.encode instead of WireError)
@pytest.mark.parametrize("text", ["1.2.3.256", "not an address"])
def test_invalid_ipv4_text_raises_wire_error(text: str) -> None:
    with pytest.raises(WireError) as info:
        LbmcMessage(headers=[UmeStoreid(), UmePreg(resp_ip=text)]).build()
    assert (info.value.header, info.value.offset) == ("lbmc/lbmc.ume_preg", 8)


# (was a bug: build_apphdr_chain() let construct.FormatFieldError escape)
@pytest.mark.parametrize(("elements", "header", "offset"), [
    pytest.param([ChainElement(1, data=b"x" * 300)], "lbmc.apphdr_chain.element", 4,
                 id="long-data"),
    pytest.param([ChainElement(6, proplen=-1)], "lbmc.apphdr_chain.element", 4, id="proplen"),
    pytest.param([ChainElement(6, proplen=1 << 32)], "lbmc.apphdr_chain.element", 4,
                 id="proplen-too-big"),
    pytest.param([ChainElement(1)], "lbmc.apphdr_chain.element", 4, id="empty-data"),
    pytest.param([ChainElement(1, data=b"a"), ChainElement(2)], "lbmc.apphdr_chain.element", 9,
                 id="empty-data-second"),
    pytest.param([ChainElement(1, data=b"x" * 130)] * 2, "lbmc.apphdr_chain", 1,
                 id="total-over-255"),
])
def test_apphdr_chain_values_that_do_not_fit(elements: list[ChainElement], header: str,
                                             offset: int) -> None:
    with pytest.raises(WireError) as info:
        lbmc.build_apphdr_chain(elements)
    assert (info.value.header, info.value.offset) == (header, offset)


def test_apphdr_chain_lengths_at_the_limits() -> None:
    """One data byte and a 255-byte header are the extremes that still build."""
    assert lbmc.build_apphdr_chain([ChainElement(1, data=b"x")]).elements == bytes.fromhex(
        "0105 0000 78")
    longest = lbmc.build_apphdr_chain([ChainElement(1, data=b"x" * 247)])
    raw = LbmcMessage(headers=[longest]).build()
    assert (raw[5], longest.elements[1]) == (255, 251)
    with pytest.raises(WireError):
        lbmc.build_apphdr_chain([ChainElement(1, data=b"x" * 248)])


# (was a bug: opaque headers shorter than the layout tshark reads, hdr_len 1 included, were
# accepted; tshark marks them Malformed, checked in test_lbmc_oracle.py)
@pytest.mark.parametrize(("raw", "header", "offset", "hdr_len", "minimum"), [
    pytest.param(bytes.fromhex("0817000c 62040001 ff040000"), "lbmc.hmac", 8, 4, 24,
                 id="hmac-hdr_len-4"),
    pytest.param(bytes.fromhex("0817000c 30040001 ff040000"), "lbmc.umq_reg", 8, 4, 20,
                 id="umq_reg-hdr_len-4"),
    pytest.param(bytes.fromhex("0817000c 3b040001 ff040000"), "lbmc.advertisement", 8, 4, 48,
                 id="advertisement-hdr_len-4"),
    pytest.param(bytes.fromhex("0817000c 33040001 ff040000"), "lbmc.umq_rcr", 8, 4, 48,
                 id="umq_rcr-hdr_len-4"),
    pytest.param(bytes.fromhex("0830000a ff01 00000000"), "lbmc.umq_reg", 4, 1, 20,
                 id="umq_reg-hdr_len-1"),
])
def test_opaque_headers_shorter_than_tshark_layout_are_rejected(
        raw: bytes, header: str, offset: int, hdr_len: int, minimum: int) -> None:
    expect_error(raw, header, offset, rf"\b{hdr_len}\b", rf"\b{minimum}-byte minimum")


OPAQUE_CODES = [pytest.param(c, id=f"0x{c:02x}") for c in sorted(lbmc.OPAQUE_MIN_LEN)]


def test_every_opaque_code_has_a_minimum() -> None:
    """Every code tshark dissects that we carry opaquely has its layout's minimum length; TGIDX
    (0x03, never dissected cleanly) has none and cannot be built."""
    opaque = set(lbmc.KNOWN_CODES) - {k.code for k in KINDS}
    assert set(lbmc.OPAQUE_MIN_LEN) == opaque - {0x03}
    assert all(4 <= n <= 255 for n in lbmc.OPAQUE_MIN_LEN.values())
    with pytest.raises(ValueError):
        OpaqueHeader(0x03)


@pytest.mark.parametrize("code", OPAQUE_CODES)
def test_opaque_header_minimum_lengths(code: int) -> None:
    """hdr_len = the minimum parses (and is OpaqueHeader's default); one byte less is refused
    with the header's name, its offset and both lengths."""
    need = lbmc.OPAQUE_MIN_LEN[code]
    header = OpaqueHeader(code)
    assert header.data == bytes(need - 2)
    raw = LbmcMessage(headers=[UmeStoreid(store_id=3), header]).build()
    assert (raw[4], raw[8], raw[9], len(raw)) == (code, 0xFF, need, 8 + need)
    parsed, _ = parse_message(raw)
    assert parsed.headers[1] == header
    assert parsed.build() == raw
    # one data byte less (another header follows, so the 4-byte minimum is walked too)
    short = LbmcMessage(headers=[UmeStoreid(store_id=3), OpaqueHeader(code, bytes(need - 3)),
                                 UmeStoreid(store_id=4)]).build()
    assert short[9] == need - 1
    expect_error(short, lbmc.KNOWN_CODES[code][1], 8, rf"\b{need - 1}\b",
                 rf"\b{need}-byte minimum")
    # the data alone does not decide: a crafted hdr_len is checked too
    crafted = LbmcMessage(headers=[UmeStoreid(store_id=3),
                                   OpaqueHeader(code, bytes(need - 2), hdr_len=need - 1)]).build()
    assert crafted == patched(raw, at_9=need - 1)
    expect_error(crafted, lbmc.KNOWN_CODES[code][1], 8, rf"\b{need - 1}\b")


# --- fuzzing -------------------------------------------------------------------------------------

# Parsing is cheap, so the fuzz properties run ten times the profile's example count (300 with
# the default profile, 30000 with HYPOTHESIS_PROFILE=fuzz).  The deadline is the "never hangs"
# check: no input of a few hundred bytes may take seconds.
FUZZ = settings(deadline=timedelta(seconds=2), max_examples=10 * settings().max_examples)


def check_parse(raw: bytes) -> None:
    """parse_message / parse_messages either decode or raise WireError; what they decode is
    consistent (lengths, offsets) and rebuilds to the same bytes."""
    try:
        message, used = parse_message(raw)
    except WireError as error:
        assert error.header.startswith("lbmc") and error.reason
        assert 0 <= error.offset <= len(raw)
    else:
        assert 4 <= used <= len(raw)
        assert used == int.from_bytes(raw[2:4], "big")
        assert message.build() == raw[:used]
    try:
        positions = [pos for pos, _ in lbmc.iter_messages(raw)]
    except WireError as error:
        assert error.header.startswith("lbmc") and error.reason
        assert 0 <= error.offset <= len(raw)
    else:
        assert positions == sorted(set(positions))
        assert all(p + 4 <= len(raw) for p in positions)
        assert len(parse_messages(raw)) == len(positions)


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(raw: bytes) -> None:
    check_parse(raw)


@st.composite
def structured_bytes(draw: st.DrawFn) -> bytes:
    """Plausible base headers with random chains: gets past the first checks into the walk."""
    mtype = draw(st.sampled_from(list(MessageType) * 8 + INVALID_TYPES))  # mostly valid
    codes = st.sampled_from(sorted(DEFINED_CODES | {0x00, 0xFF, 0x21, 0x66}))
    base = 12 if mtype in lbmc.DATA_TYPES else 4
    body = bytearray()
    # lengths: the edges (0-4) and every layout size as often as arbitrary ones
    sizes = sorted({k.min_len for k in KINDS} | set(range(5)))
    lengths = st.one_of(st.sampled_from(sizes), st.integers(0, 60))
    for _ in range(draw(st.integers(0, 5))):
        length = draw(lengths)
        body += bytes([draw(codes), length]) + draw(
            st.binary(min_size=max(0, length - 2), max_size=max(0, length - 2)))
    total = base + len(body) + draw(st.integers(0, 6))
    msglen = draw(st.one_of(st.just(total), st.integers(0, total + 8)))
    head = bytes([mtype, draw(codes)]) + msglen.to_bytes(2, "big") + draw(
        st.binary(min_size=base - 4, max_size=base - 4))
    raw = head + bytes(body)
    return raw + draw(st.binary(min_size=max(0, total - len(raw)),
                                max_size=max(0, total - len(raw))))


@FUZZ
@given(st.lists(structured_bytes(), min_size=1, max_size=3).map(b"".join))
def test_fuzz_structured_chains(raw: bytes) -> None:
    check_parse(raw)


@st.composite
def mutated_messages(draw: st.DrawFn) -> bytes:
    """Valid messages (strategies.messages) with bytes flipped, set, inserted, deleted, cut."""
    messages = draw(st.lists(strategies.messages(max_headers=3), min_size=1, max_size=3))
    raw = bytearray(lbmc.build_messages(messages))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        index = draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "insert":
            raw[index:index] = draw(st.binary(min_size=1, max_size=4))
        elif not raw:
            continue
        elif op == "flip":
            raw[index] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            raw[index] = draw(st.sampled_from([0x00, 0x01, 0x03, 0x04, 0x0C, 0xFF, 0x80]))
        elif op == "delete":
            del raw[index]
        else:
            del raw[index:]
    return bytes(raw)


@FUZZ
@given(mutated_messages())
def test_fuzz_mutated_valid_messages(raw: bytes) -> None:
    check_parse(raw)


def test_long_chains_parse_quickly() -> None:
    """A 64 KiB message of 4-byte headers, and 8000 back-to-back messages, parse at once."""
    message = LbmcMessage(headers=[UmeStoreid(store_id=i % 0x7FFF) for i in range(16380)])
    raw = message.build()
    assert len(raw) == 65524
    parsed, _ = parse_message(raw)
    assert len(parsed.headers) == 16380
    many = LbmcMessage(headers=[UmeStoreid()]).build() * 8000
    assert len(parse_messages(many)) == 8000
