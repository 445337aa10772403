"""Fast decoders *derived* from the Construct definitions.

Construct is the single written form of every layout, but interpreting it costs tens of
microseconds per header.  The store's hot loop and Spark's columnar decode need far less, so for
every fixed-layout struct this module reads the members off the Construct definition and
compiles them into one :class:`struct.Struct` (and a numpy dtype).  Nothing here names a field
or an offset: change the Construct definition and the fast path follows.  ``tests/wire`` proves
with Hypothesis that both decoders agree byte for byte.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import construct as cs
import numpy as np

from .errors import WireError
from .fields import (
    byte_order,
    fixed_format,
    ipv4_to_int,
    is_zero_padding,
    native_order,
    value_kind,
)


def _ipv4_decode(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "big"))


def _ipv4_encode(value: Any) -> int:
    # The same strict parser as the Construct adapter: inet_aton would take "010.0.0.1" as
    # octal and "127.1" as 127.0.0.1, so the two paths would disagree.
    return ipv4_to_int(value)


_DECODERS: dict[str, Callable[[Any], Any]] = {"ipv4": _ipv4_decode}
_ENCODERS: dict[str, Callable[[Any], Any]] = {"ipv4": _ipv4_encode}


@dataclass(frozen=True)
class FastLayout:
    """The fixed-size prefix of a Construct struct, compiled to :mod:`struct`.

    Attributes:
        names: member names, in wire order, that the compiled format covers.
        codec: the compiled big-endian :class:`struct.Struct`.
        complete: True when the prefix is the whole struct except a trailing variable member
            named ``trailing`` (bytes a longer ``hdr_len`` adds), i.e. the layout is fixed.
        kinds: per member, ``"int"``, ``"ipv4"`` or ``"bytes"`` (see :func:`value_kind`).
    """

    names: tuple[str, ...]
    codec: struct.Struct
    complete: bool
    kinds: tuple[str, ...]
    name: str = "struct"
    sizes: tuple[int | None, ...] = ()

    @property
    def size(self) -> int:
        return self.codec.size

    @property
    def format(self) -> str:
        return self.codec.format

    def unpack_from(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, ...]:
        """Raw member values (IPv4 as int): the hot-loop form."""
        return self.codec.unpack_from(buf, offset)

    def decode(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, Any]:
        """Member values in the same Python form Construct gives (IPv4 as dotted string).

        Unlike :meth:`unpack_from` (the unchecked hot-loop form) a short buffer is a
        :class:`WireError`."""
        if len(buf) - offset < self.codec.size:
            raise WireError(self.name, offset,
                            f"{max(0, len(buf) - offset)} bytes; the layout needs "
                            f"{self.codec.size}")
        values = dict(zip(self.names, self.codec.unpack_from(buf, offset), strict=True))
        for name, kind in zip(self.names, self.kinds, strict=True):
            conv = _DECODERS.get(kind)
            if conv is not None:
                values[name] = conv(values[name])
        return values

    def pack(self, values: Mapping[str, Any]) -> bytes:
        """Bytes of the fixed prefix; ``values`` in Construct's form (IPv4 may be str or int)."""
        args = []
        for name, kind, size in zip(self.names, self.kinds, self.sizes, strict=True):
            value = values[name]
            conv = _ENCODERS.get(kind)
            if conv is not None:
                value = conv(value)
            elif size is not None and len(value) != size:
                # struct would silently pad or cut; Construct refuses, and so do we
                raise ValueError(f"{name} must be {size} bytes, got {len(value)}")
            args.append(value)
        return self.codec.pack(*args)

    def dtype(self) -> np.dtype:
        """A big-endian numpy record dtype with the same members, for columnar decoding."""
        order = "<" if self.codec.format.startswith("<") else ">"
        fields: list[tuple[str, str]] = []
        offsets: list[int] = []
        pos = 0
        for letter in _letters(self.codec.format):
            size = struct.calcsize(order + letter)
            if not letter.endswith("x"):
                # byte strings as raw void items: an "S" dtype would drop trailing NULs
                fields.append(("", order + _NUMPY[letter] if letter in _NUMPY
                               else f"V{letter[:-1]}"))
                offsets.append(pos)
            pos += size
        return np.dtype({"names": list(self.names), "formats": [f for _, f in fields],
                         "offsets": offsets, "itemsize": pos})


_NUMPY = {"B": "u1", "H": "u2", "I": "u4", "L": "u4", "Q": "u8", "b": "i1", "h": "i2",
          "i": "i4", "l": "i4", "q": "i8", "e": "f2", "f": "f4", "d": "f8"}


def _letters(fmt: str) -> list[str]:
    """Split a struct format such as ``>BBH8sI`` into ``['B', 'B', 'H', '8s', 'I']``."""
    out: list[str] = []
    count = ""
    for ch in fmt.lstrip("<>!=@"):
        if ch.isdigit():
            count += ch
            continue
        out.append(count + ch if ch in "sx" else ch)
        count = ""
    return out


def derive(struct_def: cs.Struct, name: str = "struct") -> FastLayout:
    """Compile the longest fixed-size prefix of ``struct_def``.

    Unnamed fixed members (``Padding``) become pad bytes; native byte order has no wire layout
    and is refused, as are structs mixing big- and little-endian members.
    """
    names: list[str] = []
    letters: list[str] = []
    kinds: list[str] = []
    sizes: list[int | None] = []
    orders: set[str] = set()
    rest: list[str] = []
    for member in struct_def.subcons:
        if not getattr(member, "name", None) and not is_zero_padding(member):
            # constants, checksums, patterned padding: Construct checks or computes them, a
            # struct format cannot, so such a struct gets no fast layout at all
            raise TypeError(f"{name}: unnamed member {member} has no fast-path equivalent")
        if isinstance(member, cs.Renamed) and isinstance(member.subcon, cs.Padded):
            raise TypeError(f"{name}: padding member {member.name!r} has no value to decode")
        letter = fixed_format(member) if not rest else None
        if letter is None:
            rest.append(getattr(member, "name", None) or "?")
            continue
        if native_order(member):
            raise TypeError(f"{name}: native byte order has no fixed wire layout")
        if is_zero_padding(member):
            letters.append(letter)
            continue
        names.append(member.name)
        letters.append(letter)
        kind = value_kind(member)
        kinds.append(kind)
        sizes.append(int(letter[:-1]) if kind == "bytes" and letter.endswith("s") else None)
        order = byte_order(member)
        if order is not None:
            orders.add(order)
    if len(orders) > 1:
        raise TypeError(f"{name}: a struct mixing byte orders has no single fast layout")
    complete = rest == ["trailing"] or not rest
    prefix = orders.pop() if orders else ">"
    return FastLayout(tuple(names), struct.Struct(prefix + "".join(letters)), complete,
                      tuple(kinds), name, tuple(sizes))
