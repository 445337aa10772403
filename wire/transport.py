"""Machinery shared by the UDP transports (LBT-RU, LBT-RM): struct-backed records, options,
packets and a codec that walks header, type body, option chain and LBMC payload.

Each transport module declares its layouts as Construct structs and subclasses these classes;
nothing here names a field of either transport.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import construct as cs

from .errors import WireError
from .fastpath import FastLayout, derive
from .fields import fixed_format, forget_computed, members
from .lbmc import LbmcMessage, parse_message
from .records import StructRecord


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


class Record(StructRecord):
    """The values of one Construct struct as an object: members and bit views as attributes.

    Subclasses set ``struct`` (the definition) and ``prefix`` (tshark prefix of the relative
    field names, also the ``WireError`` header).  Everything else (fast layout, defaults, bit
    views, which members are computed or variable) is read off the struct once per class.
    Arrays of one-member structs (NAK/NCF lists) are held as plain lists of ints; the
    constructor also accepts Construct's element form (``[{"nak": 5}]``).

    Build one with keyword arguments naming members or bit views (``LbtruData(sqn=5, rx=1)``);
    members left out take neutral defaults (0, empty) and computed members (``Auto``: counts,
    lengths) and ``next_hdr`` are filled in when building unless given explicitly.

    The record machinery is :class:`~wire.records.StructRecord`'s; this class adds the
    derived fast layouts and the codec of the variable members, and ``repr`` leaves out
    members at their defaults.  Transport records are mutable and not hashable.
    """

    struct: ClassVar[cs.Struct]
    prefix: ClassVar[str]
    fast: ClassVar[FastLayout]
    _rest: ClassVar[tuple[cs.Renamed, ...]]
    _offsets: ClassVar[dict[str, int]]
    _scalar_lists: ClassVar[dict[str, tuple[str, FastLayout]]]

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "struct" in cls.__dict__:
            cls._prepare()

    @classmethod
    def _declared_struct(cls) -> cs.Struct | None:
        return cls.__dict__.get("struct")

    @classmethod
    def _field_prefix(cls) -> str:
        return cls.prefix

    @classmethod
    def _prepare(cls) -> None:
        """Derive the fast layout and the codec tables of the variable members."""
        cls.fast = derive(cls.struct)
        offsets: dict[str, int] = {}
        scalar_lists: dict[str, tuple[str, FastLayout]] = {}
        offset = 0
        for member in members(cls.struct):
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
        cls._offsets = offsets
        cls._scalar_lists = scalar_lists
        cls._rest = rest

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, (element, _) in self._scalar_lists.items():
            if name in kwargs:
                self.values[name] = [v[element] if isinstance(v, Mapping) else v
                                     for v in kwargs[name]]

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
        return super()._export(self.struct_values(values))

    def _shown(self, name: str, value: Any) -> bool:
        return bool(value != self._defaults.get(name))

    __hash__ = None  # type: ignore[assignment]


class TransportOption(Record):
    """One option of a transport header chain (``next_hdr``, ``hdr_len``, ...).

    ``code`` is the value the predecessor's ``next_hdr`` carries to announce this option.
    """

    code: int
    __slots__ = ()

    @classmethod
    def from_wire(cls, code: int, values: dict[str, Any]) -> TransportOption:
        """An option around decoded values (``code`` matters to classes without a fixed one)."""
        return cls._raw(values)

    def encode(self, next_hdr: int, at: int = 0) -> bytes:
        return self.encode_values(self._linked(next_hdr), at)

    def chained(self, next_hdr: int) -> dict[str, Any]:
        """Resolved values with ``next_hdr`` filled in unless set explicitly."""
        return self._linked(next_hdr)

    def tshark_fields(self, next_hdr: int) -> list[tuple[str, Any]]:
        """The option as tshark shows it; ``next_hdr`` fills the chain link if not set."""
        return self._export(self._linked(next_hdr))

    def _same_kind(self, other: StructRecord) -> bool:
        return isinstance(other, TransportOption)

    def _key(self) -> tuple[Any, ...]:
        # the chain link depends on the option's place in the packet, not on the option
        values = self.resolved()
        values.pop("next_hdr", None)
        return (type(self), self.code, values)


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
    def _default(cls, member: cs.Construct) -> Any:
        """``ver_type`` defaults to the class's type (version 0)."""
        return cls.type_code if member.name == "ver_type" else super()._default(member)

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
        obj.options, obj.payload, obj.trailer = [], [], b""
        return obj

    def chain(self) -> list[int]:
        """The option codes in wire order followed by the 0x00 terminator."""
        return [o.code for o in self.options] + [0]

    def resolved(self) -> dict[str, Any]:
        """Member values as built: counts, lengths and ``next_hdr`` (from the options)."""
        values = super().resolved()
        if values.get("next_hdr") is None:
            values["next_hdr"] = self.chain()[0]
        return values

    def header_values(self) -> dict[str, Any]:
        """Resolved struct values with ``next_hdr`` computed from the options unless given."""
        return self.resolved()

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

    def _same_kind(self, other: StructRecord) -> bool:
        return isinstance(other, TransportPacket)

    def _repr_extras(self) -> list[str]:
        extra = []
        if self.options:
            extra.append(f"options={self.options!r}")
        if self.payload:
            extra.append(f"payload={self.payload!r}")
        if self.trailer:
            extra.append(f"trailer={self.trailer!r}")
        return extra


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
        # Lengths, counts and chain links that equal what building computes are forgotten, so
        # an edited packet rebuilds consistently; crafted values differ and are kept.
        forget_computed(cls.struct, packet.values)
        codes = packet.chain()
        if packet.values.get("next_hdr") == codes[0]:
            packet.values["next_hdr"] = None
        for option, code in zip(packet.options, codes[1:], strict=True):
            forget_computed(option.struct, option.values)
            if option.values.get("next_hdr") == code:
                option.values["next_hdr"] = None
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




class CodedOption(TransportOption):
    """An option carried opaquely under an explicit code: ``Option(code, data=b"...")``.

    ``data`` is everything after the 4-byte basic option header.
    """

    __slots__ = ("code",)

    def __init__(self, code: int, **fields: Any) -> None:
        if not 0 < code <= 0xFF:
            raise ValueError(f"option code {code} must be 1-255 (0 ends the chain)")
        super().__init__(**fields)
        self.code = code

    @classmethod
    def from_wire(cls, code: int, values: dict[str, Any]) -> TransportOption:
        obj = cls._raw(values)
        obj.code = code
        return obj
