"""Hot-path message encoders *derived* from the wire/ definitions.

Building an :class:`wire.lbmc.LbmcMessage` costs several microseconds, too much for the store's
stability acknowledgements, the receivers' consumption acknowledgements and the source's data
messages at 100,000 messages per second.  These helpers compose the LBMC base header layout and
one extended header's derived :class:`wire.fastpath.FastLayout` into a single precompiled
:class:`struct.Struct`; no field or offset is written here.  ``tests/reference_impl`` proves
they produce exactly what ``LbmcMessage.build()`` produces.
"""

from __future__ import annotations

import struct
from typing import Any

from wire.fields import Bit
from wire.lbmc import CONTROL_BASE, DATA_BASE, NHDR_DATA, NHDR_NONE, Header, MessageType
from wire.records import view_index


class ControlTemplate:
    """A CONTROL message with exactly one extended header of class ``header_cls``.

    ``pack(**values)`` takes the header's members by name (``next_hdr`` and ``hdr_len`` are
    computed); members not given are 0.
    """

    def __init__(self, header_cls: type[Header]) -> None:
        fast = header_cls.kind.fast
        assert fast is not None and fast.complete, f"{header_cls.__name__} is not fixed-size"
        self.names = fast.names[2:]  # after next_hdr, hdr_len
        self._codec = struct.Struct(CONTROL_BASE.codec.format + fast.codec.format.lstrip("<>!="))
        self.size = self._codec.size
        self._head = (MessageType.CONTROL, header_cls.kind.code, self.size, NHDR_NONE, fast.size)
        self.head = self._head
        """What :meth:`unpack_from` returns first (``len(head)`` values) for this shape."""
        self.unpack_from = self._codec.unpack_from
        """``unpack_from(buffer, offset)``: every value of a :attr:`size`-byte message at
        ``offset``, :attr:`head` first, then the members; the caller compares the head (the
        run loops of the hot paths, which must not slice each message out first)."""
        self._index = {n: i for i, n in enumerate(self.names)}
        assert header_cls.kind.struct is not None
        self._views = view_index(header_cls.kind.struct)

    def pack(self, **values: Any) -> bytes:
        body = [0] * len(self.names)
        index = self._index
        for name, value in values.items():
            body[index[name]] = value
        return self._codec.pack(*self._head, *body)

    def unpack(self, raw: bytes | bytearray | memoryview) -> tuple[Any, ...] | None:
        """The header's members (in :attr:`names` order; IPv4 addresses as ints) when ``raw``
        is exactly what :meth:`pack` builds for some values, else None.

        "Exactly" means: version 0, CONTROL, this one header with its fixed length, the chain
        ending 0xFF and nothing after it.  Such bytes decode with :func:`wire.lbmc.
        parse_message` to the same single header, so a caller may take this path first and
        fall back to the full decoder on None (any other shape, including malformed input).
        """
        if len(raw) != self.size:
            return None
        values = self._codec.unpack(raw)
        if values[:5] != self._head:
            return None
        return values[5:]

    def index(self, name: str) -> int:
        """Position of member ``name`` in :meth:`unpack`'s tuple."""
        return self._index[name]

    def full_index(self, name: str) -> int:
        """Position of member ``name`` in :attr:`unpack_from`'s tuple (after the head)."""
        return len(self._head) + self._index[name]

    def view(self, name: str) -> tuple[int, Bit]:
        """(position in :meth:`unpack`'s tuple, bit view) of a named flag bit such as
        ``e_flag``: read it as ``bit.get(values[position])``."""
        member, bit = self._views[name]
        return self._index[member], bit


_DATA = DATA_BASE.codec
_DATA_SIZE = DATA_BASE.size
_MESSAGE = int(MessageType.MESSAGE)


def data_message(tidx: int, sqn: int, payload: bytes, mtype: int = _MESSAGE) -> bytes:
    """A data message with no extended headers (chain ends at once in DATA)."""
    return _DATA.pack(mtype, NHDR_DATA, _DATA_SIZE + len(payload), tidx, sqn) + payload


def data_fields(raw: bytes | bytearray | memoryview) -> tuple[int, int, int, int]:
    """(type, first next_hdr, topic index, sqn) of a data message's base header."""
    ver_type, next_hdr, _, tidx, sqn = _DATA.unpack_from(raw, 0)
    return ver_type & 0x0F, next_hdr, tidx, sqn
