"""LBMR: Ultra Messaging topic resolution (the resolver datagrams of ``packet-lbmr.c``).

Layouts follow Wireshark's LBMR dissector (tshark 4.0.x) as summarised in
``docs/wire-transports.md`` §4.  Every layout is written exactly once below, as a
Construct struct built with :func:`wire.fields.field`; the tshark display-filter names and the
named flag bits are read off those definitions, and every fixed-size part is encoded and decoded
through :func:`wire.fastpath.derive`.

Object model
============

* One **record class per struct** (:class:`Record` subclasses such as :class:`ToptUme`,
  :class:`LbtruSidInfo`, :class:`OptVersion`, :class:`Pser`).  A record's attributes are its
  Construct members plus the named bit views of its flag words (``ToptUme(store=1)``); the
  member values live in one dict, so the struct stays the single definition.  Members computed
  on build (lengths, counts, presence bits: Construct :class:`~wire.fields.Auto` members) are
  ``None`` until resolved and can be set explicitly to craft invalid packets.
* Records that own children carry them in extra attributes: :class:`Tir` (``info``,
  ``options``), :class:`Qir` (``options``, ``groups``, ``queues``), :class:`Tmb` (``records``),
  :class:`Pser` (``options``).
* :class:`LbmrPacket` is a whole UDP payload; :func:`parse_packet` and
  :meth:`LbmrPacket.build` convert it from/to bytes and :meth:`LbmrPacket.tshark_fields` lists
  what tshark shows (display-filter name, value).

Wire rules the dissector imposes (and the choices made where it leaves room)
=============================================================================

* Header ``ver_type``: version 0xF0, options-present 0x08, type 0x07.  For type 7 (extended)
  bytes 1-3 are not counts; byte 1 is ``ext_type``.
* NORMAL/WC-TQR bodies are all TQRs, then all TIRs.  NORMAL with zero counts is the unicast
  resolver keepalive; types 2, 3 and 5 carry no body.  Type 6 (UMQ queue resolution) is typed
  (:class:`Qqr`, :class:`Qir`) because its QIRs reuse the TIR options block.
* **Packet options** (bit 0x08) follow the body and run to the end of the payload.  Known types
  (0x80-0x84) advance by their fixed size, whatever their ``len`` byte says (the ``len`` value is
  kept, so such packets round-trip); unknown types advance by ``len``, which must be >= 4.
  Before parsing the body, tshark shortens the body view when the *last* four bytes are an
  option-length option (0x80, len 4) with ``total_len`` < payload length; this module does the
  same, so a body that runs into the options fails exactly where tshark's does.  Placement of
  the option-length option is the caller's choice (:func:`with_length_option` puts it last by
  default: [I] real UM appends it, which is what the dissector's peek at the last four bytes
  suggests; tshark decodes either order identically).
* **TIR options block**: a 4-byte option-length header (type 0, len 4, ``total_len`` = whole
  block) followed by options whose ``len`` counts their type and len bytes.  Choices: the header
  must read type 0 / len 4 (tshark does not check; we refuse other values rather than invent a
  representation), option lengths must add up to ``total_len`` exactly, a known option may be
  longer than its layout (the surplus is kept in ``trailing``, tshark skips it) but not shorter,
  and an unknown option needs ``len`` >= 4.  ``len`` 0 is tshark's "Zero-length LBMR option"
  error and a :class:`WireError` here.
* **Transport info**: TCP and LBT-RU accept ``tlen`` 6 or 10, LBT-IPC/LBT-RDMA/LBT-SMX 10, LBT-RM
  16.  tshark tolerates (with an error-level expert) a wrong ``tlen`` for LBT-RM and LBT-SMX;
  here any wrong ``tlen`` for a known transport is a :class:`WireError`.  Unknown transport
  codes (TCP6 0x02, PGM 0x11, anything else) are carried opaquely as ``tlen`` bytes
  (:class:`OpaqueTransport`).
* **Extended types**: 0x01 PSER (with its context-instance options), 0x03 context info, 0x04
  topic resolution request, 0x06 remote domain route are typed; 0x05 gateway message has a
  typed 8-byte header and an opaque sub-body sized by its ``len`` [I: ``len`` counts from the
  ``ver_type`` byte, like PSER's]; 0x07 remote context info has a typed header and records
  whose options are opaque [I: the header ``len`` counts from ``ver_type``]; 0x02 UMQ queue
  management is opaque and extends to the end of the body view (so packet options after it
  round-trip only when the option-length option is last); other ext types carry nothing
  (tshark warns "Unknown LBMR extended type").
* Bytes after the body that tshark does not decode (options bit clear) are kept in
  :attr:`LbmrPacket.trailer` so every accepted payload round-trips byte for byte.
* Where this codec is stricter than tshark (it refuses, tshark decodes silently): an options
  block header other than type 0/len 4, option lengths that do not add up to ``total_len``, a
  known option shorter than its layout, a TMR whose name does not end inside its ``len``, a
  context-info ``len`` below 20 (tshark reads the name only when the name flag is set).

tshark display quirks reproduced by :meth:`LbmrPacket.tshark_fields` (checked by the oracle)
=============================================================================================

* ``lbmr.tqr.pattern`` starts at the pattern-type byte (``"\x01^ume..."``).
* The Domain ID option's flags (u16 on the wire) are registered as 8 bits: tshark shows byte 2
  only and never the Ignore bit; an unknown topic option's flags show the low byte; its data
  is shown only when ``len`` > 4.  An unknown packet option's flags are an empty item.
* The UMQ queue-info option's name is ``lbmr.topt.ume_qinfo.queue`` (sic).
* tshark 4.0.17 marks a TMB without TMRs malformed when it ends the body view, and starts the
  packet options of an ext 0x02 (queue management) packet two bytes after the queue-management
  header (it counts ``ver_type``/``ext_type`` twice).  Neither is a wire rule, so the codec
  accepts both; the oracle tests steer clear of them.
* ``lbmr.tir.channel`` is generated by tshark from discovery order and is not exported.

Every decoding problem raises :class:`~wire.errors.WireError` with a tshark-style header name
(``"lbmr.tir"``, ``"lbmr.topt.ume"``), the offset from the start of the UDP payload and a reason.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from enum import IntEnum
from typing import Any, ClassVar

import construct as cs
from construct import this

from .errors import WireError
from .fastpath import FastLayout, derive
from .fields import (
    I32,
    U8,
    U16,
    U32,
    U64,
    Auto,
    Bit,
    IPv4,
    bytes_text,
    cstring,
    export_struct,
    field,
    fixed_size,
    forget_computed,
    length_prefixed,
    members,
    text,
    text_size,
)
from .records import StructRecord, default_for, plain, view_index

# --- enumerations ----------------------------------------------------------------------------


class PacketType(IntEnum):
    """``lbmr.hdr.type`` (low three bits of ``ver_type``).  5 is undefined (tshark warns)."""

    NORMAL = 0
    WC_TQR = 1
    RCV_ALIVE = 2
    SRC_ALIVE = 3
    TOPIC_MGMT = 4
    UMQ = 6
    EXT = 7


class ExtType(IntEnum):
    """``lbmr.hdr.ext_type`` of extended (type 7) packets."""

    PSER = 0x01
    QUEUE_MGMT = 0x02
    CONTEXT_INFO = 0x03
    TOPIC_RES_REQUEST = 0x04
    TNWG = 0x05
    REMOTE_DOMAIN_ROUTE = 0x06
    REMOTE_CONTEXT_INFO = 0x07


class TransportType(IntEnum):
    """``lbmr.tir.transport_type``.  TCP6 and PGM are defined but tshark has no parser."""

    TCP = 0x00
    LBTRU = 0x01
    TCP6 = 0x02
    LBTSMX = 0x04
    LBTRM = 0x10
    PGM = 0x11
    LBTRDMA = 0x20
    LBTIPC = 0x40


class PatternType(IntEnum):
    """``lbmr.tqr.pattern_type`` of wildcard TQRs."""

    PCRE = 1
    REGEX = 2


class SourceType(IntEnum):
    """``lbmr.opt.src_type.src_type``: what kind of context sent the packet."""

    APPLICATION = 0
    GATEWAY = 1
    STORE = 2


class TmrType(IntEnum):
    """``lbmr.tmb.tmr.type``."""

    LEAVE_TOPIC = 0
    TOPIC_USE = 1


class PserDepType(IntEnum):
    """``lbmr.pser.dep_type``."""

    ELECTION = 0
    REELECTION = 1


class PserOptType(IntEnum):
    """Type byte of a PSER option."""

    SOURCE_CTXINST = 0
    STORE_CTXINST = 1


class TnwgType(IntEnum):
    """``lbmr.tnwg.type`` of gateway messages."""

    INTEREST = 0
    CTXINFO = 1
    TRREQ = 2


OPTS_FLAG = 0x08
TIR_OPTIONS_FLAG = 0x80
PSER_OPTIONS_FLAG = 0x8000
QIR_OPTIONS_FLAG = 0x8000
CTXINFO_NAME_FLAG = 0x0001

# --- building blocks -------------------------------------------------------------------------


def _never(raw: int) -> bool:
    """Bit-view predicate for bits tshark registers but never displays."""
    return False


def _flags16(**bits: int | Bit) -> cs.Renamed:
    """A u16 flags word whose 0x8000 bit is tshark's "Ignore"."""
    return field("flags", U16, bits={"ignore": 0x8000, **bits})


def _flags8(**bits: int | Bit) -> cs.Renamed:
    """A u8 flags byte whose 0x80 bit is tshark's "Ignore"."""
    return field("flags", U8, bits={"ignore": 0x80, **bits})


# --- generic record machinery ----------------------------------------------------------------


@dataclass(frozen=True)
class RecordKind:
    """Everything the codec knows about one struct.

    Attributes:
        name: the record class name.
        tshark: the tshark prefix its member names are relative to (``"lbmr.topt.ume"``).
        struct: the Construct definition (the only statement of the layout).
        code: the type/code value that selects this layout (option type, transport type,
            extended type), if any.
        prefix: the struct's fixed-size prefix compiled by :func:`~wire.fastpath.derive`.
        defaults: neutral member values (``None`` for computed members).
        views: bit-view name -> (member, :class:`~wire.fields.Bit`).
    """

    name: str
    tshark: str
    struct: cs.Struct
    code: int | None
    prefix: FastLayout
    defaults: Mapping[str, Any]
    views: Mapping[str, tuple[str, Bit]]

    @property
    def fixed(self) -> bool:
        """True when the fast layout covers everything but an optional ``trailing`` member."""
        return self.prefix.complete

    @property
    def min_size(self) -> int:
        return self.prefix.size

    @property
    def has_trailing(self) -> bool:
        return "trailing" in self.defaults


def _make_kind(name: str, tshark: str, struct_def: cs.Struct, code: int | None) -> RecordKind:
    defaults = {m.name: default_for(m) for m in members(struct_def)}
    if code is not None and defaults.get("type") is not None:
        defaults["type"] = code  # an option's own type byte: its code (computed ones stay None)
    return RecordKind(
        name=name, tshark=tshark, struct=struct_def, code=code, prefix=derive(struct_def),
        defaults=defaults, views=view_index(struct_def),
    )


_plain = plain  # the parse-result helper used to live here (tests still reach it by this name)


def _reason(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


_ENCODE_ERRORS = (cs.ConstructError, struct.error, ValueError, TypeError, KeyError,
                  OverflowError, AttributeError, OSError)
_PARSE_ERRORS = (cs.ConstructError, struct.error, ValueError, TypeError, OverflowError)


class Record(StructRecord):
    """One typed LBMR record; attributes are its Construct members and their bit views.

    Build one with keyword arguments (``ToptUme(store=1, src_reg_id=1000)``).  Members left out
    take neutral defaults (0, ``0.0.0.0``, empty), the ``type`` member of options defaults to
    the option's code, and computed members (lengths, counts, presence bits) are filled in on
    build unless given explicitly.  Equality compares resolved values, so a record built with a
    computed ``len`` equals the same record parsed from the wire.

    The record machinery is :class:`~wire.records.StructRecord`'s; what is LBMR's own: the
    struct and defaults come from the class's :class:`RecordKind`, and records with children
    (``Tir``, ``Qir``, ``Tmb``, ``Pser``...) feed their formulas, equality and ``repr`` through
    the hooks below.
    """

    kind: ClassVar[RecordKind]
    __slots__ = ()

    @classmethod
    def _declared_struct(cls) -> cs.Struct | None:
        kind: RecordKind | None = cls.__dict__.get("kind")
        return None if kind is None else kind.struct

    @classmethod
    def _default(cls, member: cs.Construct) -> Any:
        return cls.kind.defaults[member.name]

    @classmethod
    def _field_prefix(cls) -> str:
        return cls.kind.tshark

    @property
    def code(self) -> int | None:
        """The type/code value that selects this layout."""
        return self.kind.code

    # -- hooks for records with children --------------------------------------------------

    def _init_extras(self) -> None:
        """Set the child attributes of a freshly decoded record (none by default)."""

    def _extras_key(self) -> tuple[Any, ...]:
        """What equality compares besides the resolved members (the children)."""
        return ()

    def _key(self) -> tuple[Any, ...]:
        return (self.resolved(), self._extras_key())

    def _shown(self, name: str, value: Any) -> bool:
        return value != b"" and name != "type"

    def _repr_extras(self) -> list[str]:
        return [f"{slot}={getattr(self, slot)!r}" for slot in self._slots
                if slot != "values" and getattr(self, slot, None) not in (None, [], 0)]

    # -- bytes, tshark --------------------------------------------------------------------

    def encode(self) -> bytes:
        """This record's own bytes (children included for records that have them)."""
        values = self.resolved()
        kind = self.kind
        try:
            if kind.fixed:
                return kind.prefix.pack(values) + bytes(values.get("trailing") or b"")
            return bytes(kind.struct.build(values))
        except _ENCODE_ERRORS as exc:
            raise WireError(kind.tshark, 0, f"cannot encode: {_reason(exc)}") from None

    def tshark_fields(self) -> list[tuple[str, Any]]:
        """The record as tshark ``-T fields`` shows it: (display-filter name, value) pairs."""
        return self._export(self.resolved())

    # -- decoding -------------------------------------------------------------------------

    @classmethod
    def _from_values(cls, values: dict[str, Any]) -> Record:
        obj = cls._raw(values)
        obj._init_extras()
        return obj

    @classmethod
    def _construct_parse(cls, buf: bytes, pos: int, limit: int) -> tuple[dict[str, Any], int]:
        kind = cls.kind
        data = bytes(buf[pos:limit])
        stream = io.BytesIO(data)
        try:
            parsed = kind.struct.parse_stream(stream)
        except _PARSE_ERRORS as exc:
            raise WireError(kind.tshark, pos, f"does not decode: {_reason(exc)}") from None
        return {m.name: plain(parsed[m.name]) for m in members(kind.struct)}, stream.tell()

    @classmethod
    def decode(cls, buf: bytes, pos: int, end: int) -> Record:
        """Decode exactly ``buf[pos:end]`` as this record (offsets are payload offsets)."""
        kind = cls.kind
        if end - pos < kind.min_size:
            raise WireError(kind.tshark, pos,
                            f"{end - pos} bytes but the layout needs {kind.min_size}")
        if kind.fixed:
            values = kind.prefix.decode(buf, pos)
            extra = bytes(buf[pos + kind.prefix.size:end])
            if kind.has_trailing:
                values["trailing"] = extra
            elif extra:
                raise WireError(kind.tshark, pos + kind.prefix.size,
                                f"{len(extra)} bytes beyond the {kind.prefix.size}-byte layout")
            return cls._from_values(values)
        values, used = cls._construct_parse(buf, pos, end)
        if used != end - pos:
            raise WireError(kind.tshark, pos + used, f"{end - pos - used} bytes left over")
        return cls._from_values(values)

    @classmethod
    def decode_from(cls, buf: bytes, pos: int, limit: int) -> tuple[Record, int]:
        """Decode a self-delimiting record at ``pos`` (not beyond ``limit``): (record, end)."""
        kind = cls.kind
        if kind.fixed and not kind.has_trailing:
            end = pos + kind.prefix.size
            if end > limit:
                raise WireError(kind.tshark, pos,
                                f"truncated: {max(limit - pos, 0)} of {kind.prefix.size} bytes")
            return cls.decode(buf, pos, end), end
        values, used = cls._construct_parse(buf, pos, limit)
        return cls._from_values(values), pos + used


def _record(name: str, tshark: str, struct_def: cs.Struct, code: int | None = None,
            registry: dict[Any, type[Record]] | None = None, key: Any = None,
            doc: str = "") -> type[Record]:
    """A :class:`Record` subclass for ``struct_def``, registered under ``key`` (or ``code``)."""
    kind = _make_kind(name, tshark, struct_def, code)
    about = f"tshark: ``{tshark}.*`` ({_code_text(code)})."
    cls = type(name, (Record,), {"__slots__": (), "kind": kind,
                                  "__doc__": f"{doc}\n\n{about}" if doc else about})
    if registry is not None:
        registry[code if key is None else key] = cls
    return cls


def _code_text(code: int | None) -> str:
    return "no code" if code is None else f"code 0x{code:02x}"


def _kind_for(name: str, tshark: str, struct_def: cs.Struct, code: int | None = None,
              ) -> RecordKind:
    """The kind of a hand-written record class (one with children or a custom export)."""
    return _make_kind(name, tshark, struct_def, code)


# --- header ------------------------------------------------------------------------------------

VER_TYPE_BITS = {
    "ver": Bit(0xF0, tshark="hdr.ver"),
    "opts": Bit(OPTS_FLAG, tshark="hdr.opts"),
    "type": Bit(0x07, tshark="hdr.type"),
}

LbmrHeader = cs.Struct(
    field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
    field("tqrs", U8, tshark="hdr.tqrs"),
    field("tirs", U16, tshark="hdr.tirs"),
)
"""The 4-byte header of every non-extended packet (counts are QQRs/QIRs for type 6)."""

ExtHeader = cs.Struct(
    field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
    field("ext_type", U8, tshark="hdr.ext_type"),
)
"""The 2-byte prefix of extended (type 7) packets; the ext record follows at offset 2."""

HEADER = derive(LbmrHeader)
EXT_HEADER = derive(ExtHeader)
UMQ_COUNT_NAMES = {"lbmr.hdr.tqrs": "lbmr.hdr.qqrs", "lbmr.hdr.tirs": "lbmr.hdr.qirs"}

# --- topic query records -------------------------------------------------------------------------

Tqr = _record("Tqr", "lbmr.tqr", cs.Struct(field("name", cstring())),
    doc="A topic query: the topic name, NUL-terminated (NORMAL packets).")

WcTqrStruct = cs.Struct(field("pattern_type", U8), field("pattern", cstring()))


class WcTqr(Record):
    """A wildcard topic query (type 1 packets): pattern type (1 PCRE, 2 regex) and pattern.

    Display quirk reproduced by :meth:`tshark_fields`: tshark reads ``lbmr.tqr.pattern`` from
    the pattern-type byte onward, so its value starts with that byte as a character.
    """

    __slots__ = ()
    kind = _kind_for("WcTqr", "lbmr.tqr", WcTqrStruct)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        shown = chr(int(self.pattern_type)) + str(self.values["pattern"])
        return [(n, shown if n == "lbmr.tqr.pattern" else v) for n, v in out]


Qqr = _record("Qqr", "lbmr.qqr", cs.Struct(field("name", cstring())),
    doc="A queue query (type 6 packets): the queue name, NUL-terminated.")

# --- topic options (TIR options block) -------------------------------------------------------


def _topt_struct(*body: cs.Construct) -> cs.Struct:
    """type, len (whole option), the fixed body, then whatever a longer ``len`` adds."""
    return length_prefixed("type", "len", *body)


TOPIC_OPTIONS: dict[int, type[Record]] = {}


def _topt(code: int, cls_name: str, name: str, doc: str, *body: cs.Construct) -> type[Record]:
    return _record(cls_name, f"lbmr.topt.{name}", _topt_struct(*body), code, TOPIC_OPTIONS,
                   doc=doc)


ToptLenStruct = cs.Struct(
    field("type", U8),
    field("len", U8),
    field("total_len", Auto(U16, lambda ctx: 4 + int(ctx.get("options_size") or 0))),
)
"""The 4-byte header of a TIR/QIR options block: total_len covers the whole block."""

TOPT_LEN = derive(ToptLenStruct)

ToptUme = _topt(
    0x01, "ToptUme", "ume",
    "UME: the source is persistent; its store and its own TCP request address/port.",
    _flags16(latejoin=0x4000, store=0x2000, qccap=0x1000, acktosrc=0x0800),
    field("store_tcp_port", U16),
    field("src_tcp_port", U16),
    field("store_tcp_addr", IPv4),
    field("src_tcp_addr", IPv4),
    field("src_reg_id", U32),
    field("transport_idx", U32),
    field("high_seqnum", U32),
    field("low_seqnum", U32))
ToptUmeStore = _topt(
    0x02, "ToptUmeStore", "ume_store",
    "One store the source registers with: group, index, IP/TCP port, registration ID.",
    _flags8(),
    field("grp_idx", U8),
    field("store_tcp_port", U16),
    field("store_idx", U16),
    field("store_ip_addr", IPv4),
    field("src_reg_id", U32))
ToptUmeStoreGroup = _topt(
    0x03, "ToptUmeStoreGroup", "ume_store_group",
    "One store group (index and size) for quorum/consensus.",
    _flags8(),
    field("grp_idx", U8),
    field("grp_sz", U16),
    field("reserved", U16))
ToptLatejoin = _topt(
    0x04, "ToptLatejoin", "latejoin",
    "Late join: where receivers ask for retained messages, and which sequence numbers.",
    _flags16(acktosrc=0x4000),
    field("src_tcp_port", U16),
    field("reserved", U16),
    field("src_ip_addr", IPv4),
    field("transport_idx", U32),
    field("high_seqnum", U32),
    field("low_seqnum", U32))
ToptUmqRcridx = _topt(
    0x05, "ToptUmqRcridx", "umq_rcridx", "UMQ receiver control record index.",
    _flags16(),
    field("rcr_idx", U32))
ToptUmqQinfo = _record("ToptUmqQinfo", "lbmr.topt.umq_qinfo", cs.Struct(
    field("type", U8),
    field("len", Auto(U8, lambda ctx: 4 + text_size(ctx.queue))),
    _flags16(queue_flag=Bit(0x4000, tshark="flags.queue"), rcvlisten=0x2000, control=0x1000,
             srcrcvlisten=0x0800, participants_only=0x0400),
    # tshark registers the queue name under "ume_qinfo", not "umq_qinfo".
    field("queue", text(this.len - 4), tshark="lbmr.topt.ume_qinfo.queue"),
), 0x06, TOPIC_OPTIONS, doc="UMQ queue info: the queue (name fills the option) and roles.")
ToptCost = _topt(
    0x07, "ToptCost", "cost", "Gateway cost: hop count and a signed cost.",
    _flags8(),
    field("hop_count", U8),
    field("cost", I32))
ToptOtid = _topt(
    0x08, "ToptOtid", "otid", "Originating transport ID of a gateway-forwarded source.",
    _flags16(),
    field("otid", cs.Bytes(32), tshark="originating_transport"))
ToptCtxinst = _topt(
    0x09, "ToptCtxinst", "ctxinst", "The source's context instance.",
    _flags8(),
    field("res", U8),
    field("ctxinst", cs.Bytes(8)))
ToptCtxinsts = _topt(
    0x0A, "ToptCtxinsts", "ctxinsts", "A store's context instance, by store index.",
    _flags8(),
    field("idx", U8),
    field("ctxinst", cs.Bytes(8), tshark="ctxinsts"))
ToptUlb = _topt(
    0x0B, "ToptUlb", "ulb", "UMQ ultra-load-balancing source.",
    _flags16(),
    field("queue_id", U32),
    field("regid", U64),
    field("ulb_src_id", U32),
    field("src_ip_addr", IPv4),
    field("src_tcp_port", U16),
    field("reserved", U16))
ToptCtxinstq = _topt(
    0x0C, "ToptCtxinstq", "ctxinstq", "A queue's context instance, by index.",
    _flags8(),
    field("idx", U8),
    field("ctxinst", cs.Bytes(8), tshark="ctxinstq"))
ToptDomainId = _topt(
    0x0D, "ToptDomainId", "domain_id",
    "The source's domain ID.  The flags word is u16 on the wire (0x8000 Ignore) but tshark "
    "registers it as 8 bits: it shows byte 2 only and never the Ignore bit.",
    field("flags", U16, tshark=None, bits={
        "ignore": Bit(0x8000, when=_never),
        "flags_shown": Bit(0xFF00, tshark="flags")}),
    field("domain_id", U32))
EXFUNC_FLAGS = {"ulb": 0x8, "umq": 0x4, "ume": 0x2, "lj": 0x1}
ToptExfunc = _topt(
    0x0E, "ToptExfunc", "exfunc",
    "Extended functionality: what the source supports (late join, UME, UMQ, ULB).",
    _flags16(),
    field("src_tcp_port", U16),
    field("reserved", U16),
    field("src_ip_addr", IPv4),
    field("functionality_flags", U32, bits=EXFUNC_FLAGS))


class ToptUnknown(Record):
    """A topic option of a type tshark does not know (it warns "Unknown option 0x..").

    Display quirk: tshark shows ``flags`` as an 8-bit field over the two flag bytes, i.e. the
    low byte of the wire word; ``data`` is shown only when the option is longer than 4 bytes.
    """

    __slots__ = ()
    kind = _kind_for("ToptUnknown", "lbmr.topt.unknown", cs.Struct(
        field("type", U8),
        field("len", Auto(U8, lambda ctx: 4 + len(ctx.data))),
        field("flags", U16, tshark=None, bits={"flags_shown": Bit(0x00FF, tshark="flags")}),
        field("data", cs.Bytes(this.len - 4)),
    ))

    def tshark_fields(self) -> list[tuple[str, Any]]:
        return [(n, v) for n, v in super().tshark_fields()
                if n != "lbmr.topt.unknown.data" or v]


# --- transport information --------------------------------------------------------------------

TRANSPORTS: dict[tuple[int, int], type[Record]] = {}
TRANSPORT_NAMES: dict[int, str] = {}


def _transport(code: int, cls_name: str, name: str, *body: cs.Construct, doc: str = "",
               ) -> type[Record]:
    struct_def = cs.Struct(*body)
    size = fixed_size(body)
    TRANSPORT_NAMES[code] = name
    return _record(cls_name, f"lbmr.tir.{name}", struct_def, code, TRANSPORTS, (code, size),
                   doc=doc or f"{name} transport info, {size} bytes.")


TcpInfo = _transport(0x00, "TcpInfo", "tcp", field("ip", IPv4), field("port", U16),
                     doc="LBT-TCP source without session ID (tlen 6).  tshark keys the "
                         "transport on the packet's IP source, not on ``ip``.")
TcpSidInfo = _transport(0x00, "TcpSidInfo", "tcp",
                        field("ip", IPv4), field("session_id", U32), field("port", U16),
                        doc="LBT-TCP source with session ID (tlen 10); the ID must match the "
                            "TCP-SID header on the connection for topic binding.")
LbtruInfo = _transport(0x01, "LbtruInfo", "lbtru", field("ip", IPv4), field("port", U16),
                       doc="LBT-RU source without session ID (tlen 6).")
LbtruSidInfo = _transport(0x01, "LbtruSidInfo", "lbtru",
                          field("ip", IPv4), field("session_id", U32), field("port", U16),
                          doc="LBT-RU source with session ID (tlen 10); the ID must match the "
                              "SID option of the source's datagrams for topic binding.")
LbtrmInfo = _transport(0x10, "LbtrmInfo", "lbtrm",
                       field("src_addr", IPv4, tshark="srcip"),
                       field("mcast_addr", IPv4, tshark="mcastip"),
                       field("session_id", U32, tshark="sessid"),
                       field("udp_dest_port", U16, tshark="dport"),
                       field("src_ucast_port", U16, tshark="sport"),
                       doc="LBT-RM source (tlen 16): multicast group/port, session ID and the "
                           "unicast NAK port.")
LbtipcInfo = _transport(0x40, "LbtipcInfo", "lbtipc",
                        field("host_id", U32), field("session_id", U32), field("xport_id", U16),
                        doc="LBT-IPC (shared memory) source (tlen 10).")
LbtrdmaInfo = _transport(0x20, "LbtrdmaInfo", "lbtrdma",
                         field("ip", IPv4), field("session_id", U32), field("port", U16),
                         doc="LBT-RDMA source (tlen 10); tshark keys it on ``ip`` itself.")
LbtsmxInfo = _transport(0x04, "LbtsmxInfo", "lbtsmx",
                        field("host_id", U32), field("session_id", U32), field("xport_id", U16),
                        doc="LBT-SMX (shared memory) source (tlen 10).")


class OpaqueTransport(Record):
    """Transport info of a code tshark cannot parse (TCP6, PGM, anything unknown): raw bytes.

    ``transport`` is the 7-bit transport code; the block is ``tlen`` bytes of ``data``.  Also
    the way to craft a known transport with a wrong length.
    """

    __slots__ = ("transport",)
    transport: int
    kind = _kind_for("OpaqueTransport", "lbmr.tir", cs.Struct(
        field("data", cs.GreedyBytes, tshark="unknown_transport")))

    def __init__(self, transport: int = TransportType.TCP6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "transport", transport)

    def _init_extras(self) -> None:
        object.__setattr__(self, "transport", 0)

    @property
    def code(self) -> int:
        return self.transport

    def _extras_key(self) -> tuple[Any, ...]:
        return (self.transport,)


# --- topic information records ----------------------------------------------------------------

TirHead = cs.Struct(
    field("name", cstring()),
    field("transport", Auto(U8, lambda ctx: (int(ctx.get("transport_code") or 0) & 0x7F)
                            | (TIR_OPTIONS_FLAG if ctx.get("has_options") else 0)),
          tshark=None, bits={"transport_opts": Bit(TIR_OPTIONS_FLAG, tshark="transport_opts"),
                             "transport_type": Bit(0x7F, tshark="transport_type")}),
    field("tlen", Auto(U8, lambda ctx: int(ctx.get("info_size") or 0))),
    field("ttl", U16),
    field("index", U32),
)
"""TIR head: topic name, transport byte (0x80 options present, 0x7F type), tlen, ttl, index.

The options block (if any) and then ``tlen`` bytes of transport info follow.
"""

TIR_FIXED = derive(cs.Struct(*list(members(TirHead))[1:]))


def _topic_options_size(options: Sequence[Record]) -> int:
    return sum(len(option.encode()) for option in options)


def _encode_topic_options(owner: str, options: Sequence[Record], total_len: int | None) -> bytes:
    body = bytearray()
    for option in options:
        try:
            body += option.encode()
        except WireError as exc:
            raise exc.shifted(4 + len(body), owner) from None
    total = 4 + len(body) if total_len is None else total_len
    try:
        head = TOPT_LEN.pack({"type": 0, "len": 4, "total_len": total})
    except struct.error as exc:
        raise WireError("lbmr.topt.len", 2, f"total_len {total}: {exc}") from None
    return head + bytes(body)


def _topic_options_fields(options: Sequence[Record], total_len: int | None,
                          ) -> list[tuple[str, Any]]:
    total = 4 + _topic_options_size(options) if total_len is None else total_len
    out: list[tuple[str, Any]] = export_struct(
        "lbmr.topt.len", ToptLenStruct, {"type": 0, "len": 4, "total_len": total})
    for option in options:
        out += option.tshark_fields()
    return out


class Tir(Record):
    """A topic information record: a source advertises topic ``name`` on transport ``info``.

    Attributes (beyond the :data:`TirHead` members ``name``, ``transport``, ``tlen``, ``ttl``,
    ``index``):
        info: the transport info record (:class:`LbtruSidInfo`, :class:`TcpInfo`, ...,
            :class:`OpaqueTransport`); its code is the transport type.
        options: the topic options (``None`` = no options block, transport bit 0x80 clear);
            the block's 4-byte length header is written by the codec.
        opt_total_len: explicit ``total_len`` of the options block (``None`` = computed).

    ``transport`` and ``tlen`` are computed from ``info``/``options`` unless set explicitly.
    """

    __slots__ = ("info", "opt_total_len", "options")
    info: Record
    options: list[Record] | None
    opt_total_len: int | None
    kind = _kind_for("Tir", "lbmr.tir", TirHead)

    def __init__(self, info: Record | None = None, options: Iterable[Record] | None = None,
                 opt_total_len: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "info", info if info is not None else OpaqueTransport())
        object.__setattr__(self, "options", None if options is None else list(options))
        object.__setattr__(self, "opt_total_len", opt_total_len)

    def _init_extras(self) -> None:
        object.__setattr__(self, "info", OpaqueTransport())
        object.__setattr__(self, "options", None)
        object.__setattr__(self, "opt_total_len", None)

    def _context(self) -> dict[str, Any]:
        return {"transport_code": self.info.code, "has_options": self.options is not None,
                "info_size": len(self.info.encode())}

    def _extras_key(self) -> tuple[Any, ...]:
        total = None
        if self.options is not None:
            total = (4 + _topic_options_size(self.options) if self.opt_total_len is None
                     else self.opt_total_len)
        return (self.info, self.options, total)

    def encode(self) -> bytes:
        head = super().encode()
        opts = b""
        if self.options is not None:
            try:
                opts = _encode_topic_options("lbmr.tir", self.options, self.opt_total_len)
            except WireError as exc:
                raise exc.shifted(len(head), "lbmr.tir") from None
        try:
            info = self.info.encode()
        except WireError as exc:
            raise exc.shifted(len(head) + len(opts), "lbmr.tir") from None
        return head + opts + info

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        if self.options is not None:
            out += _topic_options_fields(self.options, self.opt_total_len)
        return out + self.info.tshark_fields()


# --- queue information records (type 6, UMQ) ----------------------------------------------------

QirHead = cs.Struct(
    field("qname", cstring()),
    field("tname", cstring()),
    field("queue_id", U32),
    field("queue_ver", U32),
    field("queue_prev_ver", U32),
    field("grp_blks", Auto(U16, lambda ctx: (QIR_OPTIONS_FLAG if ctx.get("has_options") else 0)
                           | len(ctx.get("groups") or ())),
          tshark=None, bits={"opts": Bit(QIR_OPTIONS_FLAG, tshark="opts"),
                             "grp_count": Bit(0x7FFF, tshark="grp_blks")}),
    field("queue_blks", Auto(U16, lambda ctx: len(ctx.get("queues") or ()))),
)
"""QIR head: queue and topic names, ids, group-block word (0x8000 options), queue-block count.

Then come the options block (if flagged), the group blocks and the queue blocks.
"""

QIR_FIXED = derive(cs.Struct(*list(members(QirHead))[2:]))

QirGroup = _record("QirGroup", "lbmr.qir.grp", cs.Struct(
    field("grp_idx", U16), field("grp_sz", U16)))
QirQueue = _record("QirQueue", "lbmr.qir.queue", cs.Struct(
    field("ip", IPv4), field("port", U16), field("idx", U16), field("grp_idx", U16),
    field("reserved", U16)))


class Qir(Record):
    """A queue information record (UMQ, type 6 packets).

    Attributes beyond the :data:`QirHead` members: ``options`` (TIR-style options block or
    ``None``), ``opt_total_len``, ``groups`` (:class:`QirGroup` list) and ``queues``
    (:class:`QirQueue` list).  ``grp_blks``/``queue_blks`` are computed unless set.
    """

    __slots__ = ("groups", "opt_total_len", "options", "queues")
    options: list[Record] | None
    opt_total_len: int | None
    groups: list[Record]
    queues: list[Record]
    kind = _kind_for("Qir", "lbmr.qir", QirHead)

    def __init__(self, options: Iterable[Record] | None = None,
                 groups: Iterable[Record] = (), queues: Iterable[Record] = (),
                 opt_total_len: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "options", None if options is None else list(options))
        object.__setattr__(self, "opt_total_len", opt_total_len)
        object.__setattr__(self, "groups", list(groups))
        object.__setattr__(self, "queues", list(queues))

    def _init_extras(self) -> None:
        object.__setattr__(self, "options", None)
        object.__setattr__(self, "opt_total_len", None)
        object.__setattr__(self, "groups", [])
        object.__setattr__(self, "queues", [])

    def _context(self) -> dict[str, Any]:
        return {"has_options": self.options is not None, "groups": self.groups,
                "queues": self.queues}

    def _extras_key(self) -> tuple[Any, ...]:
        total = None
        if self.options is not None:
            total = (4 + _topic_options_size(self.options) if self.opt_total_len is None
                     else self.opt_total_len)
        return (self.options, total, self.groups, self.queues)

    def encode(self) -> bytes:
        out = bytearray(super().encode())
        if self.options is not None:
            try:
                out += _encode_topic_options("lbmr.qir", self.options, self.opt_total_len)
            except WireError as exc:
                raise exc.shifted(len(out), "lbmr.qir") from None
        for block in [*self.groups, *self.queues]:
            out += block.encode()
        return bytes(out)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        for block in [*self.groups, *self.queues]:
            out += block.tshark_fields()
        if self.options is not None:  # tshark hangs the block beside the QIR, after it
            out += _topic_options_fields(self.options, self.opt_total_len)
        return out


# --- topic management (type 4) -----------------------------------------------------------------

Tmr = _record("Tmr", "lbmr.tmb.tmr", cs.Struct(
    field("len", Auto(U16, lambda ctx: 5 + text_size(ctx.name)
                      + len(ctx.get("trailing") or b""))),
    field("type", U8),
    field("flags", U8, bits={"response": 0x80, "wildcard_pcre": 0x40, "wildcard_regex": 0x20}),
    field("name", cstring()),
    field("trailing", cs.Bytes(lambda ctx: ctx.len - 5 - text_size(ctx.name)), tshark=None),
),
    doc="A topic management record: len (whole record), type (0 leave, 1 use), flags, topic name.")


class Tmb(Record):
    """The topic management block of a type-4 packet: ``len``, ``tmrs`` and the TMRs.

    ``len`` [I] is computed as the whole block (4 + all TMRs); tshark only displays it.
    """

    __slots__ = ("records",)
    records: list[Record]
    kind = _kind_for("Tmb", "lbmr.tmb", cs.Struct(
        field("len", Auto(U16, lambda ctx: 4 + sum(int(r["len"]) for r in ctx.get("tmr_values")
                                                   or ()))),
        field("tmrs", Auto(U16, lambda ctx: len(ctx.get("tmr_values") or ()))),
    ))

    def __init__(self, records: Iterable[Record] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "records", list(records))

    def _init_extras(self) -> None:
        object.__setattr__(self, "records", [])

    def _context(self) -> dict[str, Any]:
        return {"tmr_values": [r.resolved() for r in self.records]}

    def _extras_key(self) -> tuple[Any, ...]:
        return (self.records,)

    def encode(self) -> bytes:
        out = bytearray(super().encode())
        for record in self.records:
            try:
                out += record.encode()
            except WireError as exc:
                raise exc.shifted(len(out), "lbmr.tmb") from None
        return bytes(out)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        for record in self.records:
            out += record.tshark_fields()
        return out


# --- LBMR packet options ------------------------------------------------------------------------

PACKET_OPTIONS: dict[int, type[Record]] = {}


def _popt(code: int, cls_name: str, name: str, *body: cs.Construct, doc: str = "",
          ) -> type[Record]:
    size = 2 + fixed_size(body)
    struct_def = cs.Struct(field("type", U8), field("len", Auto(U8, lambda ctx: size)), *body)
    return _record(cls_name, f"lbmr.opt.{name}", struct_def, code, PACKET_OPTIONS,
                   doc=doc or f"LBMR packet option {name} ({size} bytes).")


OptLen = _popt(0x80, "OptLen", "len",
               field("total_len", Auto(U16, lambda ctx: int(ctx.get("options_size") or 4))),
    doc="Option length (0x80): ``total_len`` = size of the whole packet-options block.")
OptSrcId = _popt(0x81, "OptSrcId", "src_id", _flags16(), field("src_id", cs.Bytes(8)),
                 doc="Source ID (0x81): 8 bytes identifying the sending context.")
OptSrcType = _popt(0x82, "OptSrcType", "src_type", _flags8(), field("src_type", U8),
                   doc="Source type (0x82): what sent the packet (:class:`SourceType`, 2 = "
                       "store).")
OptVersion = _popt(0x83, "OptVersion", "version", _flags16(ume=0x0001, umq=0x0002),
                   field("version", U32),
                   doc="Version (0x83): sender version and UME/UMQ capability bits.")
OptLocalDomain = _popt(0x84, "OptLocalDomain", "local_domain", _flags16(),
                       field("local_domain_id", U32),
                       doc="Local domain (0x84): the sender's domain ID.")


class OptUnknown(Record):
    """A packet option of a type tshark does not know (it warns "Unknown LBMR option type").

    tshark shows the two flag bytes as an empty (FT_NONE) item, so ``flags`` is not exported.
    """

    __slots__ = ()
    kind = _kind_for("OptUnknown", "lbmr.opt.unknown", cs.Struct(
        field("type", U8),
        field("len", Auto(U8, lambda ctx: 4 + len(ctx.data))),
        field("flags", U16, tshark=None),
        field("data", cs.Bytes(this.len - 4)),
    ))


def with_length_option(options: Iterable[Record], *, last: bool = True) -> list[Record]:
    """``options`` plus an :data:`OptLen` (computed ``total_len``), appended or prepended.

    [I] Real UM appears to append it (tshark peeks at the last four bytes for it), hence the
    default; tshark decodes both placements identically.
    """
    opts = [o for o in options]
    return [*opts, OptLen()] if last else [OptLen(), *opts]


# --- extended records (type 7) ------------------------------------------------------------------

EXT_RECORDS: dict[int, type[Record]] = {}
EXT_TITLES: dict[int, str] = {
    ExtType.PSER: "Proxy Source Election", ExtType.QUEUE_MGMT: "Queue Management",
    ExtType.CONTEXT_INFO: "Context Information",
    ExtType.TOPIC_RES_REQUEST: "Topic Resolution Request", ExtType.TNWG: "Gateway Message",
    ExtType.REMOTE_DOMAIN_ROUTE: "Remote Domain Route",
    ExtType.REMOTE_CONTEXT_INFO: "Remote Context Information",
}
"""tshark's Info-column names of the extended types ("ExtType <name>")."""

PserOptLen = _record("PserOptLen", "lbmr.pser.opt.optlen", cs.Struct(
    field("type", U16),
    field("optlen", Auto(U16, lambda ctx: 4 + int(ctx.get("options_size") or 0))),
),
    doc="The PSER options header: type, optlen (this header plus all options).")

PserCtxinst = _record("PserCtxinst", "lbmr.pser.opt.ctxinst", cs.Struct(
    field("len", Auto(U8, lambda ctx: 10)),
    field("type", U8),
    field("ctxinst", cs.Bytes(8)),
),
    doc="A PSER context-instance option: type 0 source, 1 store (tshark always steps 10 bytes).")

PserOptUnknown = _record("PserOptUnknown", "lbmr.pser.opt.unknown", cs.Struct(
    field("len", Auto(U8, lambda ctx: 2 + len(ctx.data)), tshark=None),
    field("type", U8, tshark=None),
    field("data", cs.Bytes(this.len - 2), tshark=None),
),
    doc="A PSER option of another type: tshark skips ``len`` bytes and warns (no tree item).")

PserStruct = cs.Struct(
    field("dep_type", U16),
    field("len", Auto(U16, lambda ctx: 28 + text_size(ctx.topic))),
    field("flags", Auto(U16, lambda ctx: PSER_OPTIONS_FLAG if ctx.get("has_options") else 0),
          bits={"option": PSER_OPTIONS_FLAG}),
    field("source_ip", IPv4),
    field("store_ip", IPv4),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("source_port", U16),
    field("store_port", U16),
    field("topic", text(this.len - 28)),
)
"""UME proxy source election (ext 0x01), from offset 2; ``len`` counts from offset 0."""


class Pser(Record):
    """UME proxy source election: which store proxies a departed source's topic.

    ``options``: ``None`` (flag 0x8000 clear) or a list of :data:`PserCtxinst` /
    :data:`PserOptUnknown`; ``optlen_type``/``optlen`` fill the options header (``optlen``
    computed when ``None``).  ``flags`` is computed from ``options`` unless set.
    """

    __slots__ = ("options", "optlen", "optlen_type")
    options: list[Record] | None
    optlen: int | None
    optlen_type: int
    kind = _kind_for("Pser", "lbmr.pser", PserStruct, ExtType.PSER)

    def __init__(self, options: Iterable[Record] | None = None, optlen: int | None = None,
                 optlen_type: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "options", None if options is None else list(options))
        object.__setattr__(self, "optlen", optlen)
        object.__setattr__(self, "optlen_type", optlen_type)

    def _init_extras(self) -> None:
        object.__setattr__(self, "options", None)
        object.__setattr__(self, "optlen", None)
        object.__setattr__(self, "optlen_type", 0)

    def _context(self) -> dict[str, Any]:
        return {"has_options": self.options is not None}

    def _options_header(self) -> Record:
        size = sum(len(o.encode()) for o in self.options or ())
        return PserOptLen(type=self.optlen_type,
                          optlen=4 + size if self.optlen is None else self.optlen)

    def _extras_key(self) -> tuple[Any, ...]:
        if self.options is None:
            return (None,)
        return (self.options, self._options_header())

    def encode(self) -> bytes:
        out = bytearray(super().encode())
        if self.options is not None:
            out += self._options_header().encode()
            for option in self.options:
                try:
                    out += option.encode()
                except WireError as exc:
                    raise exc.shifted(2 + len(out), "lbmr.pser") from None
        return bytes(out)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        if self.options is not None:
            out += self._options_header().tshark_fields()
            for option in self.options:
                out += option.tshark_fields()
        return out


EXT_RECORDS[ExtType.PSER] = Pser


class CtxInfo(Record):
    """Context information (ext 0x03): how a context (e.g. a store) is reached, and its name.

    ``len`` counts from offset 0 (20 + name).  tshark shows ``name`` only when the name flag
    (0x0001) is set; the bytes are carried either way.
    """

    __slots__ = ()
    kind = _kind_for("CtxInfo", "lbmr.ctxinfo", cs.Struct(
        field("len", Auto(U8, lambda ctx: 20 + text_size(ctx.name))),
        field("hop_count", U8),
        # The ip/instance/name bits say which of those members are meaningful.
        field("flags", U16, bits={"query": 0x8000,
                                  "ip_flag": Bit(0x4000, tshark="flags.ip"),
                                  "instance_flag": Bit(0x2000, tshark="flags.instance"),
                                  "tnwg_src": 0x1000, "tnwg_rcv": 0x0800, "proxy": 0x0400,
                                  "name_flag": Bit(CTXINFO_NAME_FLAG, tshark="flags.name")}),
        field("port", U16),
        field("ip", IPv4),
        field("instance", cs.Bytes(8)),
        field("name", text(this.len - 20), tshark="name"),
    ), ExtType.CONTEXT_INFO)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        out = super().tshark_fields()
        if not int(self.resolved()["flags"]) & CTXINFO_NAME_FLAG:
            out = [(n, v) for n, v in out if n != "lbmr.ctxinfo.name"]
        return out


EXT_RECORDS[ExtType.CONTEXT_INFO] = CtxInfo

TopicResRequest = _record("TopicResRequest", "lbmr.topic_res_request", cs.Struct(
    field("flags", U16, bits={"gw_remote_interest": 0x40, "context_query": 0x20,
                              "context_advertisement": 0x10, "gateway_meta": 0x08,
                              "advertisement": 0x04, "query": 0x02, "wildcard_query": 0x01}),
), ExtType.TOPIC_RES_REQUEST, EXT_RECORDS,
    doc="Topic resolution request (ext 0x04): which resolution traffic the sender asks for.")

Tnwg = _record("Tnwg", "lbmr.tnwg", cs.Struct(
    field("len", Auto(U16, lambda ctx: 8 + len(ctx.body))),
    field("type", U16),
    field("reserved", U16),
    field("body", cs.Bytes(this.len - 8), tshark=None),
), ExtType.TNWG, EXT_RECORDS,
    doc="Gateway message (ext 0x05): typed header, opaque sub-body of ``len`` - 8 bytes [I].")

RdrDomain = cs.Struct(field("domain", U32, tshark="lbmr.remote_domain_route.domain"))
"""One domain id of a remote domain route."""

RemoteDomainRoute = _record("RemoteDomainRoute", "lbmr.remote_domain_route", cs.Struct(
    field("num_domains", Auto(U16, lambda ctx: len(ctx.domains))),
    field("ip", IPv4),
    field("port", U16),
    field("reserved", U16),
    field("length", Auto(U32, lambda ctx: 16 + 4 * len(ctx.domains))),
    field("domains", cs.Array(this.num_domains, RdrDomain), tshark="domains"),
), ExtType.REMOTE_DOMAIN_ROUTE, EXT_RECORDS,
    doc='Remote domain route (ext 0x06); ``domains`` is a list of ``{"domain": id}``. '
        "``length`` [I] is computed as the whole message from offset 0 (16 + 4 per domain).")

RctxRecord = cs.Struct(
    field("len", Auto(U16, lambda ctx: 4 + len(ctx.data))),
    field("flags", U16, bits={"query": 0x8000}),
    field("data", cs.Bytes(this.len - 4), tshark=None),
)
"""One remote-context-info record: len (whole record), flags, opaque option bytes."""

RemoteCtxInfo = _record("RemoteCtxInfo", "lbmr.rctxinfo", cs.Struct(
    field("len", Auto(U16, lambda ctx: 8 + sum(
        (4 + len(r["data"])) if r.get("len") is None else int(r["len"]) for r in ctx.records))),
    field("num_recs", Auto(U16, lambda ctx: len(ctx.records))),
    field("reserved", U16),
    field("records", cs.Array(this.num_recs, RctxRecord), tshark="rec"),
), ExtType.REMOTE_CONTEXT_INFO, EXT_RECORDS,
    doc='Remote context information (ext 0x07); records are ``{"len", "flags", "data"}`` '
        "dicts whose option bytes (``data``) are carried opaquely.  ``len`` [I] covers the "
        "message from offset 0.")

QueueMgmt = _record("QueueMgmt", "lbmr.qmgmt", cs.Struct(
    field("data", cs.GreedyBytes, tshark=None),
), ExtType.QUEUE_MGMT, EXT_RECORDS,
    doc="UMQ queue management (ext 0x02), opaque up to the end of the body view.")


class ExtUnknown(Record):
    """An extended type tshark does not know: no body (tshark warns, then reads options)."""

    __slots__ = ("ext_type",)
    ext_type: int
    kind = _kind_for("ExtUnknown", "lbmr", cs.Struct())

    def __init__(self, ext_type: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "ext_type", ext_type)

    def _init_extras(self) -> None:
        object.__setattr__(self, "ext_type", 0)

    @property
    def code(self) -> int:
        return self.ext_type

    def _extras_key(self) -> tuple[Any, ...]:
        return (self.ext_type,)


# --- decoding walkers ----------------------------------------------------------------------------


def _cstring_end(buf: bytes, pos: int, limit: int, header: str, what: str) -> int:
    """Offset just past the NUL of a name starting at ``pos`` (the NUL must lie before limit)."""
    if pos >= limit:
        raise WireError(header, pos, f"truncated: no room for the {what}")
    nul = buf.find(b"\0", pos, limit)
    if nul < 0:
        raise WireError(header, pos, f"{what} is not NUL-terminated within the packet")
    return nul + 1


def _decode_topic_options(buf: bytes, pos: int, limit: int,
                          ) -> tuple[list[Record], int | None, int]:
    """(options, explicit total_len or None, end) of an options block at ``pos``."""
    if pos + TOPT_LEN.size > limit:
        raise WireError("lbmr.topt.len", pos, "truncated options block header")
    otype, olen, total = TOPT_LEN.unpack_from(buf, pos)
    if otype != 0 or olen != 4:
        raise WireError("lbmr.topt.len", pos,
                        f"options block must start with type 0 len 4, found {otype}/{olen}")
    if total < 4:
        raise WireError("lbmr.topt.len", pos + 2, f"total_len {total} < the 4-byte header")
    end = pos + total
    if end > limit:
        raise WireError("lbmr.topt.len", pos + 2,
                        f"total_len {total} runs past the packet ({limit - pos} bytes left)")
    options: list[Record] = []
    cur = pos + 4
    while cur < end:
        if end - cur < 2:
            raise WireError("lbmr.topts", cur, "a partial option at the end of the block")
        code, length = buf[cur], buf[cur + 1]
        cls = TOPIC_OPTIONS.get(code, ToptUnknown)
        if length == 0:
            raise WireError(cls.kind.tshark, cur + 1, "zero-length option")
        if cur + length > end:
            raise WireError(cls.kind.tshark, cur + 1,
                            f"len {length} runs past the options block (total_len {total})")
        if length < cls.kind.min_size:
            raise WireError(cls.kind.tshark, cur + 1,
                            f"len {length} is shorter than the {cls.kind.min_size}-byte layout")
        option = cls.decode(buf, cur, cur + length)
        _forget_computed(option)
        options.append(option)
        cur += length
    computed = 4 + sum(len(o.encode()) for o in options)
    return options, (None if computed == total else total), end


def _decode_transport(buf: bytes, pos: int, limit: int, code: int, tlen: int) -> Record:
    cls = TRANSPORTS.get((code, tlen))
    if code in TRANSPORT_NAMES and cls is None:
        sizes = sorted(size for c, size in TRANSPORTS if c == code)
        raise WireError(f"lbmr.tir.{TRANSPORT_NAMES[code]}", pos,
                        f"wrong transport length {tlen} (valid: {sizes})")
    if pos + tlen > limit:
        raise WireError("lbmr.tir", pos, f"tlen {tlen} runs past the packet "
                                         f"({max(limit - pos, 0)} bytes left)")
    if cls is None:
        info = OpaqueTransport.decode(buf, pos, pos + tlen)
        object.__setattr__(info, "transport", code)
        return info
    return cls.decode(buf, pos, pos + tlen)


def _decode_tir(buf: bytes, pos: int, limit: int) -> tuple[Record, int]:
    cur = _cstring_end(buf, pos, limit, "lbmr.tir", "topic name")
    if cur + TIR_FIXED.size > limit:
        raise WireError("lbmr.tir", cur, "truncated: transport/tlen/ttl/index missing")
    transport, tlen, ttl, index = TIR_FIXED.unpack_from(buf, cur)
    name = bytes_text(buf[pos:cur - 1])
    tir = Tir._from_values({"name": name, "transport": transport, "tlen": tlen, "ttl": ttl,
                            "index": index})
    assert isinstance(tir, Tir)
    cur += TIR_FIXED.size
    if transport & TIR_OPTIONS_FLAG:
        options, total, cur = _decode_topic_options(buf, cur, limit)
        object.__setattr__(tir, "options", options)
        object.__setattr__(tir, "opt_total_len", total)
    info = _decode_transport(buf, cur, limit, transport & 0x7F, tlen)
    object.__setattr__(tir, "info", info)
    _forget_computed(tir)
    return tir, cur + tlen


def _decode_qir(buf: bytes, pos: int, limit: int) -> tuple[Record, int]:
    tname_at = _cstring_end(buf, pos, limit, "lbmr.qir", "queue name")
    cur = _cstring_end(buf, tname_at, limit, "lbmr.qir", "topic name")
    if cur + QIR_FIXED.size > limit:
        raise WireError("lbmr.qir", cur, "truncated: ids and block counts missing")
    values = QIR_FIXED.decode(buf, cur)
    values["qname"] = bytes_text(buf[pos:tname_at - 1])
    values["tname"] = bytes_text(buf[tname_at:cur - 1])
    qir = Qir._from_values({m.name: values[m.name] for m in members(QirHead)})
    assert isinstance(qir, Qir)
    cur += QIR_FIXED.size
    word = int(values["grp_blks"])
    if word & QIR_OPTIONS_FLAG:
        options, total, cur = _decode_topic_options(buf, cur, limit)
        object.__setattr__(qir, "options", options)
        object.__setattr__(qir, "opt_total_len", total)
    for count, cls, target in ((word & 0x7FFF, QirGroup, qir.groups),
                               (int(values["queue_blks"]), QirQueue, qir.queues)):
        for _ in range(count):
            block, cur = cls.decode_from(buf, cur, limit)
            target.append(block)
    _forget_computed(qir)
    return qir, cur


def _decode_tmb(buf: bytes, pos: int, limit: int) -> tuple[Record, int]:
    head, cur = Tmb.decode_from(buf, pos, limit)
    assert isinstance(head, Tmb)
    for _ in range(int(head.values["tmrs"])):
        if cur + 2 > limit:
            raise WireError("lbmr.tmb.tmr", cur, "truncated TMR")
        length = int.from_bytes(buf[cur:cur + 2], "big")
        if length < 5:
            raise WireError("lbmr.tmb.tmr", cur, f"len {length} is shorter than a TMR (5)")
        if cur + length > limit:
            raise WireError("lbmr.tmb.tmr", cur, f"len {length} runs past the packet")
        _cstring_end(buf, cur + 4, cur + length, "lbmr.tmb.tmr", "topic name")
        tmr = Tmr.decode(buf, cur, cur + length)
        _forget_computed(tmr)
        head.records.append(tmr)
        cur += length
    _forget_computed(head)
    return head, cur


def _decode_pser(buf: bytes, pos: int, limit: int) -> tuple[Record, int]:
    if pos + 4 > limit:
        raise WireError("lbmr.pser", pos, "truncated PSER header")
    length = int.from_bytes(buf[pos + 2:pos + 4], "big")
    if length < 28:
        raise WireError("lbmr.pser", pos + 2, f"len {length} is shorter than 28")
    if length > limit:
        raise WireError("lbmr.pser", pos + 2, f"len {length} runs past the packet ({limit})")
    pser = Pser.decode(buf, pos, length)
    assert isinstance(pser, Pser)
    cur = length
    if int(pser.values["flags"]) & PSER_OPTIONS_FLAG:
        if cur + 4 > limit:
            raise WireError("lbmr.pser.opt.optlen", cur, "truncated options header")
        header = PserOptLen.decode(buf, cur, cur + 4)
        optlen = int(header.values["optlen"])
        if optlen < 4 or cur + optlen > limit:
            raise WireError("lbmr.pser.opt.optlen", cur + 2,
                            f"optlen {optlen} is invalid ({limit - cur} bytes left)")
        end, cur = cur + optlen, cur + 4
        options: list[Record] = []
        while cur < end:
            if end - cur < 2:
                raise WireError("lbmr.pser.opts", cur, "a partial option at the end")
            # tshark steps 10 bytes over a context-instance option whatever its len says,
            # and len bytes over any other option.
            if buf[cur + 1] in PserOptType._value2member_map_:
                cls, size = PserCtxinst, PserCtxinst.kind.min_size
            else:
                cls, size = PserOptUnknown, buf[cur]
                if size < 2:
                    raise WireError(cls.kind.tshark, cur, f"option len {size} < 2")
            if cur + size > end:
                raise WireError(cls.kind.tshark, cur, f"option runs past optlen {optlen}")
            option = cls.decode(buf, cur, cur + size)
            _forget_computed(option)
            options.append(option)
            cur += size
        computed = 4 + sum(len(o.encode()) for o in options)
        object.__setattr__(pser, "options", options)
        object.__setattr__(pser, "optlen_type", int(header.values["type"]))
        object.__setattr__(pser, "optlen", None if optlen == computed else optlen)
    _forget_computed(pser)
    return pser, cur


def _decode_ext(buf: bytes, limit: int) -> tuple[Record, int]:
    ext_type = buf[1]
    pos = EXT_HEADER.size
    if ext_type == ExtType.PSER:
        return _decode_pser(buf, pos, limit)
    cls = EXT_RECORDS.get(ext_type)
    if cls is None:
        return ExtUnknown(ext_type), pos
    if cls is CtxInfo:
        if pos + 1 > limit:
            raise WireError("lbmr.ctxinfo", pos, "truncated context info")
        length = buf[pos]
        if length < 20 or length > limit:
            raise WireError("lbmr.ctxinfo", pos, f"len {length} is invalid (20..{limit})")
        record: Record = CtxInfo.decode(buf, pos, length)
        end = length
    elif cls is Tnwg:
        if pos + 2 > limit:
            raise WireError("lbmr.tnwg", pos, "truncated gateway message")
        length = int.from_bytes(buf[pos:pos + 2], "big")
        if length < 8 or length > limit:
            raise WireError("lbmr.tnwg", pos, f"len {length} is invalid (8..{limit})")
        record = Tnwg.decode(buf, pos, length)
        end = length
    elif cls is QueueMgmt:
        record, end = QueueMgmt.decode(buf, pos, max(limit, pos)), max(limit, pos)
    else:
        record, end = cls.decode_from(buf, pos, limit)
    _forget_computed(record)
    return record, end


def _forget_computed(record: Record) -> None:
    """Reset computed members that agree with their formula, so the record re-derives them."""
    forget_computed(record.kind.struct, record.values, record._context())



def _decode_options(buf: bytes, pos: int, end: int) -> list[Record]:
    options: list[Record] = []
    while pos < end:
        code = buf[pos]
        cls = PACKET_OPTIONS.get(code)
        if cls is not None:
            # Known types advance by their fixed size, whatever their len byte says.
            option, nxt = cls.decode_from(buf, pos, end)
        else:
            if pos + 2 > end:
                raise WireError("lbmr.opt.unknown", pos, "truncated option")
            length = buf[pos + 1]
            if length < 4:
                raise WireError("lbmr.opt.unknown", pos + 1,
                                f"len {length} is shorter than the 4-byte option header")
            if pos + length > end:
                raise WireError("lbmr.opt.unknown", pos + 1, f"len {length} runs past the packet")
            option, nxt = OptUnknown.decode(buf, pos, pos + length), pos + length
        options.append(option)
        pos = nxt
    total = sum(len(o.encode()) for o in options)
    for option in options:
        total_len = option.values.get("total_len")
        _forget_computed(option)
        if isinstance(option, OptLen):  # its formula needs the whole block: decide here
            option.values["total_len"] = None if total_len == total else total_len
    return options


# --- packets ------------------------------------------------------------------------------------


@dataclass(eq=False)
class LbmrPacket:
    """One LBMR datagram (a whole UDP payload).

    Attributes:
        type: header type (:class:`PacketType`; 5 may be crafted).
        tqrs: TQRs (:data:`Tqr`, type 0), wildcard TQRs (:class:`WcTqr`, type 1) or queue
            queries (:data:`Qqr`, type 6).
        tirs: TIRs (:class:`Tir`, types 0 and 1) or QIRs (:class:`Qir`, type 6).
        tmb: the topic management block of type 4.
        ext: the extended record of type 7 (:class:`Pser`, :class:`CtxInfo`, ...,
            :class:`ExtUnknown`).
        options: LBMR packet options (:data:`OptLen`, :data:`OptVersion`, ...), in wire order.
        version: header version nibble (0 normal, 1 gateway).
        trailer: bytes after the body that tshark does not decode (options bit clear).
        tqr_count / tir_count: explicit header counts (``None`` = list lengths).
        opts_flag: explicit options-present bit (``None`` = ``bool(options)``).
    """

    type: int = PacketType.NORMAL
    tqrs: list[Record] = dc_field(default_factory=list)
    tirs: list[Record] = dc_field(default_factory=list)
    tmb: Record | None = None
    ext: Record | None = None
    options: list[Record] = dc_field(default_factory=list)
    version: int = 0
    trailer: bytes = b""
    tqr_count: int | None = None
    tir_count: int | None = None
    opts_flag: bool | None = None

    @classmethod
    def parse(cls, payload: bytes | bytearray | memoryview) -> LbmrPacket:
        """Same as :func:`parse_packet`."""
        return parse_packet(payload)

    # -- resolution ------------------------------------------------------------------------

    def options_bit(self) -> bool:
        return bool(self.options) if self.opts_flag is None else self.opts_flag

    def ver_type(self) -> int:
        return (self.version << 4) | (OPTS_FLAG if self.options_bit() else 0) | self.type

    def counts(self) -> tuple[int, int]:
        return (len(self.tqrs) if self.tqr_count is None else self.tqr_count,
                len(self.tirs) if self.tir_count is None else self.tir_count)

    def resolved_options(self) -> list[Record]:
        """The options with every :data:`OptLen` ``total_len`` computed (block size)."""
        total = sum(len(o.encode()) for o in self.options)
        out = []
        for option in self.options:
            if isinstance(option, OptLen) and option.values["total_len"] is None:
                option = OptLen(**{**option.values, "total_len": total})
            out.append(option)
        return out

    def _check_records(self) -> None:
        expected: dict[int, tuple[tuple[type[Record], ...], tuple[type[Record], ...]]] = {
            PacketType.NORMAL: ((Tqr,), (Tir,)),
            PacketType.WC_TQR: ((WcTqr,), (Tir,)),
            PacketType.UMQ: ((Qqr,), (Qir,)),
        }
        queries, infos = expected.get(self.type, ((), ()))
        for rec in self.tqrs:
            if not isinstance(rec, queries):
                raise WireError("lbmr", 0, f"type {self.type} cannot carry {type(rec).__name__}")
        for rec in self.tirs:
            if not isinstance(rec, infos):
                raise WireError("lbmr", 0, f"type {self.type} cannot carry {type(rec).__name__}")
        if self.type == PacketType.EXT and not isinstance(self.ext, (*EXT_RECORDS.values(),
                                                                     ExtUnknown)):
            raise WireError("lbmr", 1, "an extended (type 7) packet needs an ext record, "
                                       f"not {type(self.ext).__name__}")
        if self.type == PacketType.TOPIC_MGMT and self.tmb is None:
            raise WireError("lbmr", 4, "a topic management (type 4) packet needs a TMB")

    # -- bytes ------------------------------------------------------------------------------

    def build(self) -> bytes:
        """The datagram's bytes.  Raises :class:`WireError` for values that cannot be encoded."""
        if not (0 <= self.version <= 15 and 0 <= self.type <= 7):
            raise WireError("lbmr.hdr", 0, "version must fit 4 bits and type 3 bits")
        self._check_records()
        out = bytearray()
        try:
            if self.type == PacketType.EXT:
                assert self.ext is not None
                out += EXT_HEADER.pack({"ver_type": self.ver_type(), "ext_type": self.ext.code})
            else:
                tqrs, tirs = self.counts()
                out += HEADER.pack({"ver_type": self.ver_type(), "tqrs": tqrs, "tirs": tirs})
        except (struct.error, TypeError) as exc:
            raise WireError("lbmr.hdr", 0, f"cannot encode header: {exc}") from None
        for record in self._body_records():
            try:
                out += record.encode()
            except WireError as exc:
                raise exc.shifted(len(out)) from None
        out += self.trailer
        for option in self.resolved_options():
            try:
                out += option.encode()
            except WireError as exc:
                raise exc.shifted(len(out)) from None
        return bytes(out)

    def _body_records(self) -> list[Record]:
        if self.type == PacketType.EXT:
            return [self.ext] if self.ext is not None else []
        if self.type == PacketType.TOPIC_MGMT:
            return [self.tmb] if self.tmb is not None else []
        return [*self.tqrs, *self.tirs]

    # -- tshark --------------------------------------------------------------------------------

    def tshark_fields(self) -> list[tuple[str, Any]]:
        """The packet as tshark shows it: (display-filter name, value) pairs in tree order.

        Generated fields (``lbmr.tir.channel``) depend on discovery order and are left out.
        """
        self._check_records()
        out: list[tuple[str, Any]]
        if self.type == PacketType.EXT:
            assert self.ext is not None
            out = export_struct("lbmr", ExtHeader,
                                {"ver_type": self.ver_type(), "ext_type": self.ext.code})
        else:
            tqrs, tirs = self.counts()
            out = export_struct("lbmr", LbmrHeader,
                                {"ver_type": self.ver_type(), "tqrs": tqrs, "tirs": tirs})
            if self.type == PacketType.UMQ:
                out = [(UMQ_COUNT_NAMES.get(n, n), v) for n, v in out]
        for record in self._body_records():
            out += record.tshark_fields()
        for option in self.resolved_options():
            out += option.tshark_fields()
        return out

    def info(self) -> str:
        """tshark's Info column for this packet."""
        self._check_records()
        tqrs, tirs = self.counts()
        if self.type == PacketType.EXT:
            assert self.ext is not None
            code = int(self.ext.code or 0)
            return f"ExtType {EXT_TITLES.get(code, f'Unknown(0x{code:02x})')}"
        if self.type == PacketType.UMQ:
            return f"QQRs {tqrs} QIRs {tirs}"
        if tqrs == 0 and tirs == 0:
            if self.type == PacketType.NORMAL:
                return "Unicast Resolver Keepalive"
            if self.type == PacketType.RCV_ALIVE:
                return "Receiver Alive"
            if self.type == PacketType.SRC_ALIVE:
                return "Source Alive"
        if self.type == PacketType.TOPIC_MGMT:
            return "Topic Management"
        return f"TQRs {tqrs} TIRs {tirs}"

    # -- comparison ---------------------------------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        counts = self.counts() if self.type != PacketType.EXT else None
        return (self.type, self.version, self.options_bit(), counts, self.tqrs, self.tirs,
                self.tmb, self.ext, self.resolved_options(), bytes(self.trailer))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LbmrPacket):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]


def _body_limit(buf: bytes) -> int:
    """The body view tshark uses: shortened by a trailing option-length option's total_len."""
    n = len(buf)
    if buf[0] & OPTS_FLAG and n > 4 and buf[n - 4] == 0x80 and buf[n - 3] == 4:
        total = int.from_bytes(buf[n - 2:n], "big")
        if n > total:
            return n - total
    return n


def parse_packet(payload: bytes | bytearray | memoryview) -> LbmrPacket:
    """Decode one LBMR datagram (a whole UDP payload).

    Raises :class:`WireError` (offsets from the start of ``payload``) for truncated or
    inconsistent input: what tshark reports as malformed or as an error (missing NULs, records
    running past the packet, zero-length options, wrong transport lengths, ...) plus the
    stricter cases the module docstring lists.  Anything it accepts re-encodes to the same
    bytes with :meth:`LbmrPacket.build`.
    """
    buf = bytes(payload)
    n = len(buf)
    if n < 1:
        raise WireError("lbmr.hdr", 0, "empty payload")
    ver_type = buf[0]
    ptype = ver_type & 0x07
    limit = _body_limit(buf)
    packet = LbmrPacket(type=PacketType(ptype) if ptype in PacketType._value2member_map_
                        else ptype, version=ver_type >> 4)
    if ptype == PacketType.EXT:
        if n < EXT_HEADER.size:
            raise WireError("lbmr.hdr", 0, f"truncated: {n} of 2 header bytes")
        packet.ext, pos = _decode_ext(buf, limit)
    else:
        if n < HEADER.size:
            raise WireError("lbmr.hdr", 0, f"truncated: {n} of 4 header bytes")
        _, tqrs, tirs = HEADER.unpack_from(buf, 0)
        pos = HEADER.size
        if ptype in (PacketType.NORMAL, PacketType.WC_TQR) and (tqrs or tirs):
            for _ in range(tqrs):
                if ptype == PacketType.WC_TQR:
                    if pos >= limit:
                        raise WireError("lbmr.tqr", pos, "truncated wildcard TQR")
                    end = _cstring_end(buf, pos + 1, limit, "lbmr.tqr", "pattern")
                    packet.tqrs.append(WcTqr.decode(buf, pos, end))
                else:
                    end = _cstring_end(buf, pos, limit, "lbmr.tqr", "topic name")
                    packet.tqrs.append(Tqr.decode(buf, pos, end))
                pos = end
            for _ in range(tirs):
                tir, pos = _decode_tir(buf, pos, limit)
                packet.tirs.append(tir)
        elif ptype == PacketType.UMQ:
            for _ in range(tqrs):
                end = _cstring_end(buf, pos, limit, "lbmr.qqr", "queue name")
                packet.tqrs.append(Qqr.decode(buf, pos, end))
                pos = end
            for _ in range(tirs):
                qir, pos = _decode_qir(buf, pos, limit)
                packet.tirs.append(qir)
        elif ptype == PacketType.TOPIC_MGMT:
            packet.tmb, pos = _decode_tmb(buf, pos, limit)
        else:  # no body: keep the header counts as they are
            packet.tqr_count, packet.tir_count = (tqrs or None), (tirs or None)
        if packet.tqr_count is None and len(packet.tqrs) != tqrs:
            packet.tqr_count = tqrs
        if packet.tir_count is None and len(packet.tirs) != tirs:
            packet.tir_count = tirs
    if ver_type & OPTS_FLAG:
        packet.options = _decode_options(buf, pos, n)
        if not packet.options:
            packet.opts_flag = True
    else:
        packet.trailer = buf[pos:]
    return packet


def record_classes() -> list[type[Record]]:
    """Every record class defined here (for round-trip tests over all structs)."""
    seen: dict[int, type[Record]] = {}
    candidates: list[type[Record]] = [
        Tqr, WcTqr, Qqr, Tir, Qir, QirGroup, QirQueue, Tmb, Tmr, OpaqueTransport,
        ToptUnknown, OptUnknown, PserOptLen, PserCtxinst, PserOptUnknown, ExtUnknown,
        *TOPIC_OPTIONS.values(), *TRANSPORTS.values(), *PACKET_OPTIONS.values(),
        *EXT_RECORDS.values(),
    ]
    for cls in candidates:
        seen.setdefault(id(cls), cls)
    return list(seen.values())
