"""LBT-TCP: LBMC messages back to back on a TCP byte stream, each sized by its ``msglen``.

There is no framing of its own (docs/wire-transports.md §3.3): the 4-byte LBMC control header is the
fixed prefix and ``msglen`` (u16 at offset 2) is the whole message.  The same framing carries
the persistence control traffic between sources/receivers and stores.

:class:`LbttcpStream` is an incremental parser for one direction of one connection.  It accepts
bytes in any chunking and hands out every complete message in order.  Two kinds of trouble are
kept apart, because they call for different reactions:

* a *message* that is well framed but does not decode (unknown header code, short hdr_len) is
  returned as a :class:`StreamItem` carrying the :class:`WireError` and the raw bytes, and the
  stream goes on with the next message: a store logs and drops it;
* a *framing* error (``msglen`` 0 to 3) leaves no way to find the next message.  tshark waits
  forever in that case; we raise :class:`WireError` instead, and the stream stays broken (every
  later :meth:`LbttcpStream.feed` raises again) so a driver closes the connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import WireError
from .lbmc import CONTROL_BASE, LbmcMessage, MessageType, is_defined_code, parse_message

DEFAULT_SOURCE_PORTS = (14371, 14390)
DEFAULT_REQUEST_PORTS = (14391, 14395)
MAX_MESSAGE = 0xFFFF


def entry_test(data: bytes | bytearray | memoryview) -> str | None:
    """tshark's test for LBMC at the start of a TCP segment; ``None`` if it passes, else why not.

    At least 4 bytes, version 0, a known type, a first ``next_hdr`` that is a defined code other
    than 0xFF (0x00 and 0x03 pass), and ``msglen`` != 0 (docs/wire-lbmc.md §4.2).
    """
    if len(data) < CONTROL_BASE.size:
        return f"{len(data)} bytes; LBMC needs at least 4"
    ver_type, first, msglen = CONTROL_BASE.codec.unpack_from(data, 0)
    if ver_type >> 4:
        return f"LBMC version {ver_type >> 4} (must be 0)"
    if ver_type & 0x0F not in MessageType._value2member_map_:
        return f"LBMC type 0x{ver_type & 0x0F:x} is not defined"
    if first == 0xFF or not (first == 0x00 or is_defined_code(first)):
        return f"first next_hdr 0x{first:02x} is not accepted at the start of a TCP segment"
    if msglen == 0:
        return "msglen is zero"
    return None


@dataclass(frozen=True)
class StreamItem:
    """One framed message.

    Attributes:
        offset: stream offset of its first byte (bytes fed before it).
        raw: its bytes (exactly ``msglen``).
        message: the decoded message, or ``None`` when ``error`` is set.
        error: why the framed bytes do not decode (offsets relative to ``offset``).
    """

    offset: int
    raw: bytes
    message: LbmcMessage | None
    error: WireError | None = None


class LbttcpStream:
    """Incremental LBT-TCP framer for one direction of a connection.

    ``feed(data)`` returns the complete messages the new bytes finish; partial messages wait in
    an internal buffer (at most one message, 65,535 bytes).  ``decode=False`` returns raw framed
    bytes only, for callers with their own decoder (the store's hot loop).
    """

    def __init__(self, *, decode: bool = True) -> None:
        self._buf = bytearray()
        self._consumed = 0  # stream offset of _buf[0]
        self._broken: WireError | None = None
        self._decode = decode

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole message."""
        return len(self._buf)

    @property
    def offset(self) -> int:
        """Total bytes fed so far."""
        return self._consumed + len(self._buf)

    @property
    def broken(self) -> WireError | None:
        return self._broken

    def feed(self, data: bytes | bytearray | memoryview) -> list[StreamItem]:
        if self._broken is not None:
            raise WireError("lbttcp", self._broken.offset,
                            f"stream unusable after earlier error: {self._broken.reason}")
        self._buf += data
        items: list[StreamItem] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= CONTROL_BASE.size:
            _, _, msglen = CONTROL_BASE.codec.unpack_from(buf, pos)
            if msglen < 4:
                err = WireError("lbttcp", self._consumed + pos + 2,
                                f"msglen {msglen} cannot frame a message; stream cannot resync")
                self._broken = err
                del buf[:pos]
                self._consumed += pos
                if items:
                    return items
                raise err
            if len(buf) - pos < msglen:
                break
            raw = bytes(buf[pos : pos + msglen])
            start = self._consumed + pos
            pos += msglen
            if not self._decode:
                items.append(StreamItem(start, raw, None))
                continue
            try:
                message, _ = parse_message(raw)
            except WireError as exc:
                items.append(StreamItem(start, raw, None, exc))
            else:
                items.append(StreamItem(start, raw, message))
        if pos:
            del buf[:pos]
            self._consumed += pos
        return items

    def close(self) -> None:
        """Declare the end of the stream; leftover bytes are a truncated message."""
        if self._buf and self._broken is None:
            self._broken = WireError("lbttcp", self._consumed,
                                     f"stream ended inside a message ({len(self._buf)} bytes)")
            raise self._broken


def frame_messages(messages: list[LbmcMessage]) -> bytes:
    """The stream bytes for ``messages`` (LBT-TCP adds nothing around them)."""
    out = bytearray()
    for m in messages:
        raw = m.build()
        if len(raw) > MAX_MESSAGE:
            raise WireError("lbttcp", len(out), "message longer than 65535 bytes")
        out += raw
    return bytes(out)
