"""The one UM detector: which frames are LBT-TCP, LBT-RU, LBT-RM or LBMR, by port and by content.

Every tool that has to decide whether a frame is UM asks this module: ``ump dissect``
(:class:`wire.dissect.Dissector`, frame by frame through :class:`Detector`), the Scapy binding
helpers (:func:`wire.scapy_layers.bind_detector`) and the Spark decode
(:mod:`spark_analysis.classify`, column-wise).  The rules are written once, as numpy
expressions over columns of header values (:func:`udp_port_rules`, :func:`tcp_port_rule`,
:func:`lbtrm_header_test`, :func:`lbmr_header_test`); the frame-by-frame :class:`Detector`
runs the very same functions on one-row columns, so the two forms cannot drift apart.  The
constants (versions, packet types) are data here, read off :mod:`wire.lbtrm` and
:mod:`wire.lbmr`.  docs/wire-transports.md "Detection" explains the rules.

**Port rules** (tshark's, with its preferences: :class:`wire.tshark.PortMap`), in tshark's
order, first match wins:

1. decode-as ports (``lbtru_ports``, ``lbtrm_ports``, ``lbmr_ports``), source or destination;
2. LBMR: to the resolver multicast group and port (``lbmr_mc``), or unicast between the lbmrd
   port (``lbmr_uc_dest_port``) and the resolver client range (``lbmr_uc_ports``);
3. LBT-RU: between the source range and the receiver range, either direction;
4. LBT-RM: tshark's content test (:func:`lbtrm_header_test`) *and* either a multicast
   destination in ``lbtrm_mc_range`` with a destination port in ``lbtrm_dport``, or (outside
   that range) the MIM group and port ``lbtrm_mim``, or a unicast destination port in
   ``lbtrm_sport`` (NAKs to the source's unicast port).

TCP: a connection with a port among the store ports, decode-as ports or the LBT-TCP source
and request ranges (LBT-TCP has no content rule: a stream has no header to test).

**Content rules** (ours; tshark needs preferences for these), for a UDP datagram no port
rule claims, in this order; each must decode *cleanly*, with nothing left over:

1. LBT-RM: :func:`lbtrm_header_test` (version 0, DATA/SM/NAK/NCF, no options) and a clean
   decode: SM exactly its layout, NAK/NCF exactly their lists with at least one entry, DATA at
   least one LBMC message filling the datagram exactly;
2. LBT-RU: :func:`lbtru_header_test` (version 0, a defined type, no undefined flag bit and
   a zero reserved word) and a clean decode with only SID/CID options (DATA: at least one LBMC
   message; NAK/NCF: at least one entry);
3. LBMR: :func:`lbmr_header_test` (version 0 or 1: version 1 is what gateways and current UM
   send, with packet options; type NORMAL/WC-TQR with at least one record, topic
   management, UMQ or extended) and a clean :func:`wire.lbmr.parse_packet`: no trailer, an
   extended type with structure to check (:data:`LBMR_CONTENT_EXT_TYPES`).  Keepalive-like
   4-byte packets (types 2, 3, empty NORMAL) are too weak a signal to claim.

A datagram claimed only by content that then fails to decode is not UM (a content guess that
does not decode was a wrong guess), never a malformed UM packet.  With the content rules off
(``content=False``) only the port rules apply, exactly as tshark with the same preferences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import lbmr, lbtrm, lbtru
from .errors import WireError
from .fields import bit_views, ipv4_to_int, members
from .pcap import Segment
from .transport import TransportCodec, TransportPacket
from .tshark import PortMap

# --- protocols and the constants the rules test --------------------------------------------

PROTOCOLS = ("", "lbtrm", "lbtru", "lbttcp", "lbmr")
"""Protocol names by code (the code is what the column-wise rules return; 0: not UM)."""
NONE, LBTRM, LBTRU, LBTTCP, LBMR = range(5)

PORT, CONTENT = "port", "content"
"""How a frame was classified (the ``classified_by`` column of ``ump analyze``)."""

LBTRM_CONTENT_VERSIONS = (0,)
LBTRM_CONTENT_TYPES = tuple(sorted(int(t) for t in lbtrm.HEURISTIC_TYPES))
"""LBT-RM header values tshark's ``lbtrm_udp`` heuristic accepts (and so do we)."""

LBTRU_CONTENT_VERSIONS = (0,)
"""LBT-RU versions the content rule accepts (every defined type; options SID/CID only)."""


def _lbtru_word_bits() -> np.ndarray:
    """Per LBT-RU type nibble, the bits of the common header's 16-bit word
    (``flags_or_res``) a content claim allows: the flag bits of a flags word (DATA: RX, SM:
    SYN), none of a reserved word (NAK, NCF, ACK), all of a code (CREQ request, RST reason);
    none for an undefined type.  Read off the packet structs."""
    at = lbtru.COMMON.names.index("flags_or_res")
    bits = np.zeros(16, np.int64)
    for code, cls in lbtru.CODEC.packets.items():
        member = list(members(cls.struct))[at]
        if member.name == "flags":
            for bit in bit_views(member).values():
                bits[code] |= bit.mask
        elif member.name != "res":
            bits[code] = 0xFFFF
    return bits


LBTRU_WORD_BITS = _lbtru_word_bits()
"""Per type nibble: the 16-bit header word's allowed bits (a random 16-byte datagram read as
an SM with garbage flags was the commonest false positive before this check)."""

LBMR_CONTENT_VERSIONS = (0, 1)
"""LBMR header versions the content rule accepts: 0 and 1 (1: packets with options, as sent
by UM gateways and current UM versions; real topic resolution traffic is mostly version 1)."""
LBMR_CONTENT_TYPES = tuple(int(t) for t in (
    lbmr.PacketType.NORMAL, lbmr.PacketType.WC_TQR, lbmr.PacketType.TOPIC_MGMT,
    lbmr.PacketType.UMQ, lbmr.PacketType.EXT))
LBMR_COUNTED_TYPES = (int(lbmr.PacketType.NORMAL), int(lbmr.PacketType.WC_TQR))
"""LBMR types claimed only with at least one record (an empty NORMAL is a keepalive)."""
LBMR_CONTENT_EXT_TYPES = tuple(int(t) for t in (
    lbmr.ExtType.PSER, lbmr.ExtType.CONTEXT_INFO, lbmr.ExtType.TNWG,
    lbmr.ExtType.REMOTE_DOMAIN_ROUTE, lbmr.ExtType.REMOTE_CONTEXT_INFO))
"""Extended LBMR types the content rule claims: those whose record has lengths or counts to
check.  Queue management is opaque bytes (any bytes decode: measured, 2 of 40,000 random
datagrams starting 0x07 0x02) and a topic resolution request is a lone flags word, so
neither is evidence of LBMR."""

MULTICAST = (0xE0000000, 0xEFFFFFFF)
"""224.0.0.0/4 as numbers."""


# --- the rules, column-wise (numpy arrays of equal length) ----------------------------------


def _in(values: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    return (values >= bounds[0]) & (values <= bounds[1])


def _listed(values: np.ndarray, ports: Sequence[int]) -> np.ndarray:
    return np.isin(values, np.asarray(list(ports), np.int64))


def multicast(addresses: np.ndarray) -> np.ndarray:
    """Whether each IPv4 address (as a number) is multicast."""
    return _in(addresses, MULTICAST)


def _bits(raw: np.ndarray, bit: object) -> np.ndarray:
    mask, shift = bit.mask, bit.shift  # type: ignore[attr-defined]
    return (raw & mask) >> shift


def lbtrm_header_test(ver_type: np.ndarray, next_hdr: np.ndarray) -> np.ndarray:
    """tshark's LBT-RM content test on the common header's ``ver_type`` and ``next_hdr``
    (callers pass only rows with a whole common header): version 0, a DATA/SM/NAK/NCF type,
    no options."""
    version = _bits(ver_type, lbtrm.VER_TYPE_BITS["version"])
    ptype = _bits(ver_type, lbtrm.VER_TYPE_BITS["type"])
    return (np.isin(version, LBTRM_CONTENT_VERSIONS) & np.isin(ptype, LBTRM_CONTENT_TYPES)
            & (next_hdr == 0))


def lbtru_header_test(ver_type: np.ndarray, word: np.ndarray) -> np.ndarray:
    """The LBT-RU content rule's header part on ``ver_type`` and the 16-bit word
    ``flags_or_res`` (rows with a whole common header): a version it accepts, a defined
    type, and no bit of the word that type leaves undefined or reserved."""
    version = _bits(ver_type, lbtru.VER_TYPE_BITS["version"])
    ptype = _bits(ver_type, lbtru.VER_TYPE_BITS["type"])
    return (np.isin(version, LBTRU_CONTENT_VERSIONS)
            & np.isin(ptype, list(lbtru.CODEC.packets))
            & ((word & ~LBTRU_WORD_BITS[ptype]) == 0))


def lbmr_header_test(ver_type: np.ndarray, tqrs: np.ndarray, tirs: np.ndarray) -> np.ndarray:
    """The LBMR content rule's header part (rows with a whole 4-byte header): version 0 or
    1, a claimable type, and records for the types that count them."""
    version = _bits(ver_type, lbmr.VER_TYPE_BITS["ver"])
    ptype = _bits(ver_type, lbmr.VER_TYPE_BITS["type"])
    counted = np.isin(ptype, LBMR_COUNTED_TYPES)
    return (np.isin(version, LBMR_CONTENT_VERSIONS) & np.isin(ptype, LBMR_CONTENT_TYPES)
            & (~counted | (tqrs + tirs > 0)))


def udp_port_rules(sport: np.ndarray, dport: np.ndarray, dst: np.ndarray,
                   lbtrm_content: Callable[[np.ndarray], np.ndarray], ports: PortMap,
                   ) -> np.ndarray:
    """The protocol code tshark's port rules give each UDP row (0: none), in tshark's order
    (module docstring).  ``dst`` is the IPv4 destination as a number; ``lbtrm_content``
    gives :func:`lbtrm_header_test` of the rows at the positions it is passed (False for rows
    too short for the header): it is asked only about rows no earlier rule claimed, since
    reading their headers is most of the cost."""
    out = np.zeros(len(sport), np.int8)
    open_ = np.ones(len(sport), bool)

    def claim(mask: np.ndarray, code: int) -> None:
        nonlocal open_
        mask = mask & open_
        out[mask] = code
        open_ = open_ & ~mask

    for code, listed in ((LBTRU, ports.lbtru_ports), (LBTRM, ports.lbtrm_ports),
                         (LBMR, ports.lbmr_ports)):
        claim(_listed(sport, listed) | _listed(dport, listed), code)
    mc = multicast(dst)
    claim(mc & (dst == ipv4_to_int(ports.lbmr_mc[0])) & (dport == ports.lbmr_mc[1]), LBMR)
    uc_dest = ports.lbmr_uc_dest_port
    claim(~mc & ((sport == uc_dest) | (dport == uc_dest))
          & (_in(sport, ports.lbmr_uc_ports) | _in(dport, ports.lbmr_uc_ports)), LBMR)
    claim((_in(dport, ports.lbtru_source) & _in(sport, ports.lbtru_receiver))
          | (_in(dport, ports.lbtru_receiver) & _in(sport, ports.lbtru_source)), LBTRU)
    mc_range = (ipv4_to_int(ports.lbtrm_mc_range[0]), ipv4_to_int(ports.lbtrm_mc_range[1]))
    in_range = _in(dst, mc_range)
    where = open_ & ((mc & in_range & _in(dport, ports.lbtrm_dport))
                     | (mc & ~in_range & (dst == ipv4_to_int(ports.lbtrm_mim[0]))
                        & (dport == ports.lbtrm_mim[1]))
                     | (~mc & _in(dport, ports.lbtrm_sport)))
    rows = np.flatnonzero(where)
    if rows.size:
        where[rows] = lbtrm_content(rows)
        claim(where, LBTRM)
    return out


def tcp_port_rule(sport: np.ndarray, dport: np.ndarray, ports: PortMap) -> np.ndarray:
    """Whether each TCP row is on a candidate LBT-TCP connection: a store or decode-as port,
    or a port in the LBT-TCP source or request range."""
    listed = [*ports.store_ports, *ports.lbttcp_ports]
    out = _listed(sport, listed) | _listed(dport, listed)
    for bounds in (ports.lbttcp_source, ports.lbttcp_request):
        out |= _in(sport, bounds) | _in(dport, bounds)
    return out


# --- frame by frame ------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    """What the detector made of one UDP datagram or TCP segment.

    Attributes:
        protocol: ``lbtrm``, ``lbtru``, ``lbttcp`` or ``lbmr``.
        how: :data:`PORT` (a port rule) or :data:`CONTENT` (a content rule).
    """

    protocol: str
    how: str


def _one(value: int) -> np.ndarray:
    return np.array([value], np.int64)


def lbtrm_content_test(payload: bytes) -> bool:
    """:func:`lbtrm_header_test` of one datagram (False when shorter than the header)."""
    if len(payload) < lbtrm.HEADER_SIZE:
        return False
    head = lbtrm.COMMON.decode(payload)
    return bool(lbtrm_header_test(_one(int(head["ver_type"])),
                                  _one(int(head["next_hdr"])))[0])


def lbtru_content_test(payload: bytes) -> bool:
    """:func:`lbtru_header_test` of one datagram (False when shorter than the header)."""
    if len(payload) < lbtru.HEADER_SIZE:
        return False
    head = lbtru.COMMON.decode(payload)
    return bool(lbtru_header_test(_one(int(head["ver_type"])),
                                  _one(int(head["flags_or_res"])))[0])


def _clean_transport(codec: TransportCodec, payload: bytes, versions: Sequence[int]) -> bool:
    """A clean decode of an LBT-RM/LBT-RU datagram: nothing left over, a version the rule
    accepts, no unknown option, DATA with at least one message, NAK/NCF with an entry."""
    try:
        packet: TransportPacket = codec.parse(payload)
    except WireError:
        return False
    if packet.trailer or getattr(packet, "version", 0) not in versions:
        return False
    if codec.unknown_option is not None and any(
            isinstance(o, codec.unknown_option) for o in packet.options):
        return False
    if packet.carries_lbmc and not packet.payload:
        return False
    values = packet.header_values()
    return all(values.get(count) != 0 for count in ("num_naks", "num_ncfs"))


def _clean_lbmr(payload: bytes) -> bool:
    """The LBMR content rule: the header test and a clean parse (no trailer, a known
    extended type)."""
    if len(payload) < lbmr.HEADER.size:
        return False
    ver_type, tqrs, tirs = lbmr.HEADER.unpack_from(payload, 0)
    if not lbmr_header_test(_one(ver_type), _one(tqrs), _one(tirs))[0]:
        return False
    try:
        packet = lbmr.parse_packet(payload)
    except WireError:
        return False
    return lbmr_clean(packet)


_CONTENT_EXT_CLASSES = frozenset(lbmr.EXT_RECORDS[t] for t in LBMR_CONTENT_EXT_TYPES)


def lbmr_clean(packet: lbmr.LbmrPacket) -> bool:
    """What a content-claimed LBMR datagram must look like beyond decoding: no trailer, and
    for an extended packet one of :data:`LBMR_CONTENT_EXT_TYPES`."""
    if packet.trailer:
        return False
    if packet.type != lbmr.PacketType.EXT:
        return True
    return type(packet.ext) in _CONTENT_EXT_CLASSES


def content_protocol(payload: bytes) -> str | None:
    """The protocol the content rules give a datagram no port rule claims (None: not UM)."""
    if lbtrm_content_test(payload) and _clean_transport(lbtrm.CODEC, payload,
                                                         LBTRM_CONTENT_VERSIONS):
        return "lbtrm"
    if lbtru_content_test(payload) and _clean_transport(lbtru.CODEC, payload,
                                                         LBTRU_CONTENT_VERSIONS):
        return "lbtru"
    if _clean_lbmr(payload):
        return "lbmr"
    return None


CACHED = 65536
"""How many port pairs a :class:`Detector` remembers (then it starts again: hostile traffic
on random ports costs time, never memory)."""
_BY_HEADER = -1
"""A remembered UDP answer: LBT-RM when the datagram's header passes the content test."""


class Detector:
    """The rules for one port map, frame by frame.

    ``content`` switches the content rules on (the default) or off (tshark's rules only).
    The answers are remembered per port pair: a port map changed after the first frame needs
    a new detector."""

    def __init__(self, ports: PortMap | None = None, content: bool = True) -> None:
        self.ports = ports or PortMap()
        self.content = content
        self._udp: dict[tuple[int, int, str], int] = {}
        self._tcp: dict[tuple[int, int], bool] = {}

    def udp(self, seg: Segment) -> Detection | None:
        """The protocol of a UDP datagram, or None when it is not UM.

        The port rules are the column-wise ones above, asked about one row; their answer
        depends only on the ports and the destination, so it is kept per (ports,
        destination) (a capture has few; at most :data:`CACHED` are kept), except that the
        last rule also reads the datagram's LBT-RM header: that answer is kept as "LBT-RM
        if the header says so" and the header is read every time."""
        key = (seg.sport, seg.dport, seg.dst)
        code = self._udp.get(key)
        if code is None:
            asked: list[bool] = []

            def header(rows: np.ndarray) -> np.ndarray:
                asked.append(True)
                return np.array([lbtrm_content_test(seg.payload)])
            code = int(udp_port_rules(_one(seg.sport), _one(seg.dport),
                                      _one(ipv4_to_int(seg.dst)), header, self.ports)[0])
            if len(self._udp) >= CACHED:
                self._udp.clear()
            self._udp[key] = _BY_HEADER if asked else code
        elif code == _BY_HEADER:
            code = LBTRM if lbtrm_content_test(seg.payload) else 0
        if code:
            return Detection(PROTOCOLS[code], PORT)
        if self.content:
            found = content_protocol(seg.payload)
            if found is not None:
                return Detection(found, CONTENT)
        return None

    def tcp(self, seg: Segment) -> bool:
        """Whether a TCP segment is on a candidate LBT-TCP connection (port rules; kept per
        port pair as in :meth:`udp`)."""
        key = (seg.sport, seg.dport)
        found = self._tcp.get(key)
        if found is None:
            found = bool(tcp_port_rule(_one(seg.sport), _one(seg.dport), self.ports)[0])
            if len(self._tcp) >= CACHED:
                self._tcp.clear()
            self._tcp[key] = found
        return found

    def segment(self, seg: Segment) -> Detection | None:
        """:meth:`udp` or :meth:`tcp` by the segment's protocol."""
        if seg.proto == "udp":
            return self.udp(seg)
        return Detection("lbttcp", PORT) if self.tcp(seg) else None
