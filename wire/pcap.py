"""Capture files (pcap, pcapng) and the link/IP/UDP/TCP framing around UM traffic.

These are not UM formats, but they are layouts too, so they are written once as Construct
structs and read through the derived fast path like everything else in :mod:`wire`.

Reading yields every record, including ones we cannot decode: callers (``ump dissect``, the
Spark reader) must report a frame they do not understand, never drop it silently.  A file that
ends inside a record raises :class:`~wire.errors.WireError` after the complete records.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import construct as cs

from .errors import WireError
from .fastpath import FastLayout, derive
from .fields import U8, U16, U32, IPv4, field, ipv4_to_int

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_LINUX_SLL2 = 276

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A
PCAPNG_BOM = 0x1A2B3C4D


def _pcap_structs(u16: cs.Construct, u32: cs.Construct) -> tuple[cs.Struct, cs.Struct]:
    header = cs.Struct(
        field("magic", u32), field("version_major", u16), field("version_minor", u16),
        field("thiszone", u32), field("sigfigs", u32), field("snaplen", u32),
        field("linktype", u32),
    )
    record = cs.Struct(
        field("ts_sec", u32), field("ts_frac", u32), field("incl_len", u32),
        field("orig_len", u32),
    )
    return header, record


PcapHeaderLE, PcapRecordLE = _pcap_structs(cs.Int16ul, cs.Int32ul)
PcapHeaderBE, PcapRecordBE = _pcap_structs(cs.Int16ub, cs.Int32ub)


def _pcapng_structs(u16: cs.Construct, u32: cs.Construct) -> tuple[cs.Struct, ...]:
    block = cs.Struct(field("block_type", u32), field("block_length", u32))
    idb = cs.Struct(field("linktype", u16), field("reserved", u16), field("snaplen", u32))
    epb = cs.Struct(
        field("interface_id", u32), field("ts_high", u32), field("ts_low", u32),
        field("captured_len", u32), field("orig_len", u32),
    )
    spb = cs.Struct(field("orig_len", u32))
    shb = cs.Struct(field("byte_order_magic", u32), field("version_major", u16),
                    field("version_minor", u16))
    return block, idb, epb, spb, shb


_NG = {
    "<": [derive(s) for s in _pcapng_structs(cs.Int16ul, cs.Int32ul)],
    ">": [derive(s) for s in _pcapng_structs(cs.Int16ub, cs.Int32ub)],
}

EthernetHeader = cs.Struct(
    field("dst", cs.Bytes(6)), field("src", cs.Bytes(6)), field("ethertype", U16))
VlanTag = cs.Struct(field("tci", U16), field("ethertype", U16))
LinuxSll = cs.Struct(
    field("packet_type", U16), field("arphrd", U16), field("addr_len", U16),
    field("addr", cs.Bytes(8)), field("protocol", U16))
LinuxSll2 = cs.Struct(
    field("protocol", U16), field("reserved", U16), field("ifindex", U32),
    field("arphrd", U16), field("packet_type", U8), field("addr_len", U8),
    field("addr", cs.Bytes(8)))
IPv4Header = cs.Struct(
    field("ver_ihl", U8), field("tos", U8), field("total_length", U16), field("ident", U16),
    field("flags_frag", U16), field("ttl", U8), field("protocol", U8), field("checksum", U16),
    field("src", IPv4), field("dst", IPv4))
UdpHeader = cs.Struct(
    field("sport", U16), field("dport", U16), field("length", U16), field("checksum", U16))
TcpHeader = cs.Struct(
    field("sport", U16), field("dport", U16), field("seq", U32), field("ack", U32),
    field("offset_flags", U16), field("window", U16), field("checksum", U16),
    field("urgent", U16))

ETH, VLAN, SLL, SLL2, IP4, UDP, TCP = (derive(s) for s in (
    EthernetHeader, VlanTag, LinuxSll, LinuxSll2, IPv4Header, UdpHeader, TcpHeader))

TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10

IcmpHeader = cs.Struct(
    field("type", U8), field("code", U8), field("checksum", U16), field("rest", U32))
ICMP = derive(IcmpHeader)
PROTO_ICMP, PROTO_TCP, PROTO_UDP = 1, 6, 17
ICMP_ERROR_TYPES = (3, 4, 5, 11, 12)
"""ICMP types that quote the datagram they report (destination unreachable, source quench,
redirect, time exceeded, parameter problem): tshark decodes the quoted IPv4 and UDP headers
and the UDP payload as far as it is quoted, and so do we (:func:`decode_frame`).  A NAK
answered by "port unreachable" (type 3 code 3) means the source that should take it is gone."""
MAX_8023_LENGTH = 1500
"""An Ethernet type field up to this value is an IEEE 802.3 length: an LLC header follows."""


def not_ipv4_reason(ethertype: int) -> str:
    """Why a frame with this Ethernet type (or 802.3 length) is not an IPv4 frame: the one
    text for ``ump dissect`` and ``ump analyze``."""
    if not ethertype:
        return "not IPv4"
    if ethertype <= MAX_8023_LENGTH:
        return f"not IPv4 (IEEE 802.3 frame with an LLC header, length {ethertype})"
    return f"not IPv4 (ethertype 0x{ethertype:04x})"


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureRecord:
    """One captured frame: 1-based number, time in seconds, link type and bytes."""

    number: int
    ts: float
    linktype: int
    data: bytes
    orig_len: int


GZIP_MAGIC = b"\x1f\x8b"
"""The first bytes of a gzip file: captures are often kept compressed (``tcpdump -z gzip``,
log rotation), and tshark reads them as they are."""


def read_capture(path: str | Path) -> Iterator[CaptureRecord]:
    """Every record of a pcap or pcapng file, in order; gzip-compressed too, as tshark reads
    it (a compressed stream that ends early or is corrupt raises WireError where it does,
    after the records before it, as a damaged capture does)."""
    with open(path, "rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        fh = cast(BinaryIO, gzip.GzipFile(fileobj=raw) if compressed else raw)
        try:
            head = fh.read(4)
            fh.seek(0)
            if len(head) < 4:
                raise WireError("pcap", 0, "file too short to be a capture")
            magic_le = struct.unpack("<I", head)[0]
            if magic_le == PCAPNG_SHB:
                yield from _read_pcapng(fh)
            else:
                yield from _read_pcap(fh)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise WireError("gzip", raw.tell(), f"the compressed capture is damaged or cut "
                                                f"short ({exc})") from None


def has_nanosecond_stamps(path: str | Path) -> bool:
    """Whether the little-endian classic pcap at ``path`` (what :class:`PcapWriter` and the
    capture tools write) has nanosecond timestamps, read from its magic, so a copy of it
    keeps its clock resolution."""
    with open(path, "rb") as fh:
        raw = fh.read(PcapHeaderLE.sizeof())
    if len(raw) < PcapHeaderLE.sizeof():
        return False
    return bool(derive(PcapHeaderLE).decode(raw)["magic"] == PCAP_MAGIC_NS)


def _read_pcap(fh: BinaryIO) -> Iterator[CaptureRecord]:
    raw = fh.read(24)
    if len(raw) < 24:
        raise WireError("pcap", 0, "truncated global header")
    for header, record in ((PcapHeaderLE, PcapRecordLE), (PcapHeaderBE, PcapRecordBE)):  # noqa: B007
        hdr = derive(header).decode(raw)
        if hdr["magic"] in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            break
    else:
        raise WireError("pcap", 0, f"not a pcap or pcapng file (magic {raw[:4].hex()})")
    scale = 1e-9 if hdr["magic"] == PCAP_MAGIC_NS else 1e-6
    rec = derive(record)
    offset, number = 24, 0
    while True:
        rh = fh.read(rec.size)
        if not rh:
            return
        if len(rh) < rec.size:
            raise WireError("pcap.record", offset, "file ends inside a record header")
        sec, frac, incl, orig = rec.unpack_from(rh)
        data = fh.read(incl)
        if len(data) < incl:
            raise WireError("pcap.record", offset,
                            f"file ends inside a record ({len(data)} of {incl} bytes)")
        number += 1
        yield CaptureRecord(number, sec + frac * scale, hdr["linktype"], data, orig)
        offset += rec.size + incl


def _read_pcapng(fh: BinaryIO) -> Iterator[CaptureRecord]:
    order = "<"
    interfaces: list[tuple[int, float, int]] = []  # linktype, time resolution, snaplen
    offset, number = 0, 0
    while True:
        head = fh.read(8)
        if not head:
            return
        if len(head) < 8:
            raise WireError("pcapng.block", offset, "file ends inside a block header")
        if struct.unpack("<I", head[:4])[0] == PCAPNG_SHB:
            bom = fh.read(4)
            if len(bom) < 4:
                raise WireError("pcapng.shb", offset, "file ends inside a section header")
            order = "<" if struct.unpack("<I", bom)[0] == PCAPNG_BOM else ">"
            length = struct.unpack(order + "I", head[4:])[0]
            body = bom + fh.read(max(0, length - 12))
            interfaces = []
        else:
            length = struct.unpack(order + "I", head[4:])[0]
            body = fh.read(max(0, length - 8))
        if length < 12 or length % 4 or len(body) != length - 8:
            raise WireError("pcapng.block", offset, f"bad or truncated block (length {length})")
        btype = struct.unpack(order + "I", head[:4])[0]
        _, idb, epb, spb, _ = _NG[order]
        # ``body`` runs from after the 8-byte block header to the end, trailing length included
        if btype == 1:  # interface description
            if len(body) < idb.size + 4:
                raise WireError("pcapng.idb", offset, "interface block too short")
            linktype, _, snaplen = idb.unpack_from(body)
            interfaces.append((linktype, _if_tsresol(body[idb.size : -4], order), snaplen))
        elif btype == 6:  # enhanced packet
            if len(body) < epb.size + 4:
                raise WireError("pcapng.epb", offset, "packet block too short")
            iface, hi, lo, cap, orig = epb.unpack_from(body)
            if iface >= len(interfaces):
                raise WireError("pcapng.epb", offset, f"unknown interface {iface}")
            if epb.size + cap > len(body) - 4:
                raise WireError("pcapng.epb", offset,
                                f"captured length {cap} runs past the end of the block")
            linktype, resol, _ = interfaces[iface]
            number += 1
            data = body[epb.size : epb.size + cap]
            yield CaptureRecord(number, ((hi << 32) | lo) * resol, linktype, data, orig)
        elif btype == 3:  # simple packet: length = min(original, snaplen), no timestamp
            if len(body) < spb.size + 4:
                raise WireError("pcapng.spb", offset, "packet block too short")
            (orig,) = spb.unpack_from(body)
            if not interfaces:
                raise WireError("pcapng.spb", offset, "simple packet before any interface")
            linktype, _, snaplen = interfaces[0]
            cap = min(orig, snaplen) if snaplen else orig
            if spb.size + cap > len(body) - 4:
                raise WireError("pcapng.spb", offset,
                                f"packet length {cap} runs past the end of the block")
            number += 1
            yield CaptureRecord(number, 0.0, linktype, body[spb.size : spb.size + cap], orig)
        offset += length


def _if_tsresol(options: bytes, order: str) -> float:
    pos = 0
    while pos + 4 <= len(options):
        code, length = struct.unpack_from(order + "HH", options, pos)
        if code == 0:
            break
        if code == 9 and length >= 1:
            value = options[pos + 4]
            return 2.0 ** -(value & 0x7F) if value & 0x80 else 10.0 ** -value
        pos += 4 + ((length + 3) & ~3)
    return 1e-6


# --- IP decode ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """The transport-layer view of a frame: addresses, ports and payload."""

    proto: str  # "udp" or "tcp"
    src: str
    dst: str
    sport: int
    dport: int
    payload: bytes
    seq: int = 0
    flags: int = 0
    icmp: tuple[int, int] | None = None  # (type, code) of the ICMP error quoting the datagram


IP_MORE_FRAGMENTS, IP_FRAGMENT_OFFSET = 0x2000, 0x1FFF
"""The ``flags_frag`` bits of an IPv4 fragment: more fragments follow; the fragment's offset
in the datagram, in 8-byte units."""
LATER_FRAGMENT_REASON = "IPv4 fragment of a datagram that is not UDP (not reassembled)"
TCP_FRAGMENT_REASON = "IPv4 fragment of a TCP segment (not reassembled)"
SHORT_FRAGMENT_REASON = ("IPv4 non-first fragment cut short by the capture or empty "
                         "(not reassembled)")


@dataclass(frozen=True)
class Fragment:
    """One IPv4 fragment of a UDP datagram, as captured (see :mod:`wire.ipdefrag`).

    UM datagrams are often larger than the link MTU (LBT-RM sends up to 8 KiB by default),
    so the IP layer cuts them and a capture holds the pieces.  tshark reassembles them
    (``ip.defragment``, on by default) and decodes the datagram in the frame of the fragment
    that completes it; :class:`wire.ipdefrag.Defragmenter` does the same for us.

    Attributes:
        src, dst: the IPv4 addresses (dotted).
        ident: the IP identification shared by the datagram's fragments.
        offset: where this fragment's bytes start in the datagram's IP payload, in bytes.
        more: whether more fragments follow (false on the last one).
        payload: the fragment's IP payload (the first fragment's starts with the UDP header).
        vlan: the VLAN ID of the frame's innermost 802.1Q / 802.1ad tag (0: untagged), part
            of the datagram's key for some addresses (:func:`wire.ipdefrag.keyed_ident`).
    """

    src: str
    dst: str
    ident: int
    offset: int
    more: bool
    payload: bytes
    vlan: int = 0


def udp_segment(src: str, dst: str, datagram: bytes) -> Segment:
    """The :class:`Segment` of a whole UDP datagram (its IP payload, e.g. reassembled from
    fragments).  Raises WireError when the UDP header does not fit."""
    if len(datagram) < UDP.size:
        raise WireError("udp", 0, "truncated UDP header")
    sport, dport, _, _ = UDP.unpack_from(datagram, 0)
    return Segment("udp", src, dst, sport, dport, datagram[UDP.size:])


def decode_frame(linktype: int, data: bytes) -> Segment:
    """Strip link, IPv4 and UDP/TCP headers.  Raises WireError naming what is not there,
    and for a fragment of a UDP datagram (frame by frame there is no datagram to give:
    :func:`decode_ip` hands the fragment over for reassembly instead)."""
    found = _decode(linktype, data, fragments=False)
    assert isinstance(found, Segment)
    return found


def decode_ip(linktype: int, data: bytes) -> Segment | Fragment:
    """:func:`decode_frame`, with a fragment of a UDP datagram given as a :class:`Fragment`
    (the one kind of fragment reassembled, as tshark does).  A fragment tshark does not add
    to a reassembly (cut short by the capture's snap length, or without payload) is decoded
    as far as it goes when it is a first fragment, and raises WireError when it is a later
    one, as do later fragments of TCP or other protocols."""
    return _decode(linktype, data, fragments=True)


def _decode(linktype: int, data: bytes, fragments: bool) -> Segment | Fragment:
    ethertype, pos, vlan = _link(linktype, data)
    if ethertype != 0x0800:
        if pos == 0 or linktype != LINKTYPE_ETHERNET:
            version = data[pos] >> 4 if len(data) > pos else 0
            raise WireError("ip", pos, f"not IPv4 (IP version {version})")
        raise WireError("eth", 12, not_ipv4_reason(ethertype))
    if len(data) - pos < IP4.size:
        raise WireError("ip", pos, "truncated IPv4 header")
    ip = IP4.decode(data, pos)
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    if ip["ver_ihl"] >> 4 != 4 or ihl < 20:
        raise WireError("ip", pos, "not an IPv4 header")
    end = min(len(data), pos + ip["total_length"])
    body = pos + ihl
    if ip["flags_frag"] & (IP_MORE_FRAGMENTS | IP_FRAGMENT_OFFSET):
        later = ip["flags_frag"] & IP_FRAGMENT_OFFSET
        if ip["protocol"] == PROTO_UDP:
            if len(data) >= pos + ip["total_length"] > pos + ihl:
                if not fragments:
                    raise WireError("ip", pos + 6, "IPv4 fragment of a UDP datagram "
                                    "(reassembled across frames)")
                return Fragment(ip["src"], ip["dst"], ip["ident"], later * 8,
                                bool(ip["flags_frag"] & IP_MORE_FRAGMENTS), data[body:end],
                                vlan)
            if later:
                raise WireError("ip", pos + 2, SHORT_FRAGMENT_REASON)
            # a first fragment that cannot be reassembled (cut short by the snap length, or
            # empty) is decoded as far as it goes, as tshark does
        elif later or (ip["protocol"] != PROTO_TCP
                       and len(data) >= pos + ip["total_length"] > pos + ihl):
            # tshark holds a whole first fragment of any protocol for reassembly (an ICMP
            # error too: its quoted datagram is not shown); TCP's are refused below
            raise WireError("ip", pos + 6, LATER_FRAGMENT_REASON)
    if ip["protocol"] == 17:
        if end - body < UDP.size:
            raise WireError("udp", body, "truncated UDP header")
        sport, dport, _, _ = UDP.unpack_from(data, body)
        return Segment("udp", ip["src"], ip["dst"], sport, dport, data[body + UDP.size : end])
    if ip["protocol"] == 6:
        if end - body < TCP.size:
            raise WireError("tcp", body, "truncated TCP header")
        sport, dport, seq, _, off_flags, _, _, _ = TCP.unpack_from(data, body)
        start = body + (off_flags >> 12) * 4
        if off_flags >> 12 < 5 or start > end:
            raise WireError("tcp", body + 12,
                            f"data offset {off_flags >> 12} words does not fit the segment")
        if ip["flags_frag"] & IP_MORE_FRAGMENTS:
            raise WireError("ip", pos + 6, TCP_FRAGMENT_REASON)
        return Segment("tcp", ip["src"], ip["dst"], sport, dport, data[start:end], seq,
                       off_flags & 0x3F)
    if ip["protocol"] == PROTO_ICMP:
        quoted = _icmp_quoted_udp(data, body, end)
        if quoted is not None:
            return quoted
    raise WireError("ip", pos + 9, f"IP protocol {ip['protocol']} is neither UDP nor TCP")


def _icmp_quoted_udp(data: bytes, body: int, end: int) -> Segment | None:
    """The UDP datagram an ICMP error quotes (:data:`ICMP_ERROR_TYPES`), with its own
    addresses and ports and its payload as far as quoted; None when it quotes no whole IPv4
    and UDP header of a first fragment."""
    if end - body < ICMP.size + IP4.size:
        return None
    icmp = ICMP.decode(data, body)
    if icmp["type"] not in ICMP_ERROR_TYPES:
        return None
    inner = body + ICMP.size
    ip = IP4.decode(data, inner)
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    udp = inner + ihl
    if (ip["ver_ihl"] >> 4 != 4 or ihl < IP4.size or ip["protocol"] != PROTO_UDP
            or ip["flags_frag"] & IP_FRAGMENT_OFFSET or end - udp < UDP.size):
        return None
    sport, dport, _, _ = UDP.unpack_from(data, udp)
    stop = min(end, inner + ip["total_length"])
    return Segment("udp", ip["src"], ip["dst"], sport, dport, data[udp + UDP.size:stop],
                   icmp=(icmp["type"], icmp["code"]))


VLAN_ETHERTYPES = (0x8100, 0x88A8)
"""The tag protocol IDs of 802.1Q and 802.1ad (QinQ) VLAN tags."""

VLAN_ID_MASK = 0x0FFF
"""The VLAN ID's bits of a tag's TCI."""


def _link(linktype: int, data: bytes) -> tuple[int, int, int]:
    """The link header's ethertype, where the network header starts, and the VLAN ID of the
    innermost VLAN tag (0: none)."""
    if linktype == LINKTYPE_ETHERNET:
        if len(data) < ETH.size:
            raise WireError("eth", 0, "truncated Ethernet header")
        ethertype, pos, vlan = ETH.unpack_from(data)[2], ETH.size, 0
        while ethertype in VLAN_ETHERTYPES and len(data) >= pos + VLAN.size:
            tci, ethertype = VLAN.unpack_from(data, pos)
            vlan = tci & VLAN_ID_MASK
            pos += VLAN.size
        return ethertype, pos, vlan
    if linktype == LINKTYPE_LINUX_SLL and len(data) >= SLL.size:
        return SLL.unpack_from(data)[-1], SLL.size, 0
    if linktype == LINKTYPE_LINUX_SLL2 and len(data) >= SLL2.size:
        return SLL2.unpack_from(data)[0], SLL2.size, 0
    if linktype == LINKTYPE_NULL and len(data) >= 4:
        family = int.from_bytes(data[:4], "little")
        if family > 0xFFFF:
            family = int.from_bytes(data[:4], "big")
        return (0x0800 if family == 2 else 0), 4, 0
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, 12) and data:
        return (0x0800 if data[0] >> 4 == 4 else 0), 0, 0
    raise WireError("frame", 0, f"unsupported or truncated link type {linktype}")


# --- writing ------------------------------------------------------------------------------------


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _mac(ip: str) -> bytes:
    return b"\x02\x00" + ipv4_to_int(ip).to_bytes(4, "big")


def ipv4_frame(src: str, dst: str, proto: int, l4: bytes, ident: int = 0,
               flags_frag: int = 0x4000) -> bytes:
    """Ethernet + IPv4 around an L4 segment (checksums filled in); ``flags_frag`` is "don't
    fragment" unless given."""
    values = {"ver_ihl": 0x45, "tos": 0, "total_length": IP4.size + len(l4), "ident": ident,
              "flags_frag": flags_frag, "ttl": 64, "protocol": proto, "checksum": 0,
              "src": src, "dst": dst}
    header = IP4.pack(values)
    values["checksum"] = _checksum(header)
    eth = ETH.pack({"dst": _mac(dst), "src": _mac(src), "ethertype": 0x0800})
    return eth + IP4.pack(values) + l4


def _pseudo(src: str, dst: str, proto: int, length: int) -> bytes:
    return struct.pack("!IIBBH", ipv4_to_int(src), ipv4_to_int(dst), 0, proto, length)


def udp_frame(src: str, sport: int, dst: str, dport: int, payload: bytes) -> bytes:
    values = {"sport": sport, "dport": dport, "length": UDP.size + len(payload), "checksum": 0}
    seg = UDP.pack(values) + payload
    values["checksum"] = _checksum(_pseudo(src, dst, 17, len(seg)) + seg) or 0xFFFF
    return ipv4_frame(src, dst, 17, UDP.pack(values) + payload)


def udp_fragments(src: str, sport: int, dst: str, dport: int, payload: bytes, ident: int,
                  mtu: int = 1500) -> list[bytes]:
    """The frames of one UDP datagram as sent on a link of ``mtu`` bytes: cut into IPv4
    fragments when it is larger (:func:`fragment_frame`)."""
    return fragment_frame(udp_frame(src, sport, dst, dport, payload), mtu, ident)


def fragment_frame(frame: bytes, mtu: int, ident: int) -> list[bytes]:
    """An Ethernet frame holding a UDP datagram larger than ``mtu`` (the IP datagram's
    limit: 68 or more) cut into IPv4 fragments as a sender's IP layer cuts it: each
    fragment's payload a multiple of 8 bytes but the last's, identification ``ident``, the
    "don't fragment" bit cleared, header checksums recomputed.  Any other frame (not IPv4,
    not UDP, a fragment already, or small enough) is returned as it is, alone."""
    if len(frame) < ETH.size + IP4.size or ETH.unpack_from(frame)[2] != 0x0800:
        return [frame]
    ip = IP4.decode(frame, ETH.size)
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    total = ip["total_length"]
    if (ip["protocol"] != PROTO_UDP or total <= mtu or len(frame) < ETH.size + total
            or ip["flags_frag"] & (IP_MORE_FRAGMENTS | IP_FRAGMENT_OFFSET) or mtu < 68):
        return [frame]
    eth, options = frame[:ETH.size], frame[ETH.size + IP4.size:ETH.size + ihl]
    payload = frame[ETH.size + ihl:ETH.size + total]
    step = (mtu - ihl) // 8 * 8
    out = []
    for at in range(0, len(payload), step):
        piece = payload[at:at + step]
        values = {**ip, "total_length": ihl + len(piece), "ident": ident & 0xFFFF,
                  "flags_frag": (IP_MORE_FRAGMENTS if at + step < len(payload) else 0) | at // 8,
                  "checksum": 0}
        values["checksum"] = _checksum(IP4.pack(values) + options)
        out.append(eth + IP4.pack(values) + options + piece)
    return out


def tcp_frame(src: str, sport: int, dst: str, dport: int, seq: int, ack: int, flags: int,
              payload: bytes = b"") -> bytes:
    values = {"sport": sport, "dport": dport, "seq": seq & 0xFFFFFFFF, "ack": ack & 0xFFFFFFFF,
              "offset_flags": (5 << 12) | flags, "window": 65535, "checksum": 0, "urgent": 0}
    seg = TCP.pack(values) + payload
    values["checksum"] = _checksum(_pseudo(src, dst, 6, len(seg)) + seg)
    return ipv4_frame(src, dst, 6, TCP.pack(values) + payload)


class TcpConversation:
    """Frames of one TCP connection with consistent sequence numbers (for test captures)."""

    def __init__(self, client: tuple[str, int], server: tuple[str, int],
                 isn: tuple[int, int] = (1000, 5000)) -> None:
        self.client, self.server = client, server
        self.next_seq = {True: isn[0], False: isn[1]}

    def _frame(self, from_client: bool, flags: int, payload: bytes = b"") -> bytes:
        a, b = (self.client, self.server) if from_client else (self.server, self.client)
        seq = self.next_seq[from_client]
        ack = self.next_seq[not from_client] if flags & TCP_ACK else 0
        advance = len(payload) + (1 if flags & (TCP_SYN | TCP_FIN) else 0)
        self.next_seq[from_client] = (seq + advance) & 0xFFFFFFFF
        return tcp_frame(a[0], a[1], b[0], b[1], seq, ack, flags, payload)

    def handshake(self) -> list[bytes]:
        syn = self._frame(True, TCP_SYN)
        synack = self._frame(False, TCP_SYN | TCP_ACK)
        return [syn, synack, self._frame(True, TCP_ACK)]

    def send(self, from_client: bool, payload: bytes) -> bytes:
        return self._frame(from_client, TCP_PSH | TCP_ACK, payload)

    def close(self) -> list[bytes]:
        return [self._frame(True, TCP_FIN | TCP_ACK), self._frame(False, TCP_FIN | TCP_ACK),
                self._frame(True, TCP_ACK)]


class PcapWriter:
    """A classic little-endian pcap file (microsecond or nanosecond timestamps)."""

    def __init__(self, path: str | Path, linktype: int = LINKTYPE_ETHERNET,
                 nanosecond: bool = False) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in close()/__exit__
        self._scale = 10**9 if nanosecond else 10**6
        self._record = derive(PcapRecordLE)
        self._fh.write(derive(PcapHeaderLE).pack({
            "magic": PCAP_MAGIC_NS if nanosecond else PCAP_MAGIC_US, "version_major": 2,
            "version_minor": 4, "thiszone": 0, "sigfigs": 0, "snaplen": 262144,
            "linktype": linktype}))

    def write(self, ts: float, frame: bytes) -> None:
        ticks = round(ts * self._scale)
        sec, frac = divmod(ticks, self._scale)
        self._fh.write(self._record.pack({"ts_sec": sec, "ts_frac": frac,
                                          "incl_len": len(frame), "orig_len": len(frame)}))
        self._fh.write(frame)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_pcap(path: str | Path, frames: Iterable[bytes], start: float = 0.0,
               step: float = 1.0) -> int:
    """Write Ethernet frames at ``start``, ``start+step``, ...; returns the frame count."""
    count = 0
    with PcapWriter(path) as writer:
        for count, frame in enumerate(frames, 1):
            writer.write(start + (count - 1) * step, frame)
    return count


# --- accessors for split readers (spark_analysis.splits) ----------------------------------------


def _pcapng_option_struct(u16: cs.Construct) -> cs.Struct:
    return cs.Struct(field("code", u16), field("length", u16))


_NG_OPTION = {"<": derive(_pcapng_option_struct(cs.Int16ul)),
              ">": derive(_pcapng_option_struct(cs.Int16ub))}


def pcapng_layouts(order: str) -> tuple[FastLayout, ...]:
    """The derived (block, idb, epb, spb, shb) layouts of one byte order (``"<"`` or ``">"``).

    Readers that walk a pcapng file themselves (the Spark split reader starts mid-file) use
    the same compiled layouts as :func:`read_capture` instead of writing the blocks again."""
    return tuple(_NG[order])


def pcapng_options(options: bytes, order: str) -> Iterator[tuple[int, bytes]]:
    """(code, value) of each option in a block's option area, up to ``opt_endofopt``.

    A truncated option ends the walk: options are metadata, a damaged one must not make the
    packets unreadable (the same tolerance as the ``if_tsresol`` lookup of read_capture)."""
    layout = _NG_OPTION[order]
    pos = 0
    while pos + layout.size <= len(options):
        code, length = layout.unpack_from(options, pos)
        if code == 0:
            return
        start = pos + layout.size
        if start + length > len(options):
            return
        yield code, options[start : start + length]
        pos = start + ((length + 3) & ~3)
