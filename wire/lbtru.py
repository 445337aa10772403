"""LBT-RU: UM's reliable unicast transport over UDP (``packet-lbtru.c``, tshark 4.0.x).

Layouts follow ``shared/spec/wire-transports.md`` section 1.  Each packet type is one Construct
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

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

import construct as cs

from .errors import WireError
from .fastpath import FastLayout, derive
from .fields import (
    U8,
    U16,
    U32,
    Auto,
    Bit,
    bit_views,
    export_struct,
    field,
    fixed_format,
    members,
    value_kind,
)
from .lbmc import LbmcMessage, parse_message

# =============================================================================================
# Generic machinery shared with wire/lbtrm.py: a struct-backed record, options, packets, codec.
# =============================================================================================


class CountOf:
    """Construct count of an array: the wire count when parsing, the list length when building.

    Building from the list (not from the count member) lets a caller pass a wrong count on
    purpose.  ``member`` names the count member so decoders can point errors at it.
    """

    def __init__(self, member: str, items: str) -> None:
        self.member = member
        self.items = items

    def __call__(self, ctx: Any) -> int:
        if ctx.get("_parsing", True):
            return int(ctx[self.member])
        return len(ctx[self.items])


class RestOf:
    """Construct length of a trailing byte string: ``ctx[member] - fixed`` (``hdr_len`` - layout).

    ``member`` and ``fixed`` are kept so decoders can explain a too-short length.
    """

    def __init__(self, member: str, fixed: int) -> None:
        self.member = member
        self.fixed = fixed

    def __call__(self, ctx: Any) -> int:
        return int(ctx[self.member]) - self.fixed


def never(raw: int) -> bool:
    """``Bit.when`` for bits tshark does not display (kept as named views for Python callers)."""
    return False


class Record:
    """The values of one Construct struct as an object: members and bit views as attributes.

    Subclasses set ``struct`` (the definition) and ``prefix`` (tshark prefix of the relative
    field names, also the ``WireError`` header).  Everything else (fast layout, defaults, bit
    views, which members are computed or variable) is read off the struct once per class.
    Arrays of one-member structs (NAK/NCF lists) are held as plain lists of ints; the
    constructor also accepts Construct's element form (``[{"nak": 5}]``).

    Build one with keyword arguments naming members or bit views (``LbtruData(sqn=5, rx=1)``);
    members left out take neutral defaults (0, empty) and computed members (``Auto``: counts,
    lengths) and ``next_hdr`` are filled in when building unless given explicitly.
    """

    struct: ClassVar[cs.Struct]
    prefix: ClassVar[str]
    fast: ClassVar[FastLayout]
    _defaults: ClassVar[dict[str, Any]]
    _views: ClassVar[dict[str, tuple[str, Bit]]]
    _auto: ClassVar[tuple[cs.Renamed, ...]]
    _rest: ClassVar[tuple[cs.Renamed, ...]]
    _offsets: ClassVar[dict[str, int]]
    _scalar_lists: ClassVar[dict[str, tuple[str, FastLayout]]]
    _plain: ClassVar[frozenset[str]] = frozenset()

    __slots__ = ("values",)
    values: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "struct" in cls.__dict__:
            cls._prepare()
        plain: set[str] = set()
        for klass in cls.__mro__:
            plain.update(getattr(klass, "__slots__", ()))
        cls._plain = frozenset(plain)

    @classmethod
    def _prepare(cls) -> None:
        cls.fast = derive(cls.struct)
        defaults: dict[str, Any] = {}
        views: dict[str, tuple[str, Bit]] = {}
        offsets: dict[str, int] = {}
        scalar_lists: dict[str, tuple[str, FastLayout]] = {}
        offset = 0
        for member in members(cls.struct):
            defaults[member.name] = _default_for(member)
            for view, bit in bit_views(member).items():
                views.setdefault(view, (member.name, bit))
            letter = fixed_format(member)
            offsets[member.name] = offset
            if letter is not None:
                offset += struct.calcsize(">" + letter)
            inner = member.subcon
            if isinstance(inner, cs.Array):
                element = list(members(inner.subcon))
                if len(element) == 1:
                    scalar_lists[member.name] = (element[0].name, derive(inner.subcon))
        rest = tuple(m for m in members(cls.struct) if m.name not in cls.fast.names)
        for member in rest:
            inner = member.subcon
            length = inner.count if isinstance(inner, cs.Array) else getattr(inner, "length", None)
            if not isinstance(length, CountOf | RestOf):
                raise TypeError(f"{cls.__name__}.{member.name}: variable members must be sized "
                                "by CountOf or RestOf")
            if isinstance(inner, cs.Array) and member.name not in scalar_lists:
                raise TypeError(f"{cls.__name__}.{member.name}: arrays must hold one-member "
                                "structs")
        cls._defaults = defaults
        cls._views = views
        cls._offsets = offsets
        cls._scalar_lists = scalar_lists
        cls._auto = tuple(m for m in members(cls.struct) if isinstance(m.subcon, Auto))
        cls._rest = rest

    def __init__(self, **kwargs: Any) -> None:
        values = dict(self._defaults)
        views: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in self._scalar_lists:
                element = self._scalar_lists[key][0]
                values[key] = [v[element] if isinstance(v, Mapping) else v for v in value]
            elif key in values:
                values[key] = value
            elif key in self._views:
                views[key] = value
            else:
                raise TypeError(f"{type(self).__name__} has no field {key!r}")
        for key, value in views.items():
            member, bit = self._views[key]
            values[member] = bit.put(int(values[member]), int(value))
        object.__setattr__(self, "values", values)

    @classmethod
    def _raw(cls, values: dict[str, Any]) -> Record:
        """An instance around decoded values, bypassing ``__init__`` (the parse hot path)."""
        obj = cls.__new__(cls)
        object.__setattr__(obj, "values", values)
        return obj

    def __getattr__(self, name: str) -> Any:
        try:
            values = object.__getattribute__(self, "values")
        except AttributeError:
            raise AttributeError(name) from None
        if name in values:
            return values[name]
        if name.startswith("_"):
            raise AttributeError(name)
        view = self._views.get(name)
        if view is not None:
            return view[1].get(int(values[view[0]]))
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._plain:
            object.__setattr__(self, name, value)
            return
        if name in self.values:
            self.values[name] = value
            return
        view = self._views.get(name)
        if view is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        self.values[view[0]] = view[1].put(int(self.values[view[0]]), int(value))

    def resolved(self) -> dict[str, Any]:
        """Member values with computed counts/lengths filled in (``next_hdr`` as given)."""
        out = dict(self.values)
        ctx = cs.Container(out)
        ctx["_parsing"] = False
        for member in self._auto:
            if out.get(member.name) is None:
                out[member.name] = member.subcon.compute(ctx)
                ctx[member.name] = out[member.name]
        return out

    @classmethod
    def struct_values(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Values in Construct's own form (list elements as one-member dicts)."""
        out = dict(values)
        for name, (element, _) in cls._scalar_lists.items():
            out[name] = [{element: v} for v in out.get(name) or []]
        return out

    @classmethod
    def encode_values(cls, values: Mapping[str, Any], at: int = 0) -> bytes:
        """Bytes of fully resolved values through the derived layouts (``at``: for errors)."""
        try:
            out = bytearray(cls.fast.pack(values))
            for member in cls._rest:
                value = values[member.name]
                listed = cls._scalar_lists.get(member.name)
                if listed is not None:
                    codec = listed[1].codec
                    out += b"".join(codec.pack(int(v)) for v in value)
                else:
                    out += bytes(value)
        except (struct.error, TypeError, ValueError, KeyError) as exc:
            raise WireError(cls.prefix, at, f"cannot encode: {exc}") from None
        return bytes(out)

    @classmethod
    def decode_values(cls, buf: bytes | memoryview, pos: int, end: int
                      ) -> tuple[dict[str, Any], int]:
        """Values of the struct at ``buf[pos:end]`` and the bytes used.  Offsets in errors are
        positions in ``buf`` (the UDP payload)."""
        size = cls.fast.size
        if end - pos < size:
            raise WireError(cls.prefix, pos,
                            f"{end - pos} bytes left but the fixed layout needs {size}")
        values = cls.fast.decode(buf, pos)
        cur = pos + size
        for member in cls._rest:
            inner = member.subcon
            if isinstance(inner, cs.Array):
                count: CountOf = inner.count
                n = int(values[count.member])
                element = cls._scalar_lists[member.name][1]
                need = n * element.size
                if need > end - cur:
                    raise WireError(cls.prefix, pos + cls._offsets[count.member],
                                    f"{count.member} {n} needs {need} bytes of list but only "
                                    f"{end - cur} remain in the datagram")
                values[member.name] = [t[0] for t in element.codec.iter_unpack(buf[cur:cur + need])]
                cur += need
            else:
                rest: RestOf = inner.length
                declared = int(values[rest.member])
                n = declared - rest.fixed
                where = pos + cls._offsets[rest.member]
                if n < 0:
                    raise WireError(cls.prefix, where, f"{rest.member} {declared} is shorter "
                                    f"than the {rest.fixed}-byte layout")
                if n > end - cur:
                    raise WireError(cls.prefix, where, f"{rest.member} {declared} runs past the "
                                    f"end of the datagram ({end - pos} bytes left)")
                values[member.name] = bytes(buf[cur:cur + n])
                cur += n
        return values, cur - pos

    def _export(self, values: Mapping[str, Any]) -> list[tuple[str, Any]]:
        return export_struct(self.prefix, self.struct, self.struct_values(values))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.values.items()
                          if v is not None and v != self._defaults.get(k))
        return f"{type(self).__name__}({shown})"

    __hash__ = None  # type: ignore[assignment]


def _default_for(member: cs.Construct) -> Any:
    inner = member.subcon
    if isinstance(inner, Auto) or member.name == "next_hdr":
        return None
    if isinstance(inner, cs.Array):
        return []
    if value_kind(member) == "int":
        return 0
    return b""


class TransportOption(Record):
    """One option of a transport header chain (``next_hdr``, ``hdr_len``, ...).

    ``code`` is the value the predecessor's ``next_hdr`` carries to announce this option.
    """

    code: int
    __slots__ = ()

    @classmethod
    def from_wire(cls, code: int, values: dict[str, Any]) -> TransportOption:
        """An option around decoded values (``code`` matters to classes without a fixed one)."""
        obj = cls._raw(values)
        assert isinstance(obj, TransportOption)
        return obj

    def encode(self, next_hdr: int, at: int = 0) -> bytes:
        values = self.resolved()
        if values.get("next_hdr") is None:
            values["next_hdr"] = next_hdr
        return self.encode_values(values, at)

    def chained(self, next_hdr: int) -> dict[str, Any]:
        values = self.resolved()
        if values.get("next_hdr") is None:
            values["next_hdr"] = next_hdr
        return values

    def tshark_fields(self, next_hdr: int) -> list[tuple[str, Any]]:
        """The option as tshark shows it; ``next_hdr`` fills the chain link if not set."""
        return self._export(self.chained(next_hdr))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransportOption):
            return NotImplemented
        mine, theirs = self.resolved(), other.resolved()
        mine.pop("next_hdr", None), theirs.pop("next_hdr", None)
        return (type(self), self.code, mine) == (type(other), other.code, theirs)


class TransportPacket(Record):
    """One datagram of a transport: header values, options, LBMC payload, ignored trailer.

    Attributes (besides the struct members and bit views):
        options: options in wire order; the chain of ``next_hdr`` values is computed from it.
        payload: for DATA the LBMC messages (or raw bytes, to craft anything); empty otherwise.
        trailer: bytes tshark ignores (see the module docstring); kept for byte-exact trips.
    """

    protocol: ClassVar[str]
    type_code: ClassVar[int]
    carries_lbmc: ClassVar[bool] = False
    options_tshark: ClassVar[bool] = True

    __slots__ = ("options", "payload", "trailer")
    options: list[TransportOption]
    payload: list[LbmcMessage] | bytes
    trailer: bytes

    @classmethod
    def _prepare(cls) -> None:
        super()._prepare()
        if "ver_type" in cls._defaults:
            cls._defaults["ver_type"] = cls.type_code

    def __init__(self, *, options: Iterable[TransportOption] = (),
                 payload: Sequence[LbmcMessage] | bytes = (), trailer: bytes = b"",
                 **fields: Any) -> None:
        super().__init__(**fields)
        self.options = list(options)
        if isinstance(payload, bytes | bytearray):
            self.payload = bytes(payload) if payload else []
        else:
            self.payload = list(payload)
        self.trailer = bytes(trailer)

    @classmethod
    def _from_wire(cls, values: dict[str, Any]) -> TransportPacket:
        obj = cls._raw(values)
        assert isinstance(obj, TransportPacket)
        obj.options, obj.payload, obj.trailer = [], [], b""
        return obj

    def chain(self) -> list[int]:
        """The option codes in wire order followed by the 0x00 terminator."""
        return [o.code for o in self.options] + [0]

    def header_values(self) -> dict[str, Any]:
        """Resolved struct values with ``next_hdr`` computed from the options unless given."""
        values = self.resolved()
        if values.get("next_hdr") is None:
            values["next_hdr"] = self.chain()[0]
        return values

    def build(self) -> bytes:
        """The datagram (UDP payload).  Raises :class:`WireError` for unencodable values."""
        if self.payload and not self.carries_lbmc:
            raise WireError(self.prefix, 0, "only DATA carries an LBMC payload; use trailer")
        out = bytearray(self.encode_values(self.header_values()))
        codes = self.chain()
        for i, option in enumerate(self.options):
            out += option.encode(codes[i + 1], len(out))
        if isinstance(self.payload, bytes):
            out += self.payload
        else:
            for message in self.payload:
                try:
                    out += message.build()
                except WireError as exc:
                    raise exc.shifted(len(out), self.protocol) from None
        out += self.trailer
        return bytes(out)

    def messages(self) -> list[LbmcMessage]:
        """The LBMC messages of the payload (empty when the payload is raw bytes)."""
        return [] if isinstance(self.payload, bytes) else list(self.payload)

    def tshark_fields(self) -> list[tuple[str, Any]]:
        """The transport occurrence as tshark ``-T json`` shows it: (display-filter name, value)
        in wire order.  LBMC messages are separate occurrences: :meth:`lbmc_tshark_fields`."""
        out = self._export(self.header_values())
        if self.options_tshark:
            codes = self.chain()
            for i, option in enumerate(self.options):
                out += option.tshark_fields(codes[i + 1])
        return out

    def lbmc_tshark_fields(self) -> list[list[tuple[str, Any]]]:
        """One field list per LBMC message, matching tshark's ``lbmc`` occurrences."""
        return [m.tshark_fields() for m in self.messages()]

    def expert_items(self) -> list[tuple[str, str]]:
        """(severity, message) that ``tshark -z expert`` reports for this datagram with default
        preferences (severities as :func:`wire.tshark.expert_summary` names them)."""
        return []

    def info(self) -> str:
        """tshark's Info column text of the transport header (LBMC labels not included)."""
        return ""

    def _key(self) -> tuple[Any, ...]:
        codes = self.chain()
        opts = [(o.code, type(o), o.chained(codes[i + 1])) for i, o in enumerate(self.options)]
        return (type(self), self.header_values(), opts, self.payload, self.trailer)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransportPacket):
            return NotImplemented
        return self._key() == other._key()

    def __repr__(self) -> str:
        base = super().__repr__()[:-1]
        extra = []
        if self.options:
            extra.append(f"options={self.options!r}")
        if self.payload:
            extra.append(f"payload={self.payload!r}")
        if self.trailer:
            extra.append(f"trailer={self.trailer!r}")
        sep = ", " if extra and not base.endswith("(") else ""
        return base + sep + ", ".join(extra) + ")"


@dataclass(frozen=True)
class TransportCodec:
    """Parsing rules of one transport: its packet classes and option classes by code.

    Attributes:
        protocol: tshark protocol name (``lbtru``), the header of datagram-level errors.
        header_size: bytes of the common header every datagram must have.
        packets: type nibble -> packet class.
        options: option code -> option class.
        unknown_option: the class of codes not in ``options``, or None to reject them.
    """

    protocol: str
    header_size: int
    packets: Mapping[int, type[TransportPacket]]
    options: Mapping[int, type[TransportOption]]
    unknown_option: type[TransportOption] | None

    def parse(self, buf: bytes | bytearray | memoryview, decode_lbmc: bool = True
              ) -> TransportPacket:
        view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        end = len(view)
        if end < self.header_size:
            raise WireError(self.protocol, 0, f"{end} bytes; the common header needs "
                            f"{self.header_size}")
        ptype = view[0] & 0x0F
        cls = self.packets.get(ptype)
        if cls is None:
            raise WireError(self.protocol, 0, f"unrecognized packet type 0x{ptype:02x}")
        values, pos = cls.decode_values(view, 0, end)
        packet = cls._from_wire(values)
        pos = self._parse_options(packet, view, pos, end)
        if cls.carries_lbmc:
            if decode_lbmc:
                packet.payload, packet.trailer = self._parse_lbmc(view, pos, end)
            else:
                packet.payload = bytes(view[pos:end]) or []
        else:
            packet.trailer = bytes(view[pos:end])
        return packet

    def _parse_options(self, packet: TransportPacket, view: bytes | memoryview, pos: int,
                       end: int) -> int:
        code = packet.values["next_hdr"]
        while code != 0:
            ocls = self.options.get(code, self.unknown_option)
            if ocls is None:
                raise WireError(self.protocol, pos, f"unknown option code 0x{code:02x}")
            header = ocls.prefix
            if end - pos < 2:
                raise WireError(header, pos, f"the datagram ends ({end - pos} bytes left) "
                                "where an option should start")
            hdr_len = view[pos + 1]
            if hdr_len == 0:
                raise WireError(header, pos + 1, "hdr_len is zero")
            values, used = ocls.decode_values(view, pos, end)
            packet.options.append(ocls.from_wire(code, values))
            code = values["next_hdr"]
            pos += used
        return pos

    def _parse_lbmc(self, view: bytes | memoryview, pos: int, end: int
                    ) -> tuple[list[LbmcMessage], bytes]:
        region = bytes(view[pos:end])
        messages: list[LbmcMessage] = []
        cur = 0
        while len(region) - cur >= 4:
            try:
                message, used = parse_message(region, cur)
            except WireError as exc:
                raise exc.shifted(pos + cur, self.protocol) from None
            messages.append(message)
            cur += used
        return messages, region[cur:]


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


class UnknownOption(LbtruOption):
    """An option code tshark does not know, carried opaquely: ``UnknownOption(9, data=b"..")``.

    ``data`` is everything after the 4-byte basic option header.
    """

    struct = UnknownOpt
    prefix = "lbtru.opt_unknown"
    __slots__ = ("code",)

    def __init__(self, code: int, **fields: Any) -> None:
        if not 0 < code <= 0xFF:
            raise ValueError(f"option code {code} must be 1-255 (0 ends the chain)")
        super().__init__(**fields)
        self.code = code

    @classmethod
    def from_wire(cls, code: int, values: dict[str, Any]) -> TransportOption:
        obj = cls._raw(values)
        assert isinstance(obj, UnknownOption)
        obj.code = code
        return obj


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

HEADER_SIZE = 4
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
