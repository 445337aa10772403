"""The one exception type for bad wire input.

Every decoder in :mod:`wire` (Construct definitions, the derived fast path, the LBT-TCP stream
framer, the transport and LBMR codecs) reports bad bytes by raising :class:`WireError`, never a
bare ``struct.error``, ``IndexError`` or Construct exception.  A caller that feeds untrusted bytes
(a store reading a socket, ``ump dissect`` reading a capture) therefore needs exactly one
``except`` clause, and the error always says *which* header was being read, *where*, and *why*.
"""

from __future__ import annotations


class WireError(ValueError):
    """Bytes that do not decode (or values that do not encode) as the named structure.

    Attributes:
        header: the structure being decoded when the problem was found, in tshark's vocabulary
            where one exists (``"lbmc.ume_preg"``, ``"lbtru"``, ``"lbmr.tir"``).
        offset: byte offset of the problem, counted from the start of the buffer the caller
            handed in (for a whole LBMC message: from its ``ver_type`` byte).
        reason: a short human sentence (``"hdr_len 20 is shorter than the 28-byte layout"``).
    """

    def __init__(self, header: str, offset: int, reason: str) -> None:
        super().__init__(f"{header} at offset {offset}: {reason}")
        self.header = header
        self.offset = offset
        self.reason = reason

    def shifted(self, delta: int, outer: str | None = None) -> WireError:
        """The same error seen from an enclosing buffer that starts ``delta`` bytes earlier."""
        header = self.header if outer is None else f"{outer}/{self.header}"
        return WireError(header, self.offset + delta, self.reason)
