"""LBT-RM: UM's reliable multicast transport over UDP (``packet-lbtrm.c``, tshark 4.0.x).

Layouts follow ``docs/wire-transports.md`` §2.  Each packet type is one Construct
struct (the 8-byte header followed by the type body) and is the only place its layout is
written; the codec (shared with LBT-RU, :mod:`wire.lbtru`) packs and unpacks through layouts
derived from them, and tshark names and flag bits are read off their members.

A datagram is an :class:`LbtrmPacket` subclass (:class:`LbtrmData`, :class:`LbtrmSm`,
:class:`LbtrmNak`, :class:`LbtrmNcf`) with an option list (:class:`LbtrmOption`, opaque) and,
for DATA, the LBMC messages of the payload.  Counts, option ``hdr_len`` and the ``next_hdr``
chain are computed when building unless given explicitly.

Decisions and their reasons:

* **Options.**  The format allows a chain of options after the body (4-byte basic header:
  next_hdr, hdr_len, res; then data).  tshark skips them without display, and its heuristic
  rejects every datagram whose header ``next_hdr`` is not 0, so a packet with options is seen
  by tshark only through Decode-As.  We build and parse them (opaque, round-trip) because a
  conformance case may need them, but a tshark-visible packet has none.  A zero ``hdr_len``
  (tshark silently stops there) is a :class:`WireError` here.
* **Flag bits tshark does not display** (DATA: 0x40 multicast NAKs, 0x10 late join, low nibble
  FEC type; SM: everything but 0x80) are named views for Python callers but are not exported
  as tshark fields.
* **Bytes tshark ignores** (1-3 bytes after the last LBMC message of a DATA, anything after
  the options of other types) are kept in ``trailer`` so parse/build round-trips.
* **Unknown types** raise :class:`WireError` on parsing; :class:`LbtrmUnknown` can build one.
* **Heuristic.**  :meth:`LbtrmPacket.heuristic_accepts` says whether tshark will see a packet
  without Decode-As.  (Observed: an NCF whose bytes 2-11, ucast_port to trail_sqn, are all zero
  is claimed by tshark's TAPA heuristic first; real NCFs carry a source port.)
* **NCF experts.**  tshark adds "NCF <reason>" (Sequence/Note) with a NULL tree item: it shows
  in ``tshark -z expert`` but not in the ``_ws.expert`` tree of the frame (the fact sheet says
  it never appears; ``-z expert`` does list it).  :meth:`LbtrmNcf.expert_items` reports it.
"""

from __future__ import annotations

from enum import IntEnum

import construct as cs

from .errors import WireError
from .fastpath import derive
from .fields import U8, U16, U32, Auto, Bit, field
from .lbtru import FORMAT_SELECTIVE, NcfReason, ncf_reason_text
from .transport import CodedOption, CountOf, RestOf, TransportCodec, TransportPacket, never

__all__ = [
    "CODEC",
    "DATA_FAST",
    "FORMAT_PARITY",
    "FORMAT_SELECTIVE",
    "DataHeader",
    "LbtrmData",
    "LbtrmNak",
    "LbtrmNcf",
    "LbtrmOption",
    "LbtrmPacket",
    "LbtrmSm",
    "LbtrmUnknown",
    "NakHeader",
    "NcfHeader",
    "NcfReason",
    "PacketType",
    "SmHeader",
    "data_header",
    "parse_packet",
]


class PacketType(IntEnum):
    """The type nibble of ``ver_type`` (``lbtrm.hdr.type``)."""

    DATA = 0x0
    SM = 0x2
    NAK = 0x3
    NCF = 0x4


FORMAT_PARITY = 1
FLAG_UCAST_NAKS = 0x80
FLAG_MCAST_NAKS = 0x40
FLAG_RX = 0x20
FLAG_LATE_JOIN = 0x10

VER_TYPE_BITS = {
    "version": Bit(0xF0, tshark="lbtrm.hdr.ver"),
    "type": Bit(0x0F, tshark="lbtrm.hdr.type"),
}


def _common() -> tuple[cs.Renamed, ...]:
    """The 8-byte header: ver_type, next_hdr, the source's unicast (NAK) port, session ID."""
    return (
        field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
        field("next_hdr", U8, tshark="lbtrm.hdr.next_hdr"),
        field("ucast_port", U16, tshark="lbtrm.hdr.ucast_port"),
        field("session_id", U32, tshark="lbtrm.hdr.session_id"),
    )


DataHeader = cs.Struct(
    *_common(),
    field("sqn", U32),
    field("trail_sqn", U32),
    field("flags_fec_type", U8, bits={
        "ucast_naks": FLAG_UCAST_NAKS,
        "mcast_naks": Bit(FLAG_MCAST_NAKS, when=never),
        "rx": FLAG_RX,
        "late_join": Bit(FLAG_LATE_JOIN, when=never),
        "fec_type": Bit(0x0F, when=never),
    }),
    field("flags_tgsz", U8),
    field("fec_symbol", U16),
)
"""DATA: header and 12-byte body (0x20 in flags_fec_type = retransmission); then LBMC."""

SmHeader = cs.Struct(
    *_common(),
    field("sm_sqn", U32),
    field("lead_sqn", U32),
    field("trail_sqn", U32),
    field("flags_fec_type", U8, bits={
        "ucast_naks": FLAG_UCAST_NAKS,
        "other_flags": Bit(0x70, when=never),
        "fec_type": Bit(0x0F, when=never),
    }),
    field("flags_tgsz", U8),
    field("reserved", U16),
)
"""SM (session message): own sequence number, leading/trailing edges, FEC flags."""

NakEntry = cs.Struct(field("nak", U32))
NcfEntry = cs.Struct(field("ncf", U32))

NakHeader = cs.Struct(
    *_common(),
    field("num_naks", Auto(U16, lambda ctx: len(ctx.naks))),
    field("format_word", U16, tshark=None, bits={"format": Bit(0x000F, tshark="format")}),
    field("naks", cs.Array(CountOf("num_naks", "naks"), NakEntry), tshark="list"),
)
"""NAK (unicast to the source's port): count, format (0 selective, 1 parity), sqns."""

NcfHeader = cs.Struct(
    *_common(),
    field("trail_sqn", U32),
    field("num_ncfs", Auto(U16, lambda ctx: len(ctx.ncfs))),
    field("reserved", U8),
    field("reason_format", U8, tshark=None, bits={
        "reason": Bit(0xF0, tshark="reason"), "format": Bit(0x0F, tshark="format")}),
    field("ncfs", cs.Array(CountOf("num_ncfs", "ncfs"), NcfEntry), tshark="list"),
)
"""NCF (NAK confirmation): trailing edge, count, reason/format nibbles, confirmed sqns."""

UnknownTypeHeader = cs.Struct(*_common())
"""The header alone, for crafting undefined types."""

OptionStruct = cs.Struct(
    field("next_hdr", U8, tshark=None),
    field("hdr_len", Auto(U8, lambda ctx: 4 + len(ctx.data)), tshark=None),
    field("res", U16, tshark=None),
    field("data", cs.Bytes(RestOf("hdr_len", 4)), tshark=None),
)
"""An option: the basic 4-byte option header and opaque data (tshark displays none of it)."""


class LbtrmOption(CodedOption):
    """An LBT-RM option, carried opaquely: ``LbtrmOption(code=1, data=b"....")``."""

    struct = OptionStruct
    prefix = "lbtrm.opt"
    __slots__ = ()


class LbtrmPacket(TransportPacket):
    """Base class of LBT-RM datagrams (header members: ucast_port, session_id)."""

    protocol = "lbtrm"
    __slots__ = ()

    def heuristic_accepts(self) -> bool:
        """Whether tshark's ``lbtrm_udp`` heuristic takes this datagram (given a destination in
        the LBT-RM ranges): version 0, a defined type and header ``next_hdr`` 0 (no options)."""
        return (self.version == 0 and self.type in PacketType._value2member_map_
                and self.header_values()["next_hdr"] == 0)

    def _info_tail(self) -> str:
        return f"Port {self.ucast_port} ID 0x{self.session_id:08x}"


class LbtrmData(LbtrmPacket):
    """DATA (0x0): ``LbtrmData(ucast_port=14390, session_id=7, sqn=1, rx=1, payload=[...])``."""

    struct = DataHeader
    prefix = "lbtrm.data"
    type_code = PacketType.DATA
    carries_lbmc = True
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Notes", f"RX 0x{self.sqn:08x}")] if self.rx else []

    def info(self) -> str:
        return f"DATA{'(RX)' if self.rx else ''} sqn 0x{self.sqn:x} {self._info_tail()}"


class LbtrmSm(LbtrmPacket):
    """SM (0x2): ``LbtrmSm(sm_sqn=1, lead_sqn=9, trail_sqn=0, ucast_naks=1)``."""

    struct = SmHeader
    prefix = "lbtrm.sm"
    type_code = PacketType.SM
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Chats", "SM")]

    def info(self) -> str:
        return f"SM sqn 0x{self.sm_sqn:x} {self._info_tail()}"


class LbtrmNak(LbtrmPacket):
    """NAK (0x3): ``LbtrmNak(naks=[3, 4], format=FORMAT_SELECTIVE)``."""

    struct = NakHeader
    prefix = "lbtrm.nak"
    type_code = PacketType.NAK
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Warns", "NAK")]

    def info(self) -> str:
        return f"NAK {self.header_values()['num_naks']} naks {self._info_tail()}"


class LbtrmNcf(LbtrmPacket):
    """NCF (0x4): ``LbtrmNcf(trail_sqn=2, reason=NcfReason.SHED, ncfs=[3])``.

    tshark's "NCF <reason>" expert has no tree item (see the module docstring).
    """

    struct = NcfHeader
    prefix = "lbtrm.ncf"
    type_code = PacketType.NCF
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Notes", f"NCF {ncf_reason_text(self.reason)}")]

    def info(self) -> str:
        return f"NCF {self.header_values()['num_ncfs']} ncfs {self._info_tail()}"


class LbtrmUnknown(LbtrmPacket):
    """An undefined type, for negative tests: ``LbtrmUnknown(type=9)``; parsing rejects it."""

    struct = UnknownTypeHeader
    prefix = "lbtrm"
    type_code = 0x1
    __slots__ = ()

    def expert_items(self) -> list[tuple[str, str]]:
        return [("Errors", f"Unrecognized type 0x{self.type:02x}")]


PACKET_CLASSES: dict[int, type[LbtrmPacket]] = {
    cls.type_code: cls for cls in (LbtrmData, LbtrmSm, LbtrmNak, LbtrmNcf)
}
COMMON = derive(UnknownTypeHeader, name="lbtrm")
"""The common 8-byte header every type starts with (read off the structs)."""
HEADER_SIZE = COMMON.size
HEURISTIC_TYPES = frozenset({PacketType.DATA, PacketType.SM, PacketType.NAK, PacketType.NCF})


def heuristic_content_test(payload: bytes | bytearray | memoryview) -> bool:
    """The content part of tshark's ``lbtrm_udp`` heuristic: a whole common header, version
    0, a DATA/SM/NAK/NCF type and no options (``next_hdr`` 0).  The address and port part
    is the caller's (it depends on the port map)."""
    if len(payload) < HEADER_SIZE:
        return False
    values = COMMON.decode(payload)
    ver_type = int(values["ver_type"])
    return (VER_TYPE_BITS["version"].get(ver_type) == 0
            and VER_TYPE_BITS["type"].get(ver_type) in HEURISTIC_TYPES
            and values["next_hdr"] == 0)
DATA_FAST = LbtrmData.fast
"""The derived 20-byte DATA header layout (header + data body)."""

CODEC = TransportCodec(protocol="lbtrm", header_size=HEADER_SIZE, packets=PACKET_CLASSES,
                       options={}, unknown_option=LbtrmOption)


def parse_packet(buf: bytes | bytearray | memoryview, decode_lbmc: bool = True) -> LbtrmPacket:
    """Decode one LBT-RM datagram (a whole UDP payload).

    With ``decode_lbmc`` false a DATA payload stays raw bytes.  Raises :class:`WireError`
    (offsets from the start of the UDP payload) for a short header or body, unknown type,
    truncated or zero-length option, counts larger than the datagram, bad LBMC.
    """
    packet = CODEC.parse(buf, decode_lbmc)
    assert isinstance(packet, LbtrmPacket)
    return packet


def data_header(buf: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """Hot path: the raw DATA header members (ver_type, next_hdr, ucast_port, session_id,
    sqn, trail_sqn, flags_fec_type, flags_tgsz, fec_symbol), unchecked beyond length."""
    if len(buf) < DATA_FAST.size:
        raise WireError("lbtrm.data", 0, f"{len(buf)} bytes; DATA needs {DATA_FAST.size}")
    return tuple(DATA_FAST.unpack_from(buf))
