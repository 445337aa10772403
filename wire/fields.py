"""Building blocks shared by every Construct definition in :mod:`wire`.

The Construct structs are the single written form of every layout.  Everything else (the
``struct`` fast path, numpy dtypes, Scapy fields, tshark field names, Hypothesis strategies) is
*read off* those structs.  To make that possible without a second table, the few facts that
Construct cannot express itself are attached to the struct members as attributes:

* ``ump_tshark``: the tshark display-filter name of the member, relative to the header's
  prefix (``"trail"`` for ``lbtru.data.trail``), or ``None`` when tshark shows no such field;
* ``ump_bits``: named bit views of an integer member (flags words, packed bytes).

:func:`field` is the only way the definitions attach them.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import construct as cs

U8 = cs.Int8ub
U16 = cs.Int16ub
U32 = cs.Int32ub
U64 = cs.Int64ub
I32 = cs.Int32sb
I64 = cs.Int64sb

_DEFAULT = object()


@dataclass(frozen=True)
class Bit:
    """A named view of some bits of an integer member.

    Attributes:
        mask: the bits this view covers; the view's value is ``(raw & mask) >> lowest_bit``.
        tshark: the tshark field name relative to the header prefix. ``None`` means
            ``"<member>.<view>"``, tshark's usual naming for flag bits.
        when: tshark shows the view only when this predicate of the raw member value holds
            (``ume_preg_resp``'s N/W/D bits exist only when E is clear).  ``None``: always.
    """

    mask: int
    tshark: str | None = None
    when: Callable[[int], bool] | None = None

    @property
    def shift(self) -> int:
        return (self.mask & -self.mask).bit_length() - 1

    def get(self, raw: int) -> int:
        return (raw & self.mask) >> self.shift

    def put(self, raw: int, value: int) -> int:
        limit = self.mask >> self.shift
        if not 0 <= int(value) <= limit:
            raise ValueError(f"value {value} does not fit mask {self.mask:#x}")
        return (raw & ~self.mask) | (int(value) << self.shift)


def field(
    name: str,
    subcon: cs.Construct,
    *,
    tshark: str | object | None = _DEFAULT,
    bits: Mapping[str, int | Bit] | None = None,
) -> cs.Renamed:
    """A named struct member, with the tshark name and bit views Construct cannot carry.

    ``tshark`` defaults to the member's own name; pass ``None`` for members tshark never shows
    (padding we keep only for byte-exact round trips).
    """
    member = name / subcon
    member.ump_tshark = name if tshark is _DEFAULT else tshark
    member.ump_bits = {
        k: (v if isinstance(v, Bit) else Bit(v)) for k, v in (bits or {}).items()
    }
    return member


def tshark_name(member: cs.Construct) -> str | None:
    """The tshark suffix of a struct member (see :func:`field`)."""
    return getattr(member, "ump_tshark", getattr(member, "name", None))


def bit_views(member: cs.Construct) -> Mapping[str, Bit]:
    return getattr(member, "ump_bits", {})


class IPv4Adapter(cs.Adapter):
    """An IPv4 address on the wire as a big-endian u32; in Python a dotted string.

    Building also accepts an int or an :class:`ipaddress.IPv4Address`, so callers may pass
    whatever they hold.
    """

    def _decode(self, obj: int, context: Any, path: str) -> str:
        return str(ipaddress.IPv4Address(obj))

    def _encode(self, obj: Any, context: Any, path: str) -> int:
        return ipv4_to_int(obj)


def ipv4_to_int(value: Any) -> int:
    """An IPv4 address as u32, strictly: four decimal octets, no leading zeros (``010.0.0.1``
    is refused rather than read as octal as ``inet_aton`` would)."""
    if isinstance(value, int):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"IPv4 value {value} out of range")
        return value
    if isinstance(value, str):
        parts = value.split(".")
        if len(parts) == 4 and all(p.isdigit() and p.isascii() and (p == "0" or p[0] != "0")
                                   and len(p) <= 3 and int(p) <= 255 for p in parts):
            a, b, c, d = (int(p) for p in parts)
            return (a << 24) | (b << 16) | (c << 8) | d
        raise ValueError(f"{value!r} is not a dotted-quad IPv4 address")
    return int(ipaddress.IPv4Address(value))


def int_to_ipv4(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


IPv4 = IPv4Adapter(U32)


class Auto(cs.Subconstruct):
    """A member whose value is computed when building unless the caller supplies one.

    This is how lengths and counts (``hdr_len``, ``msglen``, ``num_naks``) are written: a normal
    build computes them from the rest of the struct, while a conformance case that wants a
    wrong length simply passes it.  Parsing returns the wire value unchanged.
    """

    def __init__(self, subcon: cs.Construct, compute: Callable[[Any], int]) -> None:
        super().__init__(subcon)
        self.compute = compute
        self.flagbuildnone = True

    def _parse(self, stream: Any, context: Any, path: str) -> Any:
        return self.subcon._parsereport(stream, context, path)

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        value = self.compute(context) if obj is None else obj
        return self.subcon._build(value, stream, context, path)

    def _sizeof(self, context: Any, path: str) -> int:
        return self.subcon._sizeof(context, path)


@functools.cache
def _computed_plan(struct_def: cs.Struct) -> tuple[tuple[tuple[str, Auto], ...],
                                                   tuple[tuple[str, cs.Struct], ...]]:
    """The ``Auto`` members and the arrays of sub-structs of a struct, read once per struct
    (parsing calls :func:`forget_computed` for every record, so this is on the hot path)."""
    autos = tuple((m.name, m.subcon) for m in members(struct_def) if isinstance(m.subcon, Auto))
    arrays = tuple((m.name, m.subcon.subcon) for m in members(struct_def)
                   if isinstance(m.subcon, cs.Array) and isinstance(m.subcon.subcon, cs.Struct))
    return autos, arrays


def resolve_computed(struct_def: cs.Struct, values: Mapping[str, Any],
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``values`` with every ``Auto`` member left ``None`` computed as building would do,
    arrays of sub-structs included.  ``extra`` adds context the formulas may read."""
    autos, arrays = _computed_plan(struct_def)
    out = dict(values)
    for name, element in arrays:
        out[name] = [resolve_computed(element, item) if isinstance(item, Mapping) else item
                     for item in out.get(name) or []]
    if not any(out.get(name) is None for name, _ in autos):
        return out
    ctx = cs.Container({**out, **(extra or {})})
    ctx["_parsing"] = False  # counts read the lists, not the count members
    for name, auto in autos:
        if out.get(name) is None:
            out[name] = ctx[name] = auto.compute(ctx)
    return out


def forget_computed(struct_def: cs.Struct, values: dict[str, Any],
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Clear, after parsing, every ``Auto`` member whose wire value is what building computes.

    A parsed record then behaves like one built by hand: edit its content and the lengths and
    counts follow on the next build.  A wire value that differs from the computed one (a
    crafted or broken length) is kept, so such input still round-trips byte for byte.
    Arrays of sub-structs are handled element by element.
    """
    autos, arrays = _computed_plan(struct_def)
    for name, element in arrays:
        for item in values.get(name) or []:
            if isinstance(item, dict):
                forget_computed(element, item)
    if not autos:
        return values
    trial = dict(values)
    for name, _ in autos:
        trial[name] = None
    try:
        computed = resolve_computed(struct_def, trial, extra)
    except (KeyError, TypeError, ValueError, AttributeError):
        return values
    for name, _ in autos:
        if values.get(name) == computed[name]:
            values[name] = None
    return values


TEXT_ENCODING = "utf-8"
TEXT_ERRORS = "surrogateescape"
"""How every text member (topic, store and queue names) maps between wire bytes and ``str``.

Names are bytes on the wire; UM applications write them in UTF-8 (``prix/€/日本``), so that is
how they read as ``str``.  Bytes that are not UTF-8 still parse: ``surrogateescape`` turns each
into a lone surrogate (``b"\\xff"`` -> ``"\\udcff"``) and back, so any byte string
round-trips exactly.  (Until issue 22 the mapping was Latin-1, one character per byte.)
tshark shows these fields as ASCII: see :func:`wire.tshark.tshark_text`."""


def text_bytes(value: str | bytes) -> bytes:
    """The wire bytes of a text member's value (bytes pass through unchanged)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return value.encode(TEXT_ENCODING, TEXT_ERRORS)


def bytes_text(raw: bytes | bytearray | memoryview) -> str:
    """A text member's value read from its wire bytes (never fails, see :data:`TEXT_ERRORS`)."""
    return bytes(raw).decode(TEXT_ENCODING, TEXT_ERRORS)


def text_size(value: str | bytes) -> int:
    """Wire length of a text member's value: what a length field must count (``"€"`` is 3)."""
    return len(text_bytes(value))


class TextAdapter(cs.Adapter):
    """Names (topics, store names) as ``str`` through :func:`text_bytes`/:func:`bytes_text`."""

    def _decode(self, obj: bytes, context: Any, path: str) -> str:
        return bytes_text(obj)

    def _encode(self, obj: str | bytes, context: Any, path: str) -> bytes:
        return text_bytes(obj)


def text(length: Any) -> cs.Construct:
    """A string of ``length`` bytes (a Construct expression), NULs kept for round trips.

    A length computed on build must count :func:`text_size`, not ``len()`` of the ``str``."""
    return TextAdapter(cs.Bytes(length))


class CStringAdapter(TextAdapter):
    """A NUL-terminated name (LBMR topic, pattern, queue; an LBMC configuration option), text
    as :data:`TEXT_ENCODING` says.  The NUL is not part of the value.

    Building refuses a value that contains a NUL, because it would end the name early on the
    wire and the packet could not round-trip.
    """

    def _encode(self, obj: str | bytes, context: Any, path: str) -> bytes:
        data = super()._encode(obj, context, path)
        if b"\0" in data:
            raise ValueError(f"name {obj!r} contains a NUL byte")
        return data


def cstring() -> cs.Construct:
    """A NUL-terminated name (see :class:`CStringAdapter`)."""
    return CStringAdapter(cs.NullTerminated(cs.GreedyBytes))


# --- introspection ---------------------------------------------------------------------------


def unwrap(subcon: cs.Construct) -> cs.Construct:
    """Strip Renamed/Adapter/Auto wrappers down to the construct that touches bytes."""
    while isinstance(subcon, cs.Subconstruct) and not isinstance(subcon, cs.Array):
        subcon = subcon.subcon
    return subcon


def fixed_format(subcon: cs.Construct) -> str | None:
    """The ``struct`` format letter(s) of a fixed-size member, or ``None`` if it is variable."""
    if is_zero_padding(subcon):
        return f"{subcon.length}x"  # Padding(n): n zero bytes with no value
    inner = unwrap(subcon)
    if isinstance(inner, cs.FormatField):
        return str(inner.fmtstr[1:])
    if isinstance(inner, cs.Bytes) and isinstance(inner.length, int):
        return f"{inner.length}s"
    return None


def length_prefixed(first: str, length: str, *body: cs.Construct) -> cs.Struct:
    """The UM record shape: a code byte, a length byte counting the whole record, a fixed
    body, then whatever a longer length adds (kept as ``trailing``; tshark skips it).

    LBMC extended headers (``next_hdr``, ``hdr_len``) and LBMR topic options (``type``,
    ``len``) are both written with it.
    """
    size = 2 + fixed_size(body)
    return cs.Struct(
        field(first, cs.Int8ub),
        field(length, Auto(cs.Int8ub, lambda ctx: size + len(ctx.get("trailing") or b""))),
        *body,
        field("trailing", cs.Bytes(getattr(cs.this, length) - size), tshark=None),
    )


def is_zero_padding(subcon: cs.Construct) -> bool:
    """An unnamed ``Padding(n)`` of zero bytes: the only valueless member a fast layout takes."""
    return (isinstance(subcon, cs.Padded) and subcon.subcon is cs.Pass
            and isinstance(subcon.length, int) and subcon.pattern == b"\x00")


def fixed_size(body: Iterable[cs.Construct]) -> int:
    """Total wire size of fixed-size members (TypeError names the first variable one)."""
    size = 0
    for member in body:
        letter = fixed_format(member)
        if letter is None:
            raise TypeError(f"{member} is not fixed-size")
        size += struct.calcsize(">" + letter)
    return size


def byte_order(subcon: cs.Construct) -> str | None:
    """``">"`` or ``"<"`` for multi-byte numbers; ``None`` for bytes and single bytes."""
    inner = unwrap(subcon)
    if (isinstance(inner, cs.FormatField) and inner.fmtstr[0] in "<>"
            and inner.length > 1):
        return str(inner.fmtstr[0])
    return None


def native_order(subcon: cs.Construct) -> bool:
    """True for numbers in the host's byte order (``Int32un``): no fixed wire layout."""
    inner = unwrap(subcon)
    return isinstance(inner, cs.FormatField) and inner.fmtstr[0] in "=@" and inner.length > 1


def value_kind(subcon: cs.Construct) -> str:
    """What Python value a member holds: ``"int"``, ``"ipv4"``, ``"bytes"`` or ``"text"``."""
    node = subcon.subcon if isinstance(subcon, cs.Renamed) else subcon
    while isinstance(node, cs.Subconstruct):
        if isinstance(node, IPv4Adapter):
            return "ipv4"
        if isinstance(node, TextAdapter):
            return "text"
        node = node.subcon
    if isinstance(node, cs.FormatField):
        return "float" if node.fmtstr[-1] in "efd" else "int"
    return "bytes"


def members(struct: cs.Struct) -> Iterator[cs.Renamed]:
    """The named members of a struct, in wire order."""
    for sc in struct.subcons:
        if getattr(sc, "name", None):
            yield sc


# --- tshark export -----------------------------------------------------------------------------


def qualify(prefix: str, name: str) -> str:
    """tshark names in definitions are relative to the header prefix unless already absolute."""
    if name.split(".", 1)[0] in ("lbmc", "lbtru", "lbtrm", "lbttcp", "lbmr"):
        return name
    return f"{prefix}.{name}"


def export_struct(prefix: str, struct_def: cs.Struct, values: Mapping[str, Any],
                  ) -> list[tuple[str, Any]]:
    """Generic tshark-name export of a Construct struct's values (members, bit views, arrays)."""
    out: list[tuple[str, Any]] = []
    for member in members(struct_def):
        value = values.get(member.name)
        name = tshark_name(member)
        if isinstance(member.subcon, cs.Array) and name is not None:
            element = member.subcon.subcon
            for item in value or []:
                out.extend(export_struct(qualify(prefix, name), element, item))
            continue
        if name is not None:
            out.append((qualify(prefix, name), value))
        for view, bit in bit_views(member).items():
            raw = int(value or 0)
            if bit.when is not None and not bit.when(raw):
                continue
            out.append((qualify(prefix, bit.tshark or f"{name or member.name}.{view}"),
                        bit.get(raw)))
    return out
