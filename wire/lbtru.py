"""LBT-RU: UM's reliable unicast transport over UDP (``packet-lbtru.c``, tshark 4.0.x).

Layouts follow ``docs/wire-transports.md`` §1.  Each packet type is one Construct
struct below (the 4-byte common header, with that type's reading of ``flags_or_res``, followed by
the type body); each option is one struct too.  Those structs are the only place a layout is
written: the codec packs and unpacks through layouts :func:`~wire.fastpath.derive` compiles from
them, and tshark names and flag bits are read off their members.

A datagram is an :class:`LbtruPacket` subclass (:class:`LbtruData`, :class:`LbtruSm`,
:class:`LbtruNak`, :class:`LbtruNcf`, :class:`LbtruAck`, :class:`LbtruCreq`, :class:`LbtruRst`)
holding the struct's values, an ordered option list (:class:`SidOption`, :class:`CidOption`,
:class:`UnknownOption`) and, for DATA, the LBMC messages of the payload.  Counts (``num_naks``,
``num_ncfs``), option ``hdr_len`` and every ``next_hdr`` of the chain are computed when building
unless given explicitly, so a conformance case can craft wrong ones.

Decisions (HINT items of the fact sheet) and their reasons:

* **RST options.**  tshark forgets to step over ``flags_or_res`` for RST and reads options from
  offset 2, so any RST with options is shown as malformed ("Zero-length header").  Real UM most
  likely puts them at offset 4 like every other type.  We therefore *parse* RST options at offset
  4, but :meth:`LbtruRst.build` refuses to emit options unless ``allow_options=True`` is passed
  (a parsed RST that had options carries that flag, so it still round-trips).  A tshark-clean
  RST has ``next_hdr`` 0 and no options.
* **Unknown option codes** are kept as :class:`UnknownOption` (opaque, round-trip) rather than
  rejected, because UM may add options; tshark flags them ("Unrecognized header", an Error).
  Any option must be at least the 4-byte basic option header; SID and CID at least 8 bytes
  (a longer ``hdr_len`` keeps the extra bytes in ``trailing``).
* **Bytes tshark ignores** are kept in ``trailer`` so parse/build round-trips byte for byte:
  for DATA the 1-3 bytes after the last LBMC message (too short for a message; tshark stops
  quietly), for other types whatever follows the options.
* **Unknown packet types** raise :class:`WireError` when parsing (tshark reports them as an
  Error); :class:`LbtruUnknown` can still *build* one (header and trailer only) for negative tests.
* Version nibbles other than 0 are accepted, as tshark accepts them.
* **Empty NAK/NCF lists** are valid here, but tshark 4.0.17 throws an exception (malformed)
  when such a list ends the datagram (it adds the list item with length -1 at the end of the
  buffer).  A tshark-clean NAK/NCF lists at least one sequence number.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import construct as cs

from .errors import WireError
from .fastpath import derive
from .fields import (
    U8,
    U16,
    U32,
    Auto,
    Bit,
    field,
)
from .transport import (  # noqa: F401 - re-exported: the machinery used to live here
    CodedOption,
    CountOf,
    Record,
    RestOf,
    TransportCodec,
    TransportOption,
    TransportPacket,
    never,
)

# =============================================================================================
# LBT-RU definitions
# =============================================================================================


class PacketType(IntEnum):
    """The type nibble of ``ver_type`` (``lbtru.hdr.type``)."""

    DATA = 0x0
    SM = 0x2
    NAK = 0x3
    NCF = 0x4
    ACK = 0x5
    CREQ = 0x6
    RST = 0x7


class OptionCode(IntEnum):
    """``next_hdr`` values: 0x00 ends the chain (payload follows), others name an option."""

    DATA = 0x00
    SID = 0x01
    CID = 0x02


class NcfReason(IntEnum):
    """High nibble of the NCF ``reason_format`` byte (shared with LBT-RM)."""

    NO_RETRY = 0
    IGNORED = 1
    RX_DELAY = 2
    SHED = 3


NCF_REASON_TEXT = {0: "Do not retry", 1: "NAK Ignored", 2: "Retransmit Delay", 3: "NAK Shed"}
FORMAT_SELECTIVE = 0
CREQ_SYN = 0x0000
RST_DEFAULT = 0x0000
FLAG_RX = 0x4000
FLAG_SYN = 0x8000
OPT_IGNORE = 0x8000

VER_TYPE_BITS = {
    "version": Bit(0xF0, tshark="lbtru.hdr.ver"),
    "type": Bit(0x0F, tshark="lbtru.hdr.type"),
}


def _common(flags_or_res: cs.Renamed) -> tuple[cs.Renamed, ...]:
    """The 4-byte common header; ``flags_or_res`` is this type's reading of bytes 2-3."""
    return (
        field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
        field("next_hdr", U8, tshark="lbtru.hdr.next_hdr"),
        flags_or_res,
    )


def _res() -> cs.Renamed:
    return field("res", U16, tshark="lbtru.hdr.res")


DataHeader = cs.Struct(
    *_common(field("flags", U16, tshark="lbtru.hdr.flags",
                   bits={"rx": Bit(FLAG_RX, tshark="lbtru.hdr.flags.rx")})),
    field("sqn", U32),
    field("trail_sqn", U32, tshark="trail"),
)
"""DATA: header (flags: 0x4000 = retransmission) and 8-byte body; options, then LBMC."""

SmHeader = cs.Struct(
    *_common(field("flags", U16, tshark="lbtru.hdr.flags",
                   bits={"syn": Bit(FLAG_SYN, tshark="lbtru.hdr.flags.syn")})),
    field("sm_sqn", U32, tshark="sqn"),
    field("lead_sqn", U32, tshark="lead"),
    field("trail_sqn", U32, tshark="trail"),
)
"""SM (session message): flags 0x8000 = SYN, own sequence number, leading/trailing edges."""

NakEntry = cs.Struct(field("nak", U32))
NcfEntry = cs.Struct(field("ncf", U32))

NakHeader = cs.Struct(
    *_common(_res()),
    field("num_naks", Auto(U16, lambda ctx: len(ctx.naks)), tshark="num"),
    field("format_word", U16, tshark=None,
          bits={"format": Bit(0x000F, tshark="format")}),
    field("naks", cs.Array(CountOf("num_naks", "naks"), NakEntry), tshark="list"),
)
"""NAK: count, format (low nibble, 0 = selective), the NAKed sequence numbers."""

NcfHeader = cs.Struct(
    *_common(_res()),
    field("trail_sqn", U32, tshark="trail"),
    field("num_ncfs", Auto(U16, lambda ctx: len(ctx.ncfs)), tshark="num"),
    field("reserved", U8),
    field("reason_format", U8, tshark=None, bits={
        "reason": Bit(0xF0, tshark="reason"), "format": Bit(0x0F, tshark="format")}),
    field("ncfs", cs.Array(CountOf("num_ncfs", "ncfs"), NcfEntry), tshark="list"),
)
"""NCF (NAK confirmation): trailing edge, count, reason/format nibbles, confirmed sqns."""

AckHeader = cs.Struct(*_common(_res()), field("ack_sqn", U32, tshark="sqn"))
"""ACK: the acknowledged sequence number."""

CreqHeader = cs.Struct(*_common(field("request", U16, tshark="lbtru.hdr.request")))
"""CREQ (connection request): no body; bytes 2-3 are the request code (0 = SYN)."""

RstHeader = cs.Struct(*_common(field("reason", U16, tshark="lbtru.hdr.reason")))
"""RST (reset): no body; bytes 2-3 are the reason code (0 = default)."""

UnknownTypeHeader = cs.Struct(*_common(field("flags_or_res", U16, tshark=None)))
"""The common header alone, for crafting undefined types (tshark shows no flags field)."""


def _option(value: cs.Renamed) -> cs.Struct:
    """An 8-byte option: next_hdr, hdr_len, flags (0x8000 ignore), one u32; a longer hdr_len
    keeps its extra bytes in ``trailing`` (tshark skips them)."""
    return cs.Struct(
        field("next_hdr", U8),
        field("hdr_len", Auto(U8, lambda ctx: 8 + len(ctx.get("trailing") or b""))),
        field("flags", U16, bits={"ignore": OPT_IGNORE}),
        value,
        field("trailing", cs.Bytes(RestOf("hdr_len", 8)), tshark=None),
    )


SidOpt = _option(field("session_id", U32))
"""SID option: the session ID that, with source IP and port, names the transport session."""

CidOpt = _option(field("client_id", U32))
"""CID option: the client ID a source assigns each receiver (displayed only by tshark)."""

UnknownOpt = cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 4 + len(ctx.data))),
    field("res", U16, tshark=None),
    field("data", cs.Bytes(RestOf("hdr_len", 4)), tshark=None),
)
"""Any other option code: the basic 4-byte option header and opaque data."""


# --- options ---------------------------------------------------------------------------------


class LbtruOption(TransportOption):
    """Base class of LBT-RU options."""

    __slots__ = ()


class SidOption(LbtruOption):
    """SID (0x01).  ``SidOption(session_id=0x1234)``."""

    struct = SidOpt
    prefix = "lbtru.opt_sid"
    code = OptionCode.SID
    __slots__ = ()


class CidOption(LbtruOption):
    """CID (0x02).  ``CidOption(client_id=7)``."""

    struct = CidOpt
    prefix = "lbtru.opt_cid"
    code = OptionCode.CID
    __slots__ = ()


class UnknownOption(CodedOption, LbtruOption):
    """An option code tshark does not know, carried opaquely: ``UnknownOption(9, data=b"..")``."""

    struct = UnknownOpt
    prefix = "lbtru.opt_unknown"
    __slots__ = ()


# --- packets ---------------------------------------------------------------------------------


class LbtruPacket(TransportPacket):
    """Base class of LBT-RU datagrams."""

    protocol = "lbtru"
    __slots__ = ()

    @property
    def session_id(self) -> int:
        """The session ID tshark uses: the last SID option's, or 0 without one."""
        sid = 0
        for option in self.options:
            if isinstance(option, SidOption):
                sid = option.session_id
        return sid

    @property
    def client_id(self) -> int | None:
        """The last CID option's client ID, or None."""
        cid = None
        for option in self.options:
            if isinstance(option, CidOption):
                cid = option.client_id
        return cid

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Errors", f"Unrecognized header 0x{o.code:02x}")
                for o in self.options if isinstance(o, UnknownOption)]


class LbtruData(LbtruPacket):
    """DATA (0x0): ``LbtruData(sqn=5, trail_sqn=1, rx=1, options=[SidOption(session_id=1)],
    payload=[LbmcMessage(...)])``."""

    struct = DataHeader
    prefix = "lbtru.data"
    type_code = PacketType.DATA
    carries_lbmc = True
    __slots__ = ()

    def info(self) -> str:
        return f"DATA{'(RX)' if self.rx else ''} sqn 0x{self.sqn:x}"


class LbtruSm(LbtruPacket):
    """SM (0x2): ``LbtruSm(sm_sqn=1, lead_sqn=9, trail_sqn=0, syn=1)``."""

    struct = SmHeader
    prefix = "lbtru.sm"
    type_code = PacketType.SM
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Chats", "SM SYN" if self.syn else "SM"), *super().expert_items()]

    def info(self) -> str:
        return f"SM sqn 0x{self.sm_sqn:x}{' SYN' if self.syn else ''}"


class LbtruNak(LbtruPacket):
    """NAK (0x3): ``LbtruNak(naks=[3, 4])``; ``num_naks`` is computed unless given."""

    struct = NakHeader
    prefix = "lbtru.nak"
    type_code = PacketType.NAK
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Warns", "NAK"), *super().expert_items()]

    def info(self) -> str:
        return f"NAK {self.header_values()['num_naks']} naks"


class LbtruNcf(LbtruPacket):
    """NCF (0x4): ``LbtruNcf(trail_sqn=2, reason=NcfReason.RX_DELAY, ncfs=[3, 4])``."""

    struct = NcfHeader
    prefix = "lbtru.ncf"
    type_code = PacketType.NCF
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Notes", f"NCF {ncf_reason_text(self.reason)}"), *super().expert_items()]

    def info(self) -> str:
        return f"NCF {self.header_values()['num_ncfs']} ncfs"


class LbtruAck(LbtruPacket):
    """ACK (0x5): ``LbtruAck(ack_sqn=5, options=[CidOption(client_id=7)])``."""

    struct = AckHeader
    prefix = "lbtru.ack"
    type_code = PacketType.ACK
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Chats", "ACK"), *super().expert_items()]

    def info(self) -> str:
        return f"ACK sqn 0x{self.ack_sqn:x}"


class LbtruCreq(LbtruPacket):
    """CREQ (0x6): ``LbtruCreq(request=CREQ_SYN)``."""

    struct = CreqHeader
    prefix = "lbtru.creq"
    type_code = PacketType.CREQ
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        text = "SYN" if self.request == CREQ_SYN else f"Unknown (0x{self.request:04x})"
        return [("Chats", f"CREQ {text}"), *super().expert_items()]

    def info(self) -> str:
        text = "SYN" if self.request == CREQ_SYN else f"Unknown (0x{self.request:02x})"
        return f"CREQ {text}"


class LbtruRst(LbtruPacket):
    """RST (0x7): ``LbtruRst(reason=RST_DEFAULT)``.

    Options: see the module docstring.  tshark reads RST options from offset 2 (a dissector
    bug), so :meth:`build` refuses options unless ``allow_options`` is true; they are then
    placed at offset 4, where this parser also reads them.  :meth:`tshark_fields` lists the
    header only, because tshark's view of RST options is garbage.
    """

    struct = RstHeader
    prefix = "lbtru.rst"
    type_code = PacketType.RST
    options_tshark = False
    __slots__ = ("allow_options",)
    allow_options: bool

    def __init__(self, *, allow_options: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.allow_options = allow_options

    @classmethod
    def _from_wire(cls, values: dict[str, Any]) -> TransportPacket:
        obj = super()._from_wire(values)
        assert isinstance(obj, LbtruRst)
        obj.allow_options = values["next_hdr"] != 0
        return obj

    def build(self) -> bytes:
        if self.options and not self.allow_options:
            raise WireError(self.prefix, 1, "tshark mis-dissects RST options (reads them at "
                            "offset 2); pass allow_options=True to place them at offset 4")
        return super().build()

    def expert_items(self) -> list[tuple[str, str]]:
        text = "Default" if self.reason == RST_DEFAULT else f"Unknown (0x{self.reason:04x})"
        return [("Chats", f"RST {text}")]

    def info(self) -> str:
        text = "Default" if self.reason == RST_DEFAULT else f"Unknown (0x{self.reason:02x})"
        return f"RST {text}"


class LbtruUnknown(LbtruPacket):
    """An undefined type (0x1, 0x8-0xF), for negative tests: ``LbtruUnknown(type=9)``.

    Builds the common header (and any options/trailer); :func:`parse_packet` rejects it.
    """

    struct = UnknownTypeHeader
    prefix = "lbtru"
    type_code = 0x1
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Errors", f"Unrecognized type 0x{self.type:02x}")]


def ncf_reason_text(reason: int) -> str:
    """tshark's text for an NCF reason nibble."""
    return NCF_REASON_TEXT.get(reason, f"Unknown (0x{reason:02x})")


PACKET_CLASSES: dict[int, type[LbtruPacket]] = {
    cls.type_code: cls for cls in (LbtruData, LbtruSm, LbtruNak, LbtruNcf, LbtruAck, LbtruCreq,
                                   LbtruRst)
}
OPTION_CLASSES: dict[int, type[LbtruOption]] = {SidOption.code: SidOption,
                                                CidOption.code: CidOption}

COMMON = derive(UnknownTypeHeader, name="lbtru")
"""The common header every type starts with (read off the structs, as everything here)."""
HEADER_SIZE = COMMON.size
DATA_FAST = LbtruData.fast
"""The derived 12-byte DATA header layout (ver_type, next_hdr, flags, sqn, trail_sqn)."""

CODEC = TransportCodec(
    protocol="lbtru", header_size=HEADER_SIZE, packets=PACKET_CLASSES, options=OPTION_CLASSES,
    unknown_option=UnknownOption,
)


def parse_packet(buf: bytes | bytearray | memoryview, decode_lbmc: bool = True) -> LbtruPacket:
    """Decode one LBT-RU datagram (a whole UDP payload).

    With ``decode_lbmc`` false a DATA payload stays raw bytes (cheaper, and accepts garbage).
    Raises :class:`WireError` (offsets from the start of the UDP payload) for anything that
    does not decode: short header or body, unknown type, truncated or zero-length option,
    SID/CID shorter than 8 bytes, counts larger than the datagram, bad LBMC.
    """
    packet = CODEC.parse(buf, decode_lbmc)
    assert isinstance(packet, LbtruPacket)
    return packet


def data_header(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, int, int]:
    """Hot path: (ver_type, next_hdr, flags, sqn, trail_sqn) of a DATA datagram, unchecked
    beyond its length.  Raises :class:`WireError` if shorter than the 12-byte DATA header."""
    if len(buf) < DATA_FAST.size:
        raise WireError("lbtru.data", 0, f"{len(buf)} bytes; DATA needs {DATA_FAST.size}")
    ver_type, next_hdr, flags, sqn, trail = DATA_FAST.unpack_from(buf)
    return ver_type, next_hdr, flags, sqn, trail
