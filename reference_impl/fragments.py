"""Fragmentation of large messages (issue 17): the facts the source, the receiver and the
configuration layer share, written once.

A message whose data message would not fit the transport's maximum datagram
(``transport_tcp_datagram_max_size``, ``transport_lbtru_datagram_max_size``) goes out as
several data messages, each with its own topic sequence number and an LBMC FRAG header
(``wire.lbmc.Frag``: the first fragment's sequence number, this piece's offset in the message,
the message's total length), as the product does and as tshark reassembles them
(docs/wire-lbmc.md §3.1).  The store needs nothing special: every fragment is a data message
of its own, stored, acknowledged and retransmitted per sequence number.

Choices where the fact sheets are silent (the guide's "Monitoring Store Activity" only says
messages are cut into "roughly 8 kilobyte chunks for UDP-based protocols (LBT-RM and LBT-RU)
and into roughly 64 kilobyte chunks for LBT-TCP"):

* The maximum counts everything the transport carries per datagram: the LBMC data header, the
  FRAG header and the piece, and for LBT-RU also the LBT-RU DATA header with its session-ID
  option (:data:`LBTRU_OVERHEAD`).  A message that fits unfragmented is never fragmented.
* Defaults: LBT-TCP 65535 (the most an LBMC ``msglen`` of 16 bits can say; the product's 65536
  cannot be framed), LBT-RU 8192.  Bounds (:data:`DATAGRAM_BOUNDS`): at least what carries one
  payload byte in a fragment, at most 65535 (LBT-TCP) and 65507 (LBT-RU: the largest UDP
  payload over IPv4).  Anything else is a one-line configuration error.
* Every piece but the last has the same length (:func:`piece_size`); the pieces go out in
  order, the first at offset 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wire import lbtrm, lbtru
from wire.lbmc import DATA_BASE, Frag, LbmcMessage, MessageType

FRAG_SIZE = Frag.kind.fast.size if Frag.kind.fast is not None else 16
"""Bytes of the LBMC FRAG header."""

MESSAGE_OVERHEAD = DATA_BASE.size
"""Bytes of an unfragmented data message besides its payload (the LBMC data header)."""

FRAGMENT_OVERHEAD = DATA_BASE.size + FRAG_SIZE
"""Bytes of one fragment besides its piece (the LBMC data header and the FRAG header)."""

LBTRU_OVERHEAD = len(lbtru.LbtruData(sqn=0, trail_sqn=0,
                                     options=[lbtru.SidOption(session_id=1)]).build())
"""Bytes of the LBT-RU DATA header (with the session-ID option the reference source sends)
in front of the LBMC message of every LBT-RU datagram."""

LBTRM_OVERHEAD = lbtrm.DATA_FAST.size
"""Bytes of the LBT-RM DATA header (no options) in front of the LBMC message of every LBT-RM
datagram (the same 8192 default and 65507 bound as LBT-RU: our choice, after the guide's
"roughly 8 kilobyte chunks for UDP-based protocols (LBT-RM and LBT-RU)")."""

DATAGRAM_OPTIONS = {"tcp": "transport_tcp_datagram_max_size",
                    "lbt-ru": "transport_lbtru_datagram_max_size",
                    "lbt-rm": "transport_lbtrm_datagram_max_size"}
"""The option that sets the maximum datagram of each transport."""

DATAGRAM_DEFAULTS = {"tcp": 65535, "lbt-ru": 8192, "lbt-rm": 8192}
"""The default maximum datagram of each transport (see the module docstring)."""

DATAGRAM_BOUNDS = {"tcp": (FRAGMENT_OVERHEAD + 1, 65535),
                   "lbt-ru": (LBTRU_OVERHEAD + FRAGMENT_OVERHEAD + 1, 65507),
                   "lbt-rm": (LBTRM_OVERHEAD + FRAGMENT_OVERHEAD + 1, 65507)}
"""(least, most) maximum datagram of each transport: the least carries one payload byte in a
fragment."""


def transport_overhead(transport: str) -> int:
    """Bytes of a datagram of ``transport`` ("tcp", "lbt-ru", "lbt-rm") before its LBMC
    message."""
    return {"lbt-ru": LBTRU_OVERHEAD, "lbt-rm": LBTRM_OVERHEAD}.get(transport, 0)


def piece_size(transport: str, datagram_max: int) -> int:
    """Most payload bytes one fragment of ``transport`` carries under ``datagram_max``."""
    low, high = DATAGRAM_BOUNDS[transport]
    if not low <= datagram_max <= high:
        raise ValueError(f"source {DATAGRAM_OPTIONS[transport]} {datagram_max}: "
                         f"{low} to {high} bytes")
    return datagram_max - transport_overhead(transport) - FRAGMENT_OVERHEAD


def whole_size(transport: str, datagram_max: int) -> int:
    """Most payload bytes an unfragmented message of ``transport`` carries."""
    return datagram_max - transport_overhead(transport) - MESSAGE_OVERHEAD


def fragment_count(size: int, piece: int) -> int:
    """How many fragments a ``size``-byte payload takes with pieces of ``piece`` bytes."""
    return max(1, -(-size // piece))


def fragment(tidx: int, first_sqn: int, payload: bytes, piece: int, index: int,
             mtype: int = MessageType.MESSAGE) -> bytes:
    """Fragment ``index`` (0-based) of ``payload`` cut into ``piece``-byte pieces: a data
    message with sequence number ``first_sqn + index`` and a FRAG header."""
    offset = index * piece
    return LbmcMessage(type=mtype, tidx=tidx, sqn=(first_sqn + index) & 0xFFFFFFFF,
                       headers=[Frag(first_sqn=first_sqn, offset=offset, len=len(payload))],
                       payload=payload[offset:offset + piece]).build()


@dataclass
class Reassembly:
    """One fragmented message being put together by a receiver.

    Pieces land at their offsets; a repeated offset is ignored (a duplicate); the message is
    complete when the stored lengths add up to the total (docs/wire-lbmc.md §3.1, as tshark
    does).  A piece that overruns the total is refused (:meth:`add` returns False)."""

    first_sqn: int
    total: int
    pieces: dict[int, bytes] = field(default_factory=dict)
    have: int = 0
    retransmission: bool = False  # a piece came as a retransmission

    def add(self, offset: int, piece: bytes) -> bool:
        """Store a piece; False when it does not fit the message (dropped)."""
        if offset + len(piece) > self.total:
            return False
        if offset not in self.pieces:
            self.pieces[offset] = piece
            self.have += len(piece)
        return True

    @property
    def complete(self) -> bool:
        return self.have >= self.total

    def payload(self) -> bytes:
        """The message's payload (once :attr:`complete`)."""
        return b"".join(self.pieces[offset] for offset in sorted(self.pieces))


class FragmentPiece(bytes):
    """The payload of one received fragment, carrying its FRAG header's values.

    A receiver orders, holds, recovers and de-duplicates fragments by sequence number as it
    does every data message; only delivery needs the FRAG values, so they travel with the
    payload bytes (through the receiver's hold and replay paths unchanged) instead of beside
    them."""

    first_sqn: int
    offset: int
    total: int

    def __new__(cls, data: bytes, first_sqn: int, offset: int, total: int) -> FragmentPiece:
        piece = super().__new__(cls, data)
        piece.first_sqn, piece.offset, piece.total = first_sqn, offset, total
        return piece
