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

from .fields import byte_order, fixed_format, ipv4_to_int, members, value_kind


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
        """Member values in the same Python form Construct gives (IPv4 as dotted string)."""
        values = dict(zip(self.names, self.codec.unpack_from(buf, offset), strict=True))
        for name, kind in zip(self.names, self.kinds, strict=True):
            conv = _DECODERS.get(kind)
            if conv is not None:
                values[name] = conv(values[name])
        return values

    def pack(self, values: Mapping[str, Any]) -> bytes:
        """Bytes of the fixed prefix; ``values`` in Construct's form (IPv4 may be str or int)."""
        args = []
        for name, kind in zip(self.names, self.kinds, strict=True):
            value = values[name]
            conv = _ENCODERS.get(kind)
            args.append(conv(value) if conv is not None else value)
        return self.codec.pack(*args)

    def dtype(self) -> np.dtype:
        """A big-endian numpy record dtype with the same members, for columnar decoding."""
        fields = []
        for name, letter in zip(self.names, _letters(self.codec.format), strict=True):
            order = "<" if self.codec.format.startswith("<") else ">"
            fields.append((name, order + _NUMPY[letter] if letter in _NUMPY else f"S{letter[:-1]}"))
        return np.dtype(fields)


_NUMPY = {"B": "u1", "H": "u2", "I": "u4", "L": "u4", "Q": "u8", "b": "i1", "h": "i2",
          "i": "i4", "l": "i4", "q": "i8"}


def _letters(fmt: str) -> list[str]:
    """Split a struct format such as ``>BBH8sI`` into ``['B', 'B', 'H', '8s', 'I']``."""
    out: list[str] = []
    count = ""
    for ch in fmt.lstrip("<>!=@"):
        if ch.isdigit():
            count += ch
            continue
        out.append(count + ch if ch == "s" else ch)
        count = ""
    return out


def derive(struct_def: cs.Struct) -> FastLayout:
    """Compile the longest fixed-size prefix of ``struct_def``."""
    names: list[str] = []
    letters: list[str] = []
    orders: set[str] = set()
    kinds: list[str] = []
    rest: list[str] = []
    for member in members(struct_def):
        letter = fixed_format(member) if not rest else None
        if letter is None:
            rest.append(member.name)
            continue
        names.append(member.name)
        letters.append(letter)
        order = byte_order(member)
        if order is not None:
            orders.add(order)
        kinds.append(value_kind(member))
    if len(orders) > 1:
        raise TypeError("a struct mixing byte orders has no single fast layout")
    complete = rest == ["trailing"] or not rest
    prefix = orders.pop() if orders else ">"
    return FastLayout(tuple(names), struct.Struct(prefix + "".join(letters)), complete,
                      tuple(kinds))
