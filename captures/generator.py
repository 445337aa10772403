"""Generate UM persistence captures of any size from a :class:`~captures.scenarios.Scenario`.

The generator plays a scenario out in virtual time and writes what a capture point next to
the sources' switch port would see: topic resolution through a unicast resolver daemon (TQR,
TIR, keepalives), source and receiver registrations with every store (PREG / PREG-RESP with
session ID, capability and client-lifetime headers), SRI with store and store-group records,
data on LBT-RM, LBT-RU or LBT-TCP transport sessions, stability ACKs from every store,
consumption ACKs from every receiver to every store, keepalives, transport-level loss repair
(NAK, NCF, retransmission), UME recovery from the stores (RXREQ / RETRANS), proactive
retransmissions, restarts, and refused registrations.  Every TCP connection has consistent
sequence and acknowledgement numbers (handshake, delayed pure ACKs, orderly close).

Why the wire backend is fast (10 million frames in about 40 s of one core, ~240k frames/s):

* every distinct frame is built **once** with the :mod:`wire` encoders and kept as a
  :class:`FrameTemplate`; what varies between two frames of the same kind (TCP sequence and
  acknowledgement numbers, transport and topic sequence numbers) is a *slot* whose offset is
  read off the :mod:`wire` structs (:func:`member_offsets`), never written by hand;
* the UDP/TCP checksum is updated arithmetically from the template's own checksum (ones'
  complement sums are linear, RFC 1624), so no byte is summed per frame; IP header checksums
  never change because no IP header field varies;
* the simulation only appends one row of integers per frame; frames are rendered and written
  in chunks by numpy (:class:`CaptureWriter`), so memory stays bounded whatever the size.

Backends: :class:`Backend` is what produces the traffic; the writer, the sidecar and the CLI
are shared.  :class:`WireBackend` (``wire``, this module) scripts the behaviour itself and
encodes with :mod:`wire`: it models LBT-RM/LBT-RU, loss and repair, and is the one for huge
captures.  :class:`captures.cores.CoresBackend` (``cores``) runs the reference
implementation's sans-IO cores on ``reference_impl.sim`` and streams what they send into the
same :class:`FrameSink` (``emit_frame``): the behavioural reference, ~15-20x slower, LBT-TCP
only.  The default, ``auto`` (:func:`select_backend`), is ``cores`` for scenarios the cores
play entirely (LBT-TCP sources, no loss: the ``tcp-*`` presets) and ``wire`` for the rest.

Sizes: ``messages`` runs the scenario to its end (drain and orderly close);
``packets`` writes exactly that many frames, cutting the run like ``tcpdump -c`` does: the
message count is estimated from a short calibration run, restarts are placed on that
estimate, and the capture ends after frame N (the last exchanges may be incomplete).

Ports: everything but the stores is on a port tshark decodes with default preferences
(resolver clients 14402-14404 to lbmrd 15380, LBT-RU 14380/14360, LBT-RM 224.10.10.10-14:14400
with NAKs to 14390, LBT-TCP 14371, request ports 14391-14392, client ports from 40000).  The
stores listen on ``scenario.store_port`` (14567): tshark and ``ump dissect`` need
``--store-port 14567`` (``-d tcp.port==14567,lbttcp``).  With ``lbtrm_ephemeral_port`` (the
``real-traits`` preset) LBT-RM data leaves from an ephemeral port while NAKs still go to 14390,
the port the headers name; with ``resolver_multicast`` topic resolution is on
224.9.10.11:12965.  Hosts are 127.<role>.x.y (role 1 sources, 2 receivers, 3 stores, 4 the
misconfigured source; lbmrd is 127.0.0.1): nothing is ever sent, the addresses only have to be
distinct.

The sidecar ``<capture>.meta.json`` holds the scenario, the generator settings, the port map
(``dissect_args``, ``tshark_args``), hosts, topics with their RegIDs, transport session keys
and ``expected``: counts computed from the frames written (each template knows what one copy
counts for, read off the wire objects the way the dissector reads them):

* ``frames`` and ``frames_by_transport`` (``lbmr``/``lbtru``/``lbtrm``/``lbttcp``; ``none`` for
  TCP segments without UM payload and for IPv4 fragments that do not complete a datagram);
* ``ipv4_fragments``, with ``ip_mtu``: frames that are IPv4 fragments (a datagram's UM
  shows in the frame of its last fragment, as tshark reassembles it);
* ``lbmc``: LBMC messages by tshark label (``DATA``, ``RX-DATA``, ``PREG``, ``ACK`` ...);
* ``lbtru`` / ``lbtrm``: transport packets by type (``DATA``, ``DATA(RX)``, ``NAK``, ``NCF``,
  ``SM``, ``CREQ``); ``lbmr``: ``tqr``, ``wc_tqr`` (wildcard) and ``tir`` records,
  ``keepalive`` packets;
* ``registrations.{source,receiver}``: ``requests``, ``accepted``, ``old-client``,
  ``error-N``; ``acks.{stable,cdelv}``; ``keepalives.{store,source,receiver}``; ``rxreq``;
  ``retransmissions.{store,proactive,lbtrm,lbtru}``;
* per transport session (``lbtrm:<source ip>:<NAK port>:<session id hex>``,
  ``lbtru:<ip>:<port>:<id>``, ``lbttcp:<ip>:<port>:<id>``): ``naks.*.{packets,sqns}``,
  ``ncfs.*.{packets,sqns}``, ``rx.*`` (retransmitted datagrams), ``icmp.port-unreachable.*``
  (NAKs that came back quoted in an ICMP error: the frame shows a NAK, but it is a bounce, not
  counted in ``naks``), and ``data.<session>:<tidx>``
  (new data messages on the wire, one per copy: LBT-RU sends one per receiver and store).

Everything random comes from generators seeded from the seed and a purpose name, so one seed
gives the same bytes on every machine.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import random
import re
import struct
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import construct as cs
import numpy as np

from wire import lbmr, lbtrm, lbtru
from wire import pcap as wpcap
from wire.fastpath import FastLayout, derive
from wire.fields import field as wfield
from wire.lbmc import (
    DATA_BASE,
    AckType,
    Header,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    PregError,
    Sri,
    SriReq,
    TcpSid,
    TopicIdx,
    Topicname,
    UmeAck,
    UmeCapability,
    UmeClientLifetime,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeSid,
    UmeStoreExt,
    UmeStoreGroup,
    UmeStoreid,
)
from wire.pcap import ETH, IP4, TCP, TCP_ACK, TCP_FIN, UDP, TcpConversation, tcp_frame, udp_frame
from wire.tshark import PortMap

from .mtu import LinkMtu
from .scenarios import Restart, Scenario, ScenarioError, Transport

__all__ = [
    "BACKENDS",
    "Backend",
    "CaptureFormat",
    "CaptureWriter",
    "FrameSink",
    "FrameTemplate",
    "GenerationResult",
    "WireBackend",
    "calibrate",
    "generate",
    "member_offsets",
    "port_map",
    "select_backend",
]

MASK32 = 0xFFFFFFFF
NS = 1_000_000_000
EPOCH_NS = 1_700_000_000 * NS
"""Capture start (2023-11-14): a fixed epoch keeps captures byte-identical between runs."""
US = 1_000


# =============================================================================================
# Offsets read off the wire structs
# =============================================================================================

_FORMAT_TOKEN = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def member_offsets(layout: FastLayout) -> dict[str, tuple[int, int]]:
    """``name -> (offset, size)`` of every member of a derived fast layout.

    The layout's compiled :mod:`struct` format is walked letter by letter, so the offsets are
    those of the Construct definition the layout was derived from.
    """
    out: dict[str, tuple[int, int]] = {}
    names = iter(layout.names)
    pos = 0
    for count, letter in _FORMAT_TOKEN.findall(layout.format.lstrip("<>!=@")):
        repeat = int(count) if count else 1
        size = repeat if letter in "sxp" else repeat * struct.calcsize(">" + letter)
        if letter != "x":
            out[next(names)] = (pos, size)
        pos += size
    return out


def _offset(layout: FastLayout, name: str) -> int:
    return member_offsets(layout)[name][0]


L4 = ETH.size + IP4.size
"""Where the UDP/TCP header starts in the Ethernet frames :mod:`wire.pcap` builds."""
UDP_PAYLOAD = L4 + UDP.size
TCP_PAYLOAD = L4 + TCP.size  # tcp_frame writes no TCP options
TCP_SEQ = L4 + _offset(TCP, "seq")
TCP_ACK_AT = L4 + _offset(TCP, "ack")
CHECKSUM_AT = {6: L4 + _offset(TCP, "checksum"), 17: L4 + _offset(UDP, "checksum")}
IP_PROTOCOL_AT = ETH.size + _offset(IP4, "protocol")
LBMC_SQN = _offset(DATA_BASE, "sqn")


def header_offset(message: LbmcMessage, index: int) -> int:
    """Offset of ``message.headers[index]`` inside the built message."""
    pos = message.base_size
    for header in message.headers[:index]:
        pos += len(header.encode(0))
    return pos


def header_member(message: LbmcMessage, index: int, name: str) -> int:
    """Offset of member ``name`` of the fixed-layout header ``index`` inside the message."""
    header = message.headers[index]
    assert isinstance(header, Header) and header.kind.fast is not None
    return header_offset(message, index) + _offset(header.kind.fast, name)


def transport_prefix(packet: lbtru.LbtruPacket | lbtrm.LbtrmPacket) -> int:
    """Bytes before the LBMC payload of a transport DATA packet (header, body, options)."""
    return len(packet.build()) - sum(len(m.build()) for m in packet.messages())


# =============================================================================================
# Frame templates and the checksum arithmetic
# =============================================================================================

Tally = tuple[tuple[tuple[str, ...], int], ...]
"""What one frame adds to the expected counts: ((key path, increment), ...)."""


class FrameTemplate:
    """One frame built by the wire encoders, plus the slots that vary between its copies.

    Attributes:
        frame: the bytes as built (slots hold the values used to build it).
        slots: ``(offset, size)`` of each varying big-endian unsigned field, in argument order.
        tally: what each copy adds to the expected counts.
        payload_len: TCP payload length (how far one copy advances the sequence number).

    The L4 checksum of a copy is the template's checksum corrected by the slot values: the
    ones' complement sum is linear, and a big-endian field ending at an even offset of the
    segment adds its value, one ending at an odd offset its value times 256 (mod 65535).
    """

    __slots__ = ("base", "checksum_at", "frame", "payload_len", "slots", "tally", "udp",
                 "weights")

    def __init__(self, frame: bytes, slots: Sequence[tuple[int, int]], tally: Tally,
                 payload_len: int = 0) -> None:
        self.frame = bytes(frame)
        self.slots = tuple(slots)
        self.tally = tally
        self.payload_len = payload_len
        proto = self.frame[IP_PROTOCOL_AT]
        if proto not in CHECKSUM_AT:
            raise ValueError(f"IP protocol {proto} is neither UDP nor TCP")
        self.udp = proto == 17
        self.checksum_at = CHECKSUM_AT[proto]
        self.weights = tuple(1 if (off - L4 + size) % 2 == 0 else 256 for off, size in slots)
        stored = int.from_bytes(self.frame[self.checksum_at : self.checksum_at + 2], "big")
        total = ~stored & 0xFFFF  # the folded sum the checksum was made from
        for (off, size), weight in zip(self.slots, self.weights, strict=True):
            if off < L4 or off + size > len(self.frame):
                raise ValueError(f"slot at {off}+{size} is outside the L4 segment")
            total -= int.from_bytes(self.frame[off : off + size], "big") * weight
        self.base = total % 0xFFFF

    def slot_values(self) -> tuple[int, ...]:
        return tuple(int.from_bytes(self.frame[o : o + n], "big") for o, n in self.slots)

    def render(self, values: Sequence[int]) -> bytes:
        """The copy with ``values`` in the slots (the scalar twin of the numpy writer)."""
        out = bytearray(self.frame)
        total = self.base
        for (off, size), weight, value in zip(self.slots, self.weights, values, strict=False):
            out[off : off + size] = value.to_bytes(size, "big")
            total += value * weight
        rest = total % 0xFFFF
        checksum = 0xFFFF - rest if rest else 0
        if self.udp and checksum == 0:
            checksum = 0xFFFF  # UDP: 0 means "no checksum", so a real zero is sent as 0xFFFF
        out[self.checksum_at : self.checksum_at + 2] = checksum.to_bytes(2, "big")
        return bytes(out)


def checked_template(frame: bytes, slots: Sequence[tuple[int, int]], values: Sequence[int],
                     tally: Tally, payload_len: int = 0) -> FrameTemplate:
    """A template whose slots are proven to hold ``values`` (the values it was built with):
    an offset that does not point at its field fails here, at creation."""
    template = FrameTemplate(frame, slots, tally, payload_len)
    got = template.slot_values()
    want = tuple(v & ((1 << (8 * n)) - 1) for v, (_, n) in zip(values, slots, strict=True))
    if got != want:
        raise AssertionError(f"template slots read {got}, built with {want}")
    return template


# =============================================================================================
# Output formats
# =============================================================================================


def _pcapng_extras(u16: cs.Construct, i64: cs.Construct) -> tuple[cs.Struct, cs.Struct]:
    """The two pcapng pieces :mod:`wire.pcap` does not define (it only reads pcapng): the SHB's
    section length and the option header.  HINT: belongs in wire/pcap.py; asked the lead."""
    section = cs.Struct(wfield("section_length", i64))
    option = cs.Struct(wfield("code", u16), wfield("length", u16))
    return section, option


@dataclass(frozen=True)
class CaptureFormat:
    """pcap or pcapng, micro- or nanosecond timestamps, little- or big-endian file headers."""

    pcapng: bool = False
    nanosecond: bool = False
    big_endian: bool = False

    @property
    def order(self) -> str:
        return ">" if self.big_endian else "<"

    def describe(self) -> dict[str, Any]:
        return {"format": "pcapng" if self.pcapng else "pcap", "nanosecond": self.nanosecond,
                "big_endian": self.big_endian}


def _header_bytes(layout: FastLayout, columns: dict[str, Any], count: int) -> np.ndarray:
    """``count`` packed copies of ``layout`` as an (count, size) uint8 array."""
    rows = np.zeros(count, dtype=layout.dtype())
    for name, values in columns.items():
        rows[name] = values
    return rows.view(np.uint8).reshape(count, layout.size)


class CaptureWriter:
    """Writes frames to a pcap/pcapng stream, a chunk of rows at a time.

    A row is ``(ts_ns, template id, slot values...)``; one-shot frames (built whole, not from
    a template) have template id -1 and their index in the chunk's list as first value.
    """

    LINKTYPE = wpcap.LINKTYPE_ETHERNET
    SNAPLEN = 262144

    def __init__(self, fh: IO[bytes], fmt: CaptureFormat, mtu: int = 0) -> None:
        self.fh = fh
        self.fmt = fmt
        self.link = LinkMtu(mtu) if mtu else None
        u16, u32 = (cs.Int16ub, cs.Int32ub) if fmt.big_endian else (cs.Int16ul, cs.Int32ul)
        i64 = cs.Int64sb if fmt.big_endian else cs.Int64sl
        if fmt.pcapng:
            block, idb, epb, _, shb = (derive(s) for s in wpcap._pcapng_structs(u16, u32))
            section, option = (derive(s) for s in _pcapng_extras(u16, i64))
            self._block, self._epb, self._len = block, epb, derive(cs.Struct(
                wfield("block_length", u32)))
            self.record_size = block.size + epb.size
            self._write_pcapng_header(block, idb, shb, section, option)
        else:
            header = derive(wpcap.PcapHeaderBE if fmt.big_endian else wpcap.PcapHeaderLE)
            self._record = derive(wpcap.PcapRecordBE if fmt.big_endian else wpcap.PcapRecordLE)
            self.record_size = self._record.size
            magic = wpcap.PCAP_MAGIC_NS if fmt.nanosecond else wpcap.PCAP_MAGIC_US
            self.fh.write(header.pack({
                "magic": magic, "version_major": 2, "version_minor": 4, "thiszone": 0,
                "sigfigs": 0, "snaplen": self.SNAPLEN, "linktype": self.LINKTYPE}))

    def _write_pcapng_header(self, block: FastLayout, idb: FastLayout, shb: FastLayout,
                             section: FastLayout, option: FastLayout) -> None:
        trailer = self._len.size

        def emit(btype: int, body: bytes) -> None:
            length = block.size + len(body) + trailer
            self.fh.write(block.pack({"block_type": btype, "block_length": length}) + body
                          + self._len.pack({"block_length": length}))

        end = option.pack({"code": 0, "length": 0})
        emit(wpcap.PCAPNG_SHB, shb.pack({"byte_order_magic": wpcap.PCAPNG_BOM,
                                         "version_major": 1, "version_minor": 0})
             + section.pack({"section_length": -1}))
        body = idb.pack({"linktype": self.LINKTYPE, "reserved": 0, "snaplen": self.SNAPLEN})
        if self.fmt.nanosecond:  # if_tsresol = 10^-9; the default is 10^-6
            body += option.pack({"code": 9, "length": 1}) + bytes([9, 0, 0, 0]) + end
        emit(1, body)

    def record_lengths(self, frame_lengths: np.ndarray) -> np.ndarray:
        if self.fmt.pcapng:
            return self.record_size + ((frame_lengths + 3) & ~3) + self._len.size
        return self.record_size + frame_lengths

    def _headers(self, ts_ns: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        count = len(ts_ns)
        if self.fmt.pcapng:
            ticks = ts_ns if self.fmt.nanosecond else ts_ns // US
            total = self.record_lengths(lengths)
            block = _header_bytes(self._block, {"block_type": 6, "block_length": total}, count)
            epb = _header_bytes(self._epb, {
                "interface_id": 0, "ts_high": ticks >> 32, "ts_low": ticks & MASK32,
                "captured_len": lengths, "orig_len": lengths}, count)
            return np.concatenate([block, epb], axis=1)
        sec = ts_ns // NS
        frac = ts_ns % NS if self.fmt.nanosecond else (ts_ns % NS) // US
        return _header_bytes(self._record, {"ts_sec": sec, "ts_frac": frac,
                                            "incl_len": lengths, "orig_len": lengths}, count)

    def write_rows(self, rows: np.ndarray, table: TemplateTable,
                   one_shots: Sequence[bytes]) -> None:
        """Render and write ``rows`` (an (n, 2 + SLOTS) int64 array) in order.

        Everything is done for the whole chunk at once, whatever the mix of templates: the
        template bytes are gathered with one fancy index, then each slot column and the
        checksums are written with a handful of vector operations.
        """
        if not len(rows):
            return
        ts, tids = rows[:, 0], rows[:, 1]
        single = tids < 0
        normal = np.flatnonzero(~single)
        tt = tids[normal]
        lengths = np.zeros(len(rows), dtype=np.int64)
        lengths[normal] = table.length[tt]
        for i in np.flatnonzero(single):
            lengths[i] = len(one_shots[int(rows[i, 2])])
        buf, frame_at = self._records(ts, lengths)
        for i in np.flatnonzero(single):
            data = one_shots[int(rows[i, 2])]
            buf[frame_at[i] : frame_at[i] + len(data)] = np.frombuffer(data, dtype=np.uint8)
        if len(normal):
            _render(buf, frame_at[normal], tt, rows[normal, 2:], table)
        if self.link is not None and any(self.link.over(n) for n in lengths.tolist()):
            buf = self._fragmented(buf, ts, frame_at, lengths, self.link)
        self.fh.write(buf.data)

    def _records(self, ts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A buffer of records with their headers (and pcapng trailers) for frames of
        ``lengths`` at ``ts``, and where each frame's bytes go in it."""
        sizes = self.record_lengths(lengths)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        buf = np.zeros(int(starts[-1] + sizes[-1]), dtype=np.uint8)
        head = self._headers(ts, lengths)
        buf[starts[:, None] + np.arange(head.shape[1])] = head
        if self.fmt.pcapng:
            tail = _header_bytes(self._len, {"block_length": sizes}, len(lengths))
            buf[(starts + sizes - tail.shape[1])[:, None] + np.arange(tail.shape[1])] = tail
        return buf, starts + head.shape[1]

    def _fragmented(self, buf: np.ndarray, ts: np.ndarray, frame_at: np.ndarray,
                    lengths: np.ndarray, link: LinkMtu) -> np.ndarray:
        """The chunk's records again, each frame as ``link`` cuts it."""
        times: list[int] = []
        frames: list[bytes] = []
        for t, at, length in zip(ts.tolist(), frame_at.tolist(), lengths.tolist(), strict=True):
            pieces = link.cut(buf[at:at + length].tobytes())
            times += [t] * len(pieces)
            frames += pieces
        out, starts = self._records(np.array(times, np.int64),
                                    np.array([len(f) for f in frames], np.int64))
        for at, frame in zip(starts.tolist(), frames, strict=True):
            out[at:at + len(frame)] = np.frombuffer(frame, np.uint8)
        return out


def _render(buf: np.ndarray, at: np.ndarray, tids: np.ndarray, values: np.ndarray,
            table: TemplateTable) -> None:
    """Copy template ``tids[i]`` to ``buf[at[i]:]`` with ``values[i]`` in its slots and its
    checksum corrected (the vector twin of :meth:`FrameTemplate.render`)."""
    lengths = table.length[tids]
    firsts = np.zeros(len(tids), dtype=np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    within = np.arange(int(firsts[-1] + lengths[-1]), dtype=np.int64)
    buf[np.repeat(at - firsts, lengths) + within] = table.data[
        np.repeat(table.start[tids] - firsts, lengths) + within]
    total = table.base[tids].copy()
    for j in range(values.shape[1]):
        offsets = table.slot_offset[tids, j]
        used = offsets >= 0
        if not used.any():
            continue
        column = values[:, j]
        total += column * table.slot_weight[tids, j]
        where, v, size = at[used] + offsets[used], column[used], table.slot_size[tids[used], j]
        for k in range(4):
            byte = size > k
            if byte.any():
                buf[where[byte] + k] = (v[byte] >> (8 * (size[byte] - 1 - k))) & 0xFF
    rest = total % 0xFFFF
    checksum = np.where(rest == 0, 0, 0xFFFF - rest)
    checksum = np.where(table.udp[tids] & (checksum == 0), 0xFFFF, checksum)
    where = at + table.checksum_at[tids]
    buf[where] = checksum >> 8
    buf[where + 1] = checksum & 0xFF


# =============================================================================================
# The sink between a backend and the writer
# =============================================================================================

SLOTS = 4
ROW = 2 + SLOTS


class TemplateTable:
    """Every template of a run as flat numpy arrays (what :func:`_render` indexes)."""

    def __init__(self) -> None:
        self.templates: list[FrameTemplate] = []
        self._synced = 0
        empty = np.zeros(0, dtype=np.int64)
        self.length, self.start, self.base, self.checksum_at = empty, empty, empty, empty
        self.data = np.zeros(0, dtype=np.uint8)
        self.udp = np.zeros(0, dtype=bool)
        self.slot_offset = self.slot_size = self.slot_weight = np.zeros((0, SLOTS), np.int64)

    def add(self, template: FrameTemplate) -> int:
        for _, size in template.slots:
            if size not in (1, 2, 4):
                raise ValueError(f"slot size {size}: only 1, 2 or 4 bytes are supported")
        if len(template.slots) > SLOTS:
            raise ValueError(f"a template has at most {SLOTS} slots")
        self.templates.append(template)
        return len(self.templates) - 1

    def sync(self) -> None:
        """Extend the arrays with the templates added since the last chunk."""
        old, count = self._synced, len(self.templates)
        if count == old:
            return
        new = self.templates[old:]
        self._synced = count
        lengths = np.array([len(t.frame) for t in new], dtype=np.int64)
        starts = np.zeros(len(new), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        starts += len(self.data)
        slots = np.zeros((len(new), 3, SLOTS), dtype=np.int64)
        slots[:, 0, :] = -1
        for i, t in enumerate(new):
            for j, ((off, size), weight) in enumerate(zip(t.slots, t.weights, strict=True)):
                slots[i, :, j] = (off, size, weight)
        self.length = np.concatenate([self.length, lengths])
        self.start = np.concatenate([self.start, starts])
        self.data = np.concatenate([self.data, np.frombuffer(b"".join(t.frame for t in new),
                                                             dtype=np.uint8)])
        self.base = np.concatenate([self.base, np.array([t.base for t in new], dtype=np.int64)])
        self.checksum_at = np.concatenate([self.checksum_at, np.array(
            [t.checksum_at for t in new], dtype=np.int64)])
        self.udp = np.concatenate([self.udp, np.array([t.udp for t in new], dtype=bool)])
        self.slot_offset = np.concatenate([self.slot_offset, slots[:, 0, :]])
        self.slot_size = np.concatenate([self.slot_size, slots[:, 1, :]])
        self.slot_weight = np.concatenate([self.slot_weight, slots[:, 2, :]])


class FrameSink:
    """Collects frames from a backend: templates, one row per frame, and the expected counts.

    ``limit`` caps the number of frames (the ``--packets`` cut): frames offered after it are
    dropped, :attr:`full` turns true and the backend stops.  Without a writer the sink only
    counts (calibration runs).
    """

    def __init__(self, writer: CaptureWriter | None = None, limit: int | None = None,
                 chunk_rows: int = 16384, progress: Any = None) -> None:
        self.writer = writer
        self.count_only = writer is None
        self.limit = sys.maxsize if limit is None else limit
        self.table = TemplateTable()
        self.keys: dict[Hashable, int] = {}
        self.payload_len: list[int] = []
        self.counts = np.zeros(0, dtype=np.int64)
        self.frames = 0
        self.full = limit is not None and limit <= 0
        self.first_ts: int | None = None
        self.last_ts = 0
        self._rows = array("q")
        self._one_shots: list[bytes] = []
        self._one_shot_tally: Counter[tuple[str, ...]] = Counter()
        self._flush_at = chunk_rows * ROW
        self._progress = progress

    @property
    def templates(self) -> list[FrameTemplate]:
        return self.table.templates

    def template(self, key: Hashable, make: Callable[[], FrameTemplate]) -> int:
        """The id of the template for ``key``, built by ``make`` the first time.

        A counting sink builds no templates (calibration only needs frame counts): every key
        maps to template 0, a placeholder."""
        tid = self.keys.get(key)
        if tid is None and self.count_only:
            if not self.table.templates:
                self.table.add(FrameTemplate(udp_frame("0.0.0.0", 0, "0.0.0.0", 0, b""), (), ()))
                self.payload_len.append(0)
            self.keys[key] = tid = 0
        if tid is None:
            template = make()
            tid = self.table.add(template)
            self.payload_len.append(template.payload_len)
            self.keys[key] = tid
        return tid

    def emit(self, ts: int, tid: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> None:
        """One copy of template ``tid`` at ``ts`` (ns since 1970) with slot values."""
        if self.frames >= self.limit:
            self.full = True
            return
        self.frames += 1
        rows = self._rows
        rows.extend((ts, tid, a, b, c, d))
        if len(rows) >= self._flush_at:
            self.flush()

    def emit_frame(self, ts: int, frame: bytes, tally: Tally) -> None:
        """A frame built whole (rare frames: handshakes, registrations, NAK lists...)."""
        if self.frames >= self.limit:
            self.full = True
            return
        self.frames += 1
        for key, n in tally:
            self._one_shot_tally[key] += n
        self._rows.extend((ts, -1, len(self._one_shots), 0, 0, 0))
        self._one_shots.append(frame)
        if len(self._rows) >= self._flush_at:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        rows = np.frombuffer(self._rows, dtype=np.int64).reshape(-1, ROW)
        ts, tids = rows[:, 0], rows[:, 1]
        if self.first_ts is None:
            self.first_ts = int(ts[0])
        if ts[0] < self.last_ts or (len(ts) > 1 and bool((np.diff(ts) < 0).any())):
            raise AssertionError("frames out of time order (a backend bug)")
        self.last_ts = int(ts[-1])
        used = tids[tids >= 0]
        if len(self.counts) < len(self.table.templates):
            self.counts = np.concatenate([self.counts, np.zeros(
                len(self.table.templates) - len(self.counts), dtype=np.int64)])
        if len(used):
            self.counts += np.bincount(used, minlength=len(self.counts))
        if self.writer is not None:
            self.table.sync()
            self.writer.write_rows(rows, self.table, self._one_shots)
        if self._progress is not None:
            self._progress.update(len(rows))
        self._rows = array("q")
        self._one_shots = []

    def tallies(self) -> Counter[tuple[str, ...]]:
        """The expected counts of everything flushed so far."""
        total: Counter[tuple[str, ...]] = Counter(self._one_shot_tally)
        for template, count in zip(self.table.templates, self.counts.tolist(), strict=False):
            if count:
                for key, n in template.tally:
                    total[key] += n * count
        return total


def _no_template() -> FrameTemplate:
    raise AssertionError("a counting sink builds no templates")


# =============================================================================================
# What a frame counts for (read off the wire objects, like the dissector reads them)
# =============================================================================================

Key = tuple[str, ...]


def _frame_tally(transport: str | None) -> list[tuple[Key, int]]:
    return [(("frames",), 1), (("frames_by_transport", transport or "none"), 1)]


def message_tally(message: LbmcMessage, transport_channel: bool,
                  data_key: str | None = None) -> list[tuple[Key, int]]:
    """The counts one LBMC message adds: its tshark label and its persistence meaning."""
    out: list[tuple[Key, int]] = [(("lbmc", message.label(transport_channel)), 1)]
    mtype = message.type
    if mtype == MessageType.MESSAGE and data_key is not None:
        out.append((("data", data_key), 1))
    elif mtype == MessageType.RETRANS:
        out.append((("retransmissions", "store"), 1))
    elif mtype == MessageType.PRORX:
        out.append((("retransmissions", "proactive"), 1))
    for header in message.headers:
        if isinstance(header, UmePreg):
            role = "source" if header.s_flag else "receiver"
            out.append((("registrations", role, "requests"), 1))
        elif isinstance(header, UmePregResp):
            role = "source" if header.s_flag else "receiver"
            if header.e_flag:
                out.append((("registrations", role, f"error-{header.error_code}"), 1))
            else:
                out.append((("registrations", role, "accepted"), 1))
                if header.o_flag:
                    out.append((("registrations", role, "old-client"), 1))
        elif isinstance(header, UmeAck):
            out.append((("acks", "stable" if header.type == AckType.STABLE else "cdelv"), 1))
        elif isinstance(header, UmeKeepalive):
            out.append((("keepalives", KeepaliveType(header.type).name.lower()), 1))
        elif isinstance(header, UmeRxreq):
            out.append((("rxreq",), 1))
    return out


def udp_tally(protocol: str, packet: Any, session_key: str | None = None) -> Tally:
    """Counts of one UDP datagram: LBMR records, or the transport packet and its messages."""
    out = _frame_tally(protocol)
    if protocol == "lbmr":
        tqrs, tirs = packet.counts()
        if tqrs:
            wildcard = packet.type == lbmr.PacketType.WC_TQR
            out.append((("lbmr", "wc_tqr" if wildcard else "tqr"), tqrs))
        if tirs:
            out.append((("lbmr", "tir"), tirs))
        if not tqrs and not tirs:
            out.append((("lbmr", "keepalive"), 1))
        return tuple(out)
    kind = packet.info().split()[0]
    out.append(((protocol, kind), 1))
    if session_key is not None:
        if kind == "NAK":
            out += [(("naks", session_key, "packets"), 1),
                    (("naks", session_key, "sqns"), len(packet.naks))]
        elif kind == "NCF":
            out += [(("ncfs", session_key, "packets"), 1),
                    (("ncfs", session_key, "sqns"), len(packet.ncfs))]
        elif kind == "DATA(RX)":
            out += [(("retransmissions", protocol), 1), (("rx", session_key), 1)]
    for message in packet.messages():
        data_key = f"{session_key}:{message.tidx}" if kind == "DATA" and session_key else None
        out += message_tally(message, True, data_key)
    return tuple(out)


def tcp_tally(message: LbmcMessage | None, transport_channel: bool,
              data_key: str | None = None) -> Tally:
    """Counts of one TCP segment: a pure ACK/SYN/FIN (no UM) or one LBMC message."""
    if message is None:
        return tuple(_frame_tally(None))
    return tuple(_frame_tally("lbttcp") + message_tally(message, transport_channel, data_key))


def session_key(protocol: str, ip: str, port: int, session_id: int) -> str:
    """How the sidecar names a transport session: ``lbtrm:10.0.0.1:14390:0000abcd``."""
    return f"{protocol}:{ip}:{port}:{session_id:08x}"


ICMP_DEST_UNREACHABLE, ICMP_PORT_UNREACHABLE = 3, 3
QUOTE_LIMIT = 576 - IP4.size - 8
"""How much of the offending datagram an ICMP error quotes (RFC 1812 4.3.2.3: as much as
fits in 576 bytes; Linux does the same), its IP header included."""


def icmp_unreachable(src: str, dst: str, offending: bytes) -> bytes:
    """An ICMP port-unreachable frame from ``src`` to ``dst`` quoting ``offending`` (the IP
    datagram that found the port closed, from its IP header on)."""
    body = offending[:QUOTE_LIMIT]
    head = struct.pack("!BBHI", ICMP_DEST_UNREACHABLE, ICMP_PORT_UNREACHABLE, 0, 0)
    checksum = wpcap._checksum(head + body)
    icmp = struct.pack("!BBHI", ICMP_DEST_UNREACHABLE, ICMP_PORT_UNREACHABLE, checksum, 0) + body
    return wpcap.ipv4_frame(src, dst, 1, icmp)


STP_GROUP_MAC = bytes.fromhex("0180c2000000")
SWITCH_MAC = bytes.fromhex("0200000000fe")
LLC_STP = bytes.fromhex("424203")  # DSAP/SSAP spanning tree, UI
STP_HELLO = 2 * NS


def stp_bpdu_frame() -> bytes:
    """An IEEE 802.3 frame with LLC: a spanning-tree configuration BPDU from the switch
    (the length field where Ethernet II has its ethertype; padded to the 60-byte minimum)."""
    bridge = bytes.fromhex("8000") + SWITCH_MAC
    bpdu = (bytes(5) + bridge + struct.pack("!I", 0) + bridge
            + struct.pack("!HHHHH", 0x8001, 0, 20 * 256, 2 * 256, 15 * 256))
    llc = LLC_STP + bpdu
    frame = ETH.pack({"dst": STP_GROUP_MAC, "src": SWITCH_MAC, "ethertype": len(llc)}) + llc
    return frame + bytes(max(0, 60 - len(frame)))


# =============================================================================================
# The backend seam
# =============================================================================================


@dataclass(frozen=True)
class RunPlan:
    """What a backend is asked to play: the scenario, how many messages (``None``: until the
    sink is full), the message count restarts are placed on, and the seed."""

    scenario: Scenario
    messages: int | None
    planned_messages: int
    seed: int


class Backend(Protocol):
    """Something that plays a :class:`RunPlan` into a :class:`FrameSink`.

    ``run`` returns what the sidecar records about the run: ``hosts`` (IP -> role name),
    ``topics``, ``receivers``, ``sessions`` and ``messages_sent``.
    """

    name: str

    def run(self, plan: RunPlan, sink: FrameSink) -> dict[str, Any]: ...


# =============================================================================================
# WireBackend: the scripted deployment
# =============================================================================================

RESOLVER_PORT = 15380  # lbmrd (tshark lbmr.uc_dest_port)
RESOLVER_GROUP = PortMap().lbmr_mc  # multicast topic resolution (tshark's default group:port)
SOURCE_RESOLVER_PORT, RECEIVER_RESOLVER_PORT, STORE_RESOLVER_PORT = 14402, 14403, 14404
SOURCE_REQUEST_PORT, RECEIVER_REQUEST_PORT, STORE_REQUEST_PORT = 14391, 14392, 14393
LBTRU_SOURCE_PORT, LBTRU_CLIENT_PORT = 14380, 14360
LBTRM_SOURCE_PORT, LBTRM_DEST_PORT = 14390, 14400
LBTRM_GROUPS = ("224.10.10.10", "224.10.10.11", "224.10.10.12", "224.10.10.13", "224.10.10.14")
LBTTCP_SOURCE_PORT = 14371
LBTRM_NAK_PORT = 39990  # a receiver's unicast socket for LBT-RM NAKs (outside every UM range)
EPHEMERAL_BASE = 40000
RESOLVER_HOST = "127.0.0.1"
MTU_PAYLOAD = 1400

LAN = 60 * US  # one-way latency
STORE_WORK = 25 * US
RECEIVER_WORK = 10 * US
QUICK_ACK = 40 * US
DELAYED_ACK = 40_000 * US
RX_DELAY = 5_000 * US  # the LBT-RM/RU source holds a retransmission this long (NAK window)
RX_IGNORE = 200_000 * US  # NAKs for a sqn retransmitted this recently get an NCF
CLOSE_DRAIN = 3_000 * US
RETENTION = 200_000  # transport sequence numbers a source keeps for retransmission
RXREQ_OUTSTANDING = 10


def _ns(seconds: float) -> int:
    return round(seconds * NS)


def host_ip(role: int, index: int) -> str:
    """127.<role>.x.y: one loopback-range address per process (nothing is ever sent)."""
    return f"127.{role}.{index // 250}.{index % 250 + 1}"


class _Tcp(TcpConversation):
    """A :class:`TcpConversation` that can also send pure ACKs and close from either side."""

    def pure_ack(self, from_client: bool) -> bytes:
        return self._frame(from_client, TCP_ACK)

    def close_from(self, from_client: bool) -> list[bytes]:
        return [self._frame(from_client, TCP_FIN | TCP_ACK),
                self._frame(not from_client, TCP_FIN | TCP_ACK), self._frame(from_client, TCP_ACK)]


class Conn:
    """One TCP connection of the scenario and its acknowledgement state."""

    __slots__ = ("ack_armed", "ack_tids", "client", "conv", "id", "open", "server", "tids",
                 "transport", "unacked")

    def __init__(self, cid: int, client: tuple[str, int], server: tuple[str, int],
                 isn: tuple[int, int], transport: bool) -> None:
        self.id = cid
        self.client, self.server = client, server
        self.conv = _Tcp(client, server, isn)
        self.open = False
        self.transport = transport  # a port in tshark's LBT-TCP source range
        self.unacked = {True: 0, False: 0}  # segments sent that way, not yet acknowledged
        self.ack_armed = {True: False, False: False}  # a delayed-ACK timer is running
        self.ack_tids: dict[bool, int] = {}
        self.tids: dict[Hashable, int] = {}


@dataclass(eq=False)
class Session:
    """One transport session of a source context (a new one after each source restart)."""

    kind: Transport
    source: SourceCtx
    session_id: int
    key: str
    data_port: int = 0  # the UDP port DATA/SM/NCF leave from (LBT-RM: the NAK port or ephemeral)
    next_tsqn: int = 0
    sm_sqn: int = 0
    last_send: int = 0
    open: bool = True
    members: list[Member] = field(default_factory=list)
    history: dict[int, tuple[TopicState, int, int]] = field(default_factory=dict)
    rx_pending: set[int] = field(default_factory=set)
    rx_sent: dict[int, int] = field(default_factory=dict)
    conns: dict[int, Conn] = field(default_factory=dict)  # LBT-TCP: member id -> connection
    tids: dict[tuple[int, bool], int] = field(default_factory=dict)  # (topic, rx) -> template


@dataclass(eq=False)
class Member:
    """A receiver or store joined to one transport session (its loss state lives here)."""

    party: Party
    session: Session
    loss: float
    lost: list[int] = field(default_factory=list)
    nak_scheduled: bool = False
    joined: bool = False
    is_store: bool = False
    tids: dict[tuple[int, bool], int] = field(default_factory=dict)  # (topic, rx) -> template


@dataclass(eq=False)
class TopicState:
    """One topic (one UM source): its sequence numbers and where it stands."""

    index: int
    name: str
    source: SourceCtx
    tidx: int
    payload: bytes
    next_sqn: int = 0
    sent: int = 0
    quota: int | None = None
    waiting: bool = False
    interval: int = 1
    phase: int = 0


@dataclass(eq=False)
class Party:
    """A process with a host address: a source, receiver or store context."""

    name: str
    role: str
    ip: str
    index: int
    up: bool = False
    next_port: int = EPHEMERAL_BASE
    incarnation: int = 0

    def ephemeral(self) -> int:
        port = self.next_port
        self.next_port += 1
        return port


@dataclass(eq=False)
class SourceCtx(Party):
    transport: Transport = Transport.LBTRU
    topics: list[TopicState] = field(default_factory=list)
    session: Session | None = None
    store_conns: dict[int, Conn] = field(default_factory=dict)
    regids: dict[tuple[int, int], int] = field(default_factory=dict)  # (topic, store) -> RegID
    registered: set[tuple[int, int]] = field(default_factory=set)
    paused: bool = True
    advertised: bool = False
    attempts: int = 0
    last_active: int = 0
    transport_idx: int = 1
    session_keys: list[str] = field(default_factory=list)
    store_versions: dict[int, int] = field(default_factory=dict)  # store -> SRI store version
    sri_burst_until: int = 0


@dataclass(eq=False)
class StoreCtx(Party):
    group: int = 0
    store_id: int = 0
    # per topic: highest sqn received, sqns missing below it, ranges missed while away
    high: dict[int, int] = field(default_factory=dict)
    missing: dict[int, set[int]] = field(default_factory=dict)
    gaps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    cdelv: dict[tuple[int, int], int] = field(default_factory=dict)  # (rcv, topic) -> sqn
    members: dict[int, Member] = field(default_factory=dict)  # session id -> membership
    conns: list[Conn] = field(default_factory=list)


@dataclass(eq=False)
class RcvTopic:
    """A receiver's subscription to one topic."""

    topic: TopicState
    next_expected: int | None = None
    held: set[int] = field(default_factory=set)
    regids: dict[int, int] = field(default_factory=dict)  # store -> receiver RegID
    registered: set[int] = field(default_factory=set)
    acked: dict[int, int] = field(default_factory=dict)  # store -> last CDELV sqn sent
    wanted: list[int] = field(default_factory=list)
    outstanding: int = 0
    rr: int = 0
    store_versions: dict[int, int] = field(default_factory=dict)  # store -> version seen


@dataclass(eq=False)
class ReceiverCtx(Party):
    subs: dict[int, RcvTopic] = field(default_factory=dict)
    store_conns: dict[int, Conn] = field(default_factory=dict)
    members: dict[int, Member] = field(default_factory=dict)
    request_idx: int = 0
    sri_conns: dict[int, Conn] = field(default_factory=dict)
    pending_pregs: dict[int, list[TopicState]] = field(default_factory=dict)  # store -> topics
    batching: bool = False


class WireBackend:
    """The scripted deployment of a scenario, encoded with :mod:`wire`.

    The behaviour is a model of the product's, as ``docs/semantics.md`` describes it;
    it is causally consistent (nothing answers what it has not received, sequence numbers
    and RegIDs carry over restarts) but not a reference: the reference is ``reference_impl``.
    """

    name = "wire"

    def run(self, plan: RunPlan, sink: FrameSink) -> dict[str, Any]:
        return _Simulation(plan, sink).run()


class _Simulation:
    """One run of a scenario: entities, the event queue, and the frames they produce."""

    def __init__(self, plan: RunPlan, sink: FrameSink) -> None:
        self.plan = plan
        self.sc = plan.scenario
        self.sink = sink
        self.seed = plan.seed
        self.t0 = EPOCH_NS
        self.now = self.t0
        self._queue: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._tick = 0
        self._conn_ids = 0
        self.rng_loss = self._rng("loss")
        self.rng_ids = self._rng("ids")
        self.rng_time = self._rng("time")
        self.rng_nak = self._rng("nak")
        self.messages_sent = 0
        self.done_sending = False
        self.finished_at: int | None = None
        self.restarts_until = 0
        self.qc = self.sc.stores > 1
        self._build_entities()

    # -- infrastructure ------------------------------------------------------------------------

    def _rng(self, purpose: str) -> random.Random:
        return random.Random(f"ump-capture:{self.seed}:{purpose}")

    def at(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._tick += 1
        heapq.heappush(self._queue, (t, self._tick, fn, arg))

    def after(self, delay: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._tick += 1
        heapq.heappush(self._queue, (self.now + delay, self._tick, fn, arg))

    # -- entities ------------------------------------------------------------------------------

    def _build_entities(self) -> None:
        sc = self.sc
        self.sources: list[SourceCtx] = []
        self.topics: list[TopicState] = []
        for i in range(sc.sources):
            src = SourceCtx(name=f"source-{i}", role="source", ip=host_ip(1, i), index=i,
                            transport=sc.transport_of(i))
            for k in range(sc.topics_per_source):
                name = f"ump.{src.transport}.src{i}.topic{k}"
                pattern = (name.encode() + b"|") * (sc.payload_size // (len(name) + 1) + 1)
                topic = TopicState(index=len(self.topics), name=name, source=src, tidx=k + 1,
                                   payload=pattern[: sc.payload_size])
                src.topics.append(topic)
                self.topics.append(topic)
            self.sources.append(src)
        self.stores: list[StoreCtx] = []
        for g, size in enumerate(sc.store_groups):
            for _ in range(size):
                k = len(self.stores)
                self.stores.append(StoreCtx(name=f"store-{k}", role="store", ip=host_ip(3, k),
                                            index=k, group=g, store_id=k + 1))
        self.receivers: list[ReceiverCtx] = []
        for j in range(sc.receivers):
            rcv = ReceiverCtx(name=f"receiver-{j}", role="receiver", ip=host_ip(2, j), index=j)
            rcv.subs = {t.index: RcvTopic(topic=t) for t in self.topics}
            self.receivers.append(rcv)
        self.rogue = SourceCtx(name="rogue-source", role="source", ip=host_ip(4, 0), index=0)
        self.resolver_clients: list[tuple[str, int]] = (
            [(s.ip, SOURCE_RESOLVER_PORT) for s in self.sources]
            + [(r.ip, RECEIVER_RESOLVER_PORT) for r in self.receivers]
            + [(s.ip, STORE_RESOLVER_PORT) for s in self.stores])
        per_topic = math.ceil(self.plan.planned_messages / max(1, len(self.topics)))
        self.data_start = self.t0 + _ns(0.25)
        self.data_span = max(1, _ns(per_topic / sc.rate))

    def _quotas(self) -> None:
        messages = self.plan.messages
        count = len(self.topics)
        for topic in self.topics:
            if messages is None:
                topic.quota = None
            else:
                topic.quota = messages // count + (1 if topic.index < messages % count else 0)
            topic.interval = max(1, _ns(1.0 / self.sc.rate))
            topic.phase = topic.interval * topic.index // max(1, count)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        sc = self.sc
        self._quotas()
        for k, store in enumerate(self.stores):
            self.at(self.t0 + _ns(0.001) + k * 50 * US, self._store_start, store)
        for i, src in enumerate(self.sources):
            self.at(self.t0 + _ns(0.002) + i * 200 * US, self._source_start, src)
        for j, rcv in enumerate(self.receivers):
            self.at(self.t0 + _ns(0.004) + j * 100 * US, self._receiver_start, rcv)
        for topic in self.topics:
            self.at(self.data_start + topic.phase, self._message, topic)
        for restart in sc.receiver_restarts:
            self._plan_restart(restart, self._receiver_down, self.receivers[restart.index])
        for restart in sc.source_restarts:
            self._plan_restart(restart, self._source_down, self.sources[restart.index])
        for restart in sc.store_restarts:
            self._plan_restart(restart, self._store_down, self.stores[restart.index])
        if sc.regid_collision and self.sources and self.stores:
            self.at(self.data_start + self.data_span // 3, self._rogue_start, self.rogue)
        if sc.llc_frames:
            self.at(self.t0, self._bpdu)
        queue = self._queue
        sink = self.sink
        pop = heapq.heappop
        # a scenario that can never finish its messages (a source refused for ever) still ends
        deadline = self.data_start + 4 * self.data_span + _ns(60)
        while queue and not sink.full:
            t, _, fn, arg = pop(queue)
            if self.plan.messages is not None and t > deadline:
                break
            self.now = t
            fn(arg)
        sink.flush()
        return self.describe()

    def _bpdu(self, _: Any) -> None:
        """The switch's spanning-tree hello, every 2 s until the run ends (not UM)."""
        if self.finished_at is not None:
            return
        self.sink.emit_frame(self.now, stp_bpdu_frame(), tuple(_frame_tally(None)))
        self.after(STP_HELLO, self._bpdu)

    def _plan_restart(self, restart: Restart, down: Callable[[Any], None], party: Party) -> None:
        t = self.data_start + round(restart.at * self.data_span)
        self.at(t, down, (party, _ns(restart.downtime)))
        # the run does not end before the process is back and has had time to recover
        self.restarts_until = max(self.restarts_until,
                                  t + CLOSE_DRAIN + _ns(restart.downtime) + _ns(0.3))

    def describe(self) -> dict[str, Any]:
        hosts = {RESOLVER_HOST: "lbmrd"}
        for party in [*self.sources, *self.receivers, *self.stores]:
            hosts[party.ip] = party.name
        if self.sc.regid_collision:
            hosts[self.rogue.ip] = self.rogue.name
        topics = []
        for topic in self.topics:
            src = topic.source
            topics.append({"name": topic.name, "source": src.name, "transport": str(src.transport),
                           "tidx": topic.tidx, "messages": topic.next_sqn,
                           "regids": {self.stores[k].name: src.regids.get((topic.index, k))
                                      for k in range(len(self.stores))}})
        receivers = [{"name": r.name, "regids": {
            t.name: {self.stores[k].name: r.subs[t.index].regids.get(k)
                     for k in range(len(self.stores))} for t in self.topics}}
            for r in self.receivers]
        return {"hosts": hosts, "topics": topics, "receivers": receivers,
                "messages_sent": self.messages_sent,
                "sessions": [k for s in self.sources for k in s.session_keys]}

    # -- frame helpers ---------------------------------------------------------------------------

    def _udp(self, key: Hashable, make: Callable[[], FrameTemplate], a: int = 0, b: int = 0,
             c: int = 0, d: int = 0) -> None:
        tid = self.sink.template(key, make)
        self.sink.emit(self.now, tid, a, b, c, d)

    def _udp_once(self, src: tuple[str, int], dst: tuple[str, int], protocol: str,
                  packet: Any, skey: str | None = None) -> None:
        frame = b"" if self.sink.count_only else udp_frame(src[0], src[1], dst[0], dst[1],
                                                            packet.build())
        self.sink.emit_frame(self.now, frame, udp_tally(protocol, packet, skey))

    def _new_conn(self, client: Party, server: tuple[str, int], transport: bool = False) -> Conn:
        self._conn_ids += 1
        isn = (self.rng_ids.getrandbits(32), self.rng_ids.getrandbits(32))
        return Conn(self._conn_ids, (client.ip, client.ephemeral()), server, isn, transport)

    def _connect(self, conn: Conn, then: Callable[[Any], None], arg: Any = None) -> None:
        """SYN now, SYN-ACK and ACK one latency apart, then ``then(arg)``."""
        syn, synack, ack = (b"", b"", b"") if self.sink.count_only else conn.conv.handshake()
        tally = tcp_tally(None, conn.transport)
        self.sink.emit_frame(self.now, syn, tally)

        def second(_: Any) -> None:
            self.sink.emit_frame(self.now, synack, tally)

        def third(_: Any) -> None:
            self.sink.emit_frame(self.now, ack, tally)
            conn.open = True
            then(arg)

        self.after(LAN, second)
        self.after(2 * LAN, third)

    def _close(self, conn: Conn, from_client: bool = True) -> None:
        if not conn.open:
            return
        conn.open = False
        frames = [b"", b"", b""] if self.sink.count_only else conn.conv.close_from(from_client)
        tally = tcp_tally(None, conn.transport)
        for i, frame in enumerate(frames):
            def emit(f: bytes) -> None:
                self.sink.emit_frame(self.now, f, tally)
            self.after(i * LAN, emit, frame)

    def _tcp_once(self, conn: Conn, from_client: bool, message: LbmcMessage) -> None:
        """Send one rare message as a whole frame (registrations, SRI requests...)."""
        if not conn.open:
            return
        frame = b"" if self.sink.count_only else conn.conv.send(from_client, message.build())
        self.sink.emit_frame(self.now, frame, tcp_tally(message, conn.transport))
        self._sent_segment(conn, from_client)

    def _tcp_template(self, conn: Conn, from_client: bool, key: Hashable,
                      build: Callable[..., tuple[LbmcMessage, list[tuple[int, int]]]],
                      args: tuple[Any, ...] = (), a: int = 0, b: int = 0,
                      data_key: str | None = None) -> None:
        """Send a frequent message through a template.  ``build(*args)`` returns the message
        and the (offset in the message, size) of up to two varying members, which take the
        values ``a`` and ``b``; it is called once per connection, direction and ``key``."""
        if not conn.open:
            return
        tid = conn.tids.get((from_client, key))
        if tid is None:
            if self.sink.count_only:
                tid = conn.tids[(from_client, key)] = self.sink.template(None, _no_template)
            else:
                tid = self._new_tcp_template(conn, from_client, key, build(*args), data_key)
        seqs = conn.conv.next_seq
        seq = seqs[from_client]
        seqs[from_client] = (seq + self.sink.payload_len[tid]) & MASK32
        self.sink.emit(self.now, tid, seq, seqs[not from_client], a, b)
        # the segment acknowledges everything received; the peer owes an ACK for it
        conn.unacked[not from_client] = 0
        pending = conn.unacked[from_client] + 1
        conn.unacked[from_client] = pending
        if pending == 2:
            self.after(QUICK_ACK, self._pure_ack, (conn, from_client))
        elif not conn.ack_armed[from_client]:
            conn.ack_armed[from_client] = True
            self.after(DELAYED_ACK, self._delayed_ack, (conn, from_client))

    def _new_tcp_template(self, conn: Conn, from_client: bool, key: Hashable,
                          built: tuple[LbmcMessage, list[tuple[int, int]]],
                          data_key: str | None) -> int:
        message, members = built
        payload = message.build()
        src, dst = (conn.client, conn.server) if from_client else (conn.server, conn.client)
        values = [0x10203040, 0x50607080]
        frame = tcp_frame(src[0], src[1], dst[0], dst[1], values[0], values[1],
                          wpcap.TCP_PSH | TCP_ACK, payload)
        slots = [(TCP_SEQ, 4), (TCP_ACK_AT, 4)]
        for off, size in members:
            slots.append((TCP_PAYLOAD + off, size))
            values.append(int.from_bytes(payload[off : off + size], "big"))
        template = checked_template(frame, slots, values,
                                    tcp_tally(message, conn.transport, data_key), len(payload))
        tid = self.sink.template((conn.id, from_client, key), lambda: template)
        conn.tids[(from_client, key)] = tid
        return tid

    def _sent_segment(self, conn: Conn, from_client: bool) -> None:
        conn.unacked[not from_client] = 0
        pending = conn.unacked[from_client] + 1
        conn.unacked[from_client] = pending
        if pending == 2:
            self.after(QUICK_ACK, self._pure_ack, (conn, from_client))
        elif not conn.ack_armed[from_client]:
            conn.ack_armed[from_client] = True
            self.after(DELAYED_ACK, self._delayed_ack, (conn, from_client))

    def _delayed_ack(self, arg: tuple[Conn, bool]) -> None:
        arg[0].ack_armed[arg[1]] = False
        self._pure_ack(arg)

    def _pure_ack(self, arg: tuple[Conn, bool]) -> None:
        """The receiving side acknowledges data sent in direction ``data_dir``."""
        conn, data_dir = arg
        if not conn.open or conn.unacked[data_dir] == 0:
            return
        conn.unacked[data_dir] = 0
        sender = not data_dir
        tid = conn.ack_tids.get(sender)
        if tid is None:
            src, dst = (conn.client, conn.server) if sender else (conn.server, conn.client)
            values = [0x01020304, 0x05060708]
            frame = tcp_frame(src[0], src[1], dst[0], dst[1], values[0], values[1], TCP_ACK)
            template = checked_template(frame, [(TCP_SEQ, 4), (TCP_ACK_AT, 4)], values,
                                        tcp_tally(None, conn.transport))
            tid = conn.ack_tids[sender] = self.sink.template((conn.id, sender, "ack"),
                                                             lambda: template)
        seqs = conn.conv.next_seq
        self.sink.emit(self.now, tid, seqs[sender], seqs[data_dir])

    # -- topic resolution ------------------------------------------------------------------------

    def _lbmr_send(self, party: Party, port: int, packet: lbmr.LbmrPacket, relay: bool) -> None:
        """A datagram to lbmrd and, for TQRs and TIRs, lbmrd's copies to every other client.

        With ``resolver_multicast`` the datagram goes once to the resolver group, which every
        context listens to (no lbmrd, no copies), as an LBMR version 1 packet with options."""
        counting = self.sink.count_only
        multicast = self.sc.resolver_multicast
        if multicast:
            packet = dataclasses.replace(packet, version=1, options=lbmr.with_length_option([
                lbmr.OptVersion(version=0x00060A00, ume=1),
                lbmr.OptLocalDomain(local_domain_id=7)]))
        payload = b"" if counting else packet.build()
        tally = udp_tally("lbmr", packet)

        def frame(src: tuple[str, int], dst: tuple[str, int]) -> bytes:
            return b"" if counting else udp_frame(src[0], src[1], dst[0], dst[1], payload)

        to = RESOLVER_GROUP if multicast else (RESOLVER_HOST, RESOLVER_PORT)
        self.sink.emit_frame(self.now, frame((party.ip, port), to), tally)
        if not relay:
            return
        if multicast:
            self.after(LAN, self._lbmr_delivered, (party, packet))
            return

        def relay_copies(_: Any) -> None:
            for ip, cport in self.resolver_clients:
                if ip != party.ip:
                    self.sink.emit_frame(self.now, frame((RESOLVER_HOST, RESOLVER_PORT),
                                                         (ip, cport)), tally)

        self.after(LAN, relay_copies)
        self.after(2 * LAN, self._lbmr_delivered, (party, packet))

    def _lbmr_delivered(self, arg: tuple[Party, lbmr.LbmrPacket]) -> None:
        sender, packet = arg
        names = {t.name for t in packet.tirs}
        asked = {q.name for q in packet.tqrs if not isinstance(q, lbmr.WcTqr)}
        patterns = [q.pattern for q in packet.tqrs if isinstance(q, lbmr.WcTqr)]
        if asked or patterns:
            for src in self.sources:
                if src.up and src.advertised and src is not sender:
                    wanted = [t for t in src.topics if t.name in asked
                              or any(re.search(p, t.name) for p in patterns)]
                    if wanted:
                        self.after(RECEIVER_WORK, self._advertise, (src, wanted))
        if names:
            for rcv in self.receivers:
                if rcv.up:
                    self._receiver_saw_tir(rcv, names)
            for store in self.stores:
                if store.up:
                    self._store_saw_tir(store, names)

    def _chunks(self, records: list[Any]) -> Iterable[list[Any]]:
        batch: list[Any] = []
        size = 0
        for record in records:
            rsize = len(record.encode())
            if batch and size + rsize > MTU_PAYLOAD:
                yield batch
                batch, size = [], 0
            batch.append(record)
            size += rsize
        if batch:
            yield batch

    def _query(self, party: Party, port: int, topics: list[TopicState]) -> None:
        tqrs = [lbmr.Tqr(name=t.name) for t in topics]
        for batch in self._chunks(tqrs):
            self._lbmr_send(party, port, lbmr.LbmrPacket(tqrs=batch), relay=True)
        if self.sc.wildcard_queries and isinstance(party, ReceiverCtx) and self.sources:
            self._lbmr_send(party, port, lbmr.LbmrPacket(
                type=lbmr.PacketType.WC_TQR,
                tqrs=[lbmr.WcTqr(pattern_type=1, pattern=self.wildcard_pattern())]), relay=True)

    def wildcard_pattern(self) -> str:
        """The wildcard receivers' pattern: every topic of source 0 (PCRE)."""
        return rf"^ump\.{self.sources[0].transport}\.src0\.topic[0-9]+$"

    def _advertise(self, arg: tuple[SourceCtx, list[TopicState]]) -> None:
        src, topics = arg
        if not src.up or src.session is None:
            return
        tirs = [self._tir(src, t) for t in topics]
        for batch in self._chunks(tirs):
            self._lbmr_send(src, SOURCE_RESOLVER_PORT, lbmr.LbmrPacket(tirs=batch), relay=True)

    def _tir(self, src: SourceCtx, topic: TopicState) -> lbmr.Tir:
        session = src.session
        assert session is not None
        if src.transport == Transport.LBTRM:
            info: Any = lbmr.LbtrmInfo(src_addr=src.ip, mcast_addr=self._group(src),
                                       session_id=session.session_id,
                                       udp_dest_port=LBTRM_DEST_PORT,
                                       src_ucast_port=LBTRM_SOURCE_PORT)
        elif src.transport == Transport.LBTRU:
            info = lbmr.LbtruSidInfo(ip=src.ip, session_id=session.session_id,
                                     port=LBTRU_SOURCE_PORT)
        else:
            info = lbmr.TcpSidInfo(ip=src.ip, session_id=session.session_id,
                                   port=LBTTCP_SOURCE_PORT)
        first = self.stores[0]
        options: list[Any] = [
            lbmr.ToptUme(latejoin=1, store=1, qccap=int(self.qc),
                         store_tcp_port=self.sc.store_port, src_tcp_port=SOURCE_REQUEST_PORT,
                         store_tcp_addr=first.ip, src_tcp_addr=src.ip,
                         src_reg_id=src.regids.get((topic.index, 0), 0),
                         transport_idx=src.transport_idx,
                         high_seqnum=max(0, topic.next_sqn - 1), low_seqnum=0)]
        for store in self.stores:
            options.append(lbmr.ToptUmeStore(
                grp_idx=store.group, store_tcp_port=self.sc.store_port, store_idx=store.index,
                store_ip_addr=store.ip, src_reg_id=src.regids.get((topic.index, store.index), 0)))
        for g, size in enumerate(self.sc.store_groups):
            options.append(lbmr.ToptUmeStoreGroup(grp_idx=g, grp_sz=size))
        options.append(lbmr.ToptExfunc(src_tcp_port=SOURCE_REQUEST_PORT, src_ip_addr=src.ip,
                                       ume=1, lj=1))
        return lbmr.Tir(name=topic.name, ttl=1, index=topic.tidx, info=info, options=options)

    def _group(self, src: SourceCtx) -> str:
        return LBTRM_GROUPS[src.index % len(LBTRM_GROUPS)]

    def _resolver_keepalive(self, party: Party) -> None:
        if self.finished_at is not None or self.sc.resolver_multicast:
            return
        if party.up:
            port = {"source": SOURCE_RESOLVER_PORT, "receiver": RECEIVER_RESOLVER_PORT,
                    "store": STORE_RESOLVER_PORT}[party.role]
            self._lbmr_send(party, port, lbmr.LbmrPacket(), relay=False)
        if self.finished_at is None:
            self.after(_ns(self.sc.resolver_interval), self._resolver_keepalive, party)

    def _readvertise(self, src: SourceCtx) -> None:
        if self.finished_at is not None:
            return
        if src.up and src.advertised:
            self._advertise((src, src.topics))
        self.after(_ns(self.sc.resolver_interval), self._readvertise, src)

    # -- sources ---------------------------------------------------------------------------------

    def _source_start(self, src: SourceCtx) -> None:
        src.up = True
        src.incarnation += 1
        src.paused = True
        src.advertised = False
        src.registered.clear()
        self._open_session(src)
        if src.incarnation == 1:
            self.after(_ns(0.0005), self._resolver_keepalive, src)
        for store in self.stores:
            self._source_connect(src, store)

    def _open_session(self, src: SourceCtx) -> None:
        sid = self.rng_ids.getrandbits(32) or 1
        port = {Transport.LBTRM: LBTRM_SOURCE_PORT, Transport.LBTRU: LBTRU_SOURCE_PORT,
                Transport.LBTTCP: LBTTCP_SOURCE_PORT}[src.transport]
        key = session_key(str(src.transport), src.ip, port, sid)
        data_port = port
        if src.transport == Transport.LBTRM and self.sc.lbtrm_ephemeral_port:
            data_port = src.ephemeral()  # the NAK port (the key's) stays in every header
        src.session = Session(kind=src.transport, source=src, session_id=sid, key=key,
                              data_port=data_port, last_send=self.now)
        src.session_keys.append(key)
        if src.transport != Transport.LBTTCP:
            self.after(_ns(self.sc.sm_interval), self._session_idle_check, src.session)

    def _source_connect(self, src: SourceCtx, store: StoreCtx) -> None:
        if not src.up or not store.up:
            return
        conn = self._new_conn(src, (store.ip, self.sc.store_port))
        src.store_conns[store.index] = conn
        store.conns.append(conn)
        self._connect(conn, self._source_register, (src, store, conn))

    def _preg(self, src: SourceCtx, topic: TopicState, store: StoreCtx, regid: int,
              marker: int) -> LbmcMessage:
        headers: list[Any] = [
            UmePreg(s_flag=1, marker=marker, reg_id=regid, transport_idx=src.transport_idx,
                    topic_idx=topic.tidx, src_reg_id=0, resp_port=SOURCE_REQUEST_PORT,
                    resp_ip=src.ip),
            UmeCapability(qc_flag=int(self.qc), client_lifetime_flag=1),
            UmeClientLifetime(activity_tmo=round(self.sc.activity_timeout * 1000),
                              lifetime=round(self.sc.activity_timeout * 4000), ttl=0)]
        if self.sc.session_ids:
            headers.append(UmeSid(sid=(0x5E55 << 48) | (src.index << 16) | 1))
        headers.append(Topicname(topic=topic.name))
        return LbmcMessage(type=MessageType.CONTROL, headers=headers)

    def _source_register(self, arg: tuple[SourceCtx, StoreCtx, Conn]) -> None:
        src, store, conn = arg
        if not conn.open or not src.up:
            return
        src.attempts += 1
        for topic in src.topics:
            regid = src.regids.get((topic.index, store.index), 0)
            self._tcp_once(conn, True, self._preg(src, topic, store, regid, src.attempts % 128))
        self.after(LAN + STORE_WORK, self._store_answers_source, (src, store, conn))

    def _store_answers_source(self, arg: tuple[SourceCtx, StoreCtx, Conn]) -> None:
        src, store, conn = arg
        if not conn.open or not store.up:
            return
        refused = src.incarnation > 1 and self.now < src.last_active + _ns(self.sc.activity_timeout)
        for topic in src.topics:
            key = (topic.index, store.index)
            regid = src.regids.get(key, 0)
            if refused and regid:
                resp = UmePregResp(e_flag=1, error_code=PregError.EACTIVE, s_flag=1,
                                   marker=src.attempts % 128, reg_id=regid,
                                   transport_idx=src.transport_idx, topic_idx=topic.tidx)
                self._tcp_once(conn, False, LbmcMessage(type=MessageType.CONTROL, headers=[resp]))
                continue
            old = bool(regid)
            if not regid:
                regid = self.rng_ids.getrandbits(31) | 1
                src.regids[key] = regid
            high = store.high.get(topic.index, -1)
            resp = UmePregResp(reg_id=regid, s_flag=1, o_flag=int(old), marker=src.attempts % 128,
                               transport_idx=src.transport_idx, topic_idx=topic.tidx,
                               low_seqnum=0, high_seqnum=max(high, 0))
            self._tcp_once(conn, False, LbmcMessage(type=MessageType.CONTROL, headers=[
                resp, UmeStoreid(store_id=store.store_id)]))
            src.registered.add(key)
            store.high.setdefault(topic.index, high)
        if refused:
            self.after(LAN + _ns(self.sc.registration_interval), self._source_register,
                       (src, store, conn))
            return
        self.after(LAN, self._source_registered_with, (src, store))
        self.after(_ns(self.sc.keepalive_interval), self._keepalive, (conn, src.incarnation))

    def _source_registered_with(self, arg: tuple[SourceCtx, StoreCtx]) -> None:
        src, store = arg
        if not src.up:
            return
        # every (re-)registration bumps that store's version in the SRI (semantics 1.3)
        src.store_versions[store.index] = src.store_versions.get(store.index, 0) + 1
        if src.paused and self._quorum(src):
            src.paused = False
            self._registration_complete(src)
        elif not src.paused:
            self._sri_burst(src)  # a store came back: tell the receivers

    def _quorum(self, src: SourceCtx) -> bool:
        """Registration complete: every topic has a majority of some group (intergroup "any")."""
        for topic in src.topics:
            ok = False
            start = 0
            for size in self.sc.store_groups:
                regs = sum(1 for k in range(start, start + size)
                           if (topic.index, k) in src.registered and self.stores[k].up)
                if regs >= self._needed(size):
                    ok = True
                start += size
            if not ok:
                return False
        return True

    def _needed(self, group_size: int) -> int:
        return group_size if self.sc.stability == "all" else group_size // 2 + 1

    def _registration_complete(self, src: SourceCtx) -> None:
        first = not src.advertised
        src.advertised = True
        self._advertise((src, src.topics))
        if first and src.incarnation == 1:
            self.after(_ns(self.sc.resolver_interval), self._readvertise, src)
        self.after(3 * LAN, self._sri_burst, src)
        for topic in src.topics:
            if topic.waiting:
                topic.waiting = False
                # sending resumes once the members had time to join the new session
                self.after(_ns(0.005) + topic.phase, self._message, topic)

    def _sri_burst(self, src: SourceCtx) -> None:
        src.sri_burst_until = self.now + self.sc.sri_count * _ns(self.sc.sri_interval)
        for i in range(self.sc.sri_count):
            self.after(i * _ns(self.sc.sri_interval), self._send_sri, (src, src.incarnation, None))

    def _sri_message(self, src: SourceCtx, topic: TopicState) -> LbmcMessage:
        headers: list[Any] = [
            Sri(version=sum(src.store_versions.values()), low_sqn=0,
                high_sqn=max(0, topic.next_sqn - 1), initial_sqn_known=1),
            TopicIdx(tidx=topic.tidx)]
        for g, size in enumerate(self.sc.store_groups):
            headers.append(UmeStoreGroup(grp_idx=g, grp_sz=size))
        for store in self.stores:
            headers.append(UmeStoreExt(
                grp_idx=store.group, store_tcp_port=self.sc.store_port, store_idx=store.index,
                store_ip_addr=store.ip,
                src_reg_id=src.regids.get((topic.index, store.index), 0),
                domain_id=0, version=src.store_versions.get(store.index, 0)))
        return LbmcMessage(type=MessageType.CONTROL, headers=headers)

    def _send_sri(self, arg: tuple[SourceCtx, int, Member | None]) -> None:
        """SRI for every topic of the source, to every member (or to one that asked)."""
        src, incarnation, only = arg
        session = src.session
        if not src.up or src.incarnation != incarnation or session is None or not session.open:
            return
        for topic in src.topics:
            message = self._sri_message(src, topic)
            members = [only] if only is not None else list(session.members)
            if session.kind == Transport.LBTTCP:
                for member in members:
                    conn = session.conns.get(id(member.party))
                    if conn is not None and conn.open:
                        self._tcp_once(conn, False, message)
                        self.after(LAN, self._sri_arrives, (member, topic))
                continue
            if session.kind == Transport.LBTRU and not any(m.joined for m in members):
                continue  # nobody to send it to: no datagram, no sequence number used
            tsqn = self._next_tsqn(session)
            trail = max(0, tsqn - RETENTION)
            if session.kind == Transport.LBTRM:
                packet: Any = lbtrm.LbtrmData(ucast_port=LBTRM_SOURCE_PORT,
                                              session_id=session.session_id, sqn=tsqn,
                                              trail_sqn=trail, payload=[message])
                self._udp_once((src.ip, session.data_port), (self._group(src), LBTRM_DEST_PORT),
                               "lbtrm", packet, session.key)
                targets = [m for m in session.members if m.joined]
            else:
                targets = [m for m in members if m.joined]
                for member in targets:
                    packet = lbtru.LbtruData(sqn=tsqn, trail_sqn=trail, payload=[message],
                                             options=[lbtru.SidOption(session_id=session.session_id)])
                    self._udp_once((src.ip, LBTRU_SOURCE_PORT),
                                   (member.party.ip, LBTRU_CLIENT_PORT), "lbtru", packet,
                                   session.key)
            for member in targets:
                self.after(LAN, self._sri_arrives, (member, topic))

    def _next_tsqn(self, session: Session) -> int:
        tsqn = session.next_tsqn
        session.next_tsqn = (tsqn + 1) & MASK32
        session.last_send = self.now
        return tsqn

    def _session_idle_check(self, session: Session) -> None:
        if not session.open or not session.source.up or self.finished_at is not None:
            return
        idle = _ns(self.sc.sm_interval)
        if self.now - session.last_send >= idle:
            self._send_sm(session)
        if not (self.done_sending and self.now - session.last_send > 4 * idle):
            self.after(idle, self._session_idle_check, session)

    def _send_sm(self, session: Session) -> None:
        src = session.source
        lead = max(0, session.next_tsqn - 1)
        trail = max(0, session.next_tsqn - RETENTION)
        sm_sqn = session.sm_sqn
        session.sm_sqn += 1
        if session.kind == Transport.LBTRM:
            def make() -> FrameTemplate:
                packet = lbtrm.LbtrmSm(ucast_port=LBTRM_SOURCE_PORT,
                                       session_id=session.session_id, sm_sqn=1, lead_sqn=2,
                                       trail_sqn=3, ucast_naks=1)
                offs = member_offsets(lbtrm.LbtrmSm.fast)
                frame = udp_frame(src.ip, session.data_port, self._group(src), LBTRM_DEST_PORT,
                                  packet.build())
                slots = [(UDP_PAYLOAD + offs[n][0], 4) for n in ("sm_sqn", "lead_sqn",
                                                                   "trail_sqn")]
                return checked_template(frame, slots, [1, 2, 3],
                                        udp_tally("lbtrm", packet, session.key))
            self._udp(("rm-sm", session.key), make, sm_sqn, lead, trail)
        else:
            for member in session.members:
                if not member.joined:
                    continue
                self._lbtru_sm(session, member, sm_sqn, lead, trail, syn=False)
        self.after(LAN, self._detect_gaps, session)

    def _lbtru_sm(self, session: Session, member: Member, sm_sqn: int, lead: int, trail: int,
                  syn: bool) -> None:
        src = session.source

        def make() -> FrameTemplate:
            packet = lbtru.LbtruSm(syn=int(syn), sm_sqn=1, lead_sqn=2, trail_sqn=3,
                                   options=[lbtru.SidOption(session_id=session.session_id)])
            offs = member_offsets(lbtru.LbtruSm.fast)
            frame = udp_frame(src.ip, LBTRU_SOURCE_PORT, member.party.ip, LBTRU_CLIENT_PORT,
                              packet.build())
            slots = [(UDP_PAYLOAD + offs[n][0], 4) for n in ("sm_sqn", "lead_sqn", "trail_sqn")]
            return checked_template(frame, slots, [1, 2, 3],
                                    udp_tally("lbtru", packet, session.key))
        self._udp(("ru-sm", session.key, id(member), syn), make, sm_sqn, lead, trail)

    def _detect_gaps(self, session: Session) -> None:
        for member in session.members:
            if member.lost and not member.nak_scheduled and member.party.up:
                self._schedule_nak(member)

    # -- messages --------------------------------------------------------------------------------

    def _message(self, topic: TopicState) -> None:
        src = topic.source
        if topic.quota is not None and topic.sent >= topic.quota:
            self._topic_finished(topic)
            return
        session = src.session
        if not src.up or src.paused or session is None:
            topic.waiting = True
            return
        sqn = topic.next_sqn
        topic.next_sqn += 1
        topic.sent += 1
        self.messages_sent += 1
        kind = session.kind
        if kind == Transport.LBTRM:
            self._send_lbtrm(session, topic, sqn, rx=False)
        elif kind == Transport.LBTRU:
            self._send_lbtru(session, topic, sqn)
        else:
            self._send_lbttcp(session, topic, sqn)
        interval = topic.interval
        self.after(interval + int((self.rng_time.random() - 0.5) * 0.4 * interval),
                   self._message, topic)

    def _topic_finished(self, topic: TopicState) -> None:
        topic.quota = topic.sent
        if all(t.quota is not None and t.sent >= t.quota for t in self.topics) \
                and not self.done_sending:
            self.done_sending = True
            drain = _ns(max(0.3, 4 * self.sc.ack_batch_interval, 2 * self.sc.stability_timeout,
                            self.sc.sri_interval * self.sc.sri_count))
            self.at(max(self.now, self.restarts_until) + drain, self._shutdown)

    def _data_message(self, topic: TopicState, sqn: int, mtype: int = MessageType.MESSAGE,
                      headers: Sequence[Any] = ()) -> LbmcMessage:
        return LbmcMessage(type=mtype, tidx=topic.tidx, sqn=sqn, headers=list(headers),
                           payload=topic.payload)

    def _lbtrm_data_template(self, session: Session, topic: TopicState, rx: bool) -> int:
        src = session.source

        def make() -> FrameTemplate:
            packet = lbtrm.LbtrmData(ucast_port=LBTRM_SOURCE_PORT, session_id=session.session_id,
                                     sqn=7, trail_sqn=8, rx=int(rx), ucast_naks=1,
                                     payload=[self._data_message(topic, 9)])
            offs = member_offsets(lbtrm.LbtrmData.fast)
            frame = udp_frame(src.ip, session.data_port, self._group(src), LBTRM_DEST_PORT,
                              packet.build())
            slots = [(UDP_PAYLOAD + offs["sqn"][0], 4), (UDP_PAYLOAD + offs["trail_sqn"][0], 4),
                     (UDP_PAYLOAD + transport_prefix(packet) + LBMC_SQN, 4)]
            return checked_template(frame, slots, [7, 8, 9],
                                    udp_tally("lbtrm", packet, session.key))

        tid = self.sink.template(("rm-data", session.key, topic.index, rx), make)
        session.tids[(topic.index, rx)] = tid
        return tid

    def _send_lbtrm(self, session: Session, topic: TopicState, sqn: int, rx: bool,
                    tsqn: int | None = None) -> None:
        if tsqn is None:
            tsqn = session.next_tsqn
            session.next_tsqn = (tsqn + 1) & MASK32
            session.history[tsqn] = (topic, sqn, self.now)
            session.history.pop(tsqn - RETENTION, None)
        session.last_send = self.now
        tid = session.tids.get((topic.index, rx))
        if tid is None:
            tid = self._lbtrm_data_template(session, topic, rx)
        self.sink.emit(self.now, tid, tsqn, tsqn - RETENTION if tsqn >= RETENTION else 0, sqn)
        if not rx:
            self._fan_out(session, session.members, tsqn, topic, sqn)

    def _send_lbtru(self, session: Session, topic: TopicState, sqn: int) -> None:
        tsqn = session.next_tsqn
        session.next_tsqn = (tsqn + 1) & MASK32
        session.last_send = self.now
        session.history[tsqn] = (topic, sqn, self.now)
        session.history.pop(tsqn - RETENTION, None)
        trail = tsqn - RETENTION if tsqn >= RETENTION else 0
        emit, now, key = self.sink.emit, self.now, (topic.index, False)
        members = [m for m in session.members if m.joined and m.party.up]
        for member in members:
            tid = member.tids.get(key)
            if tid is None:
                tid = self._lbtru_data_template(session, member, topic, False)
            emit(now, tid, tsqn, trail, sqn)
        self._fan_out(session, members, tsqn, topic, sqn)

    def _lbtru_data_template(self, session: Session, member: Member, topic: TopicState,
                             rx: bool) -> int:
        src = session.source

        def make() -> FrameTemplate:
            packet = lbtru.LbtruData(sqn=7, trail_sqn=8, rx=int(rx),
                                     options=[lbtru.SidOption(session_id=session.session_id)],
                                     payload=[self._data_message(topic, 9)])
            offs = member_offsets(lbtru.LbtruData.fast)
            frame = udp_frame(src.ip, LBTRU_SOURCE_PORT, member.party.ip, LBTRU_CLIENT_PORT,
                              packet.build())
            slots = [(UDP_PAYLOAD + offs["sqn"][0], 4), (UDP_PAYLOAD + offs["trail_sqn"][0], 4),
                     (UDP_PAYLOAD + transport_prefix(packet) + LBMC_SQN, 4)]
            return checked_template(frame, slots, [7, 8, 9],
                                    udp_tally("lbtru", packet, session.key))

        tid = self.sink.template(("ru-data", session.key, id(member), topic.index, rx), make)
        member.tids[(topic.index, rx)] = tid
        return tid

    def _fan_out(self, session: Session, members: list[Member], tsqn: int, topic: TopicState,
                 sqn: int) -> None:
        """Datagram ``tsqn`` reaches each member, or is lost on the way; the stores that got
        it acknowledge it together, one latency later."""
        stores: list[StoreCtx] = []
        rng = self.rng_loss.random
        for member in members:
            party = member.party
            if not member.joined or not party.up:
                continue
            if member.loss and rng() < member.loss:
                member.lost.append(tsqn)
                if isinstance(party, StoreCtx):
                    party.missing.setdefault(topic.index, set()).add(sqn)
                continue
            if member.lost and not member.nak_scheduled:
                self._schedule_nak(member)
            if member.is_store:
                stores.append(party)  # type: ignore[arg-type]
            else:
                self._receiver_got(party, topic, sqn, LAN + RECEIVER_WORK)  # type: ignore[arg-type]
        if stores:
            self.after(LAN + STORE_WORK, self._stores_got, (stores, topic, sqn))

    def _send_lbttcp(self, session: Session, topic: TopicState, sqn: int) -> None:
        session.last_send = self.now
        stores: list[StoreCtx] = []
        for member in session.members:
            conn = session.conns.get(id(member.party))
            if conn is None or not conn.open or not member.joined:
                continue
            self._tcp_template(conn, False, ("data", topic.index), self._build_data,
                               (topic, MessageType.MESSAGE), sqn,
                               data_key=f"{session.key}:{topic.tidx}")
            if member.is_store:
                stores.append(member.party)  # type: ignore[arg-type]
            else:
                self._receiver_got(member.party, topic, sqn,  # type: ignore[arg-type]
                                   LAN + RECEIVER_WORK)
        if stores:
            self.after(LAN + STORE_WORK, self._stores_got, (stores, topic, sqn))

    def _build_data(self, topic: TopicState, mtype: int,
                    headers: Sequence[Any] = ()) -> tuple[LbmcMessage, list[tuple[int, int]]]:
        return self._data_message(topic, 1, mtype, headers), [(LBMC_SQN, 4)]

    def _deliver_later(self, member: Member, topic: TopicState, sqn: int, delay: int) -> None:
        party = member.party
        if isinstance(party, StoreCtx):
            self.after(delay + STORE_WORK, self._stores_got, ([party], topic, sqn))
        elif isinstance(party, ReceiverCtx):
            self._receiver_got(party, topic, sqn, delay + RECEIVER_WORK)

    # -- transport loss repair -------------------------------------------------------------------

    def _schedule_nak(self, member: Member) -> None:
        member.nak_scheduled = True
        backoff = round(self.rng_nak.uniform(0.1, 1.0) * _ns(self.sc.nak_backoff))
        self.after(LAN + backoff, self._send_nak, member)

    def _send_nak(self, member: Member) -> None:
        member.nak_scheduled = False
        session = member.session
        if not member.lost or not member.party.up or not session.open:
            return
        naks = sorted(set(member.lost))
        src = session.source
        party = member.party
        if session.kind == Transport.LBTRM:
            sport, dport = (party.ip, LBTRM_NAK_PORT), (src.ip, LBTRM_SOURCE_PORT)

            def packet_for(entries: list[int]) -> Any:
                return lbtrm.LbtrmNak(ucast_port=LBTRM_SOURCE_PORT,
                                      session_id=session.session_id, naks=entries)
            proto, fast = "lbtrm", lbtrm.LbtrmNak.fast
        else:
            sport, dport = (party.ip, LBTRU_CLIENT_PORT), (src.ip, LBTRU_SOURCE_PORT)

            def packet_for(entries: list[int]) -> Any:
                return lbtru.LbtruNak(naks=entries,
                                      options=[lbtru.SidOption(session_id=session.session_id)])
            proto, fast = "lbtru", lbtru.LbtruNak.fast
        if len(naks) == 1:
            def make() -> FrameTemplate:
                packet = packet_for([0x0A0B0C0D])
                frame = udp_frame(sport[0], sport[1], dport[0], dport[1], packet.build())
                return checked_template(frame, [(UDP_PAYLOAD + fast.size, 4)], [0x0A0B0C0D],
                                        udp_tally(proto, packet, session.key))
            self._udp(("nak", session.key, id(member)), make, naks[0])
        else:
            self._udp_once(sport, dport, proto, packet_for(naks), session.key)
        self.after(LAN, self._nak_at_source, (member, naks))

    def _nak_at_source(self, arg: tuple[Member, list[int]]) -> None:
        member, naks = arg
        session = member.session
        if not session.open or not session.source.up:
            return
        delayed, shed = [], []
        for tsqn in naks:
            if tsqn not in session.history:
                shed.append(tsqn)
            elif tsqn in session.rx_pending or self.now - session.rx_sent.get(tsqn, -RX_IGNORE) \
                    < RX_IGNORE:
                delayed.append(tsqn)
            elif self.rng_nak.random() < self.sc.unrecoverable:
                shed.append(tsqn)
            else:
                session.rx_pending.add(tsqn)
                self.after(RX_DELAY, self._retransmit, (session, member, tsqn))
        if delayed:
            self._send_ncf(session, member, delayed, lbtru.NcfReason.RX_DELAY)
        if shed:
            self._send_ncf(session, member, shed, lbtru.NcfReason.SHED)

    def _send_ncf(self, session: Session, member: Member, sqns: list[int], reason: int) -> None:
        src = session.source
        trail = max(0, session.next_tsqn - RETENTION)
        if session.kind == Transport.LBTRM:
            sport, dport = (src.ip, session.data_port), (self._group(src), LBTRM_DEST_PORT)

            def packet_for(entries: list[int], trail_sqn: int) -> Any:
                return lbtrm.LbtrmNcf(ucast_port=LBTRM_SOURCE_PORT,
                                      session_id=session.session_id, trail_sqn=trail_sqn,
                                      reason=reason, ncfs=entries)
            proto, layout = "lbtrm", lbtrm.LbtrmNcf.fast
            targets = [m for m in session.members if m.joined]
        else:
            sport, dport = (src.ip, LBTRU_SOURCE_PORT), (member.party.ip, LBTRU_CLIENT_PORT)

            def packet_for(entries: list[int], trail_sqn: int) -> Any:
                return lbtru.LbtruNcf(trail_sqn=trail_sqn, reason=reason, ncfs=entries,
                                      options=[lbtru.SidOption(session_id=session.session_id)])
            proto, layout = "lbtru", lbtru.LbtruNcf.fast
            targets = [member]
        if len(sqns) == 1:
            def make() -> FrameTemplate:
                packet = packet_for([0x0A0B0C0D], 0x01020304)
                frame = udp_frame(sport[0], sport[1], dport[0], dport[1], packet.build())
                slots = [(UDP_PAYLOAD + _offset(layout, "trail_sqn"), 4),
                         (UDP_PAYLOAD + layout.size, 4)]
                return checked_template(frame, slots, [0x01020304, 0x0A0B0C0D],
                                        udp_tally(proto, packet, session.key))
            self._udp(("ncf", session.key, reason, dport), make, trail, sqns[0])
        else:
            self._udp_once(sport, dport, proto, packet_for(sqns, trail), session.key)
        if reason == lbtru.NcfReason.SHED:
            for target in targets:
                gone = [s for s in sqns if s in target.lost]
                if gone:
                    target.lost = [s for s in target.lost if s not in gone]
                    self.after(LAN, self._transport_gave_up, (target, gone))

    def _retransmit(self, arg: tuple[Session, Member, int]) -> None:
        session, member, tsqn = arg
        session.rx_pending.discard(tsqn)
        entry = session.history.get(tsqn)
        if entry is None or not session.open or not session.source.up:
            return
        topic, sqn, _ = entry
        session.rx_sent[tsqn] = self.now
        if len(session.rx_sent) > 4096:
            for old in [k for k, t in session.rx_sent.items() if self.now - t > RX_IGNORE]:
                del session.rx_sent[old]
        if session.kind == Transport.LBTRM:
            self._send_lbtrm(session, topic, sqn, rx=True, tsqn=tsqn)
            targets = [m for m in session.members if tsqn in m.lost]
        else:
            session.last_send = self.now
            targets = [member] if tsqn in member.lost else []
            if targets:
                tid = member.tids.get((topic.index, True))
                if tid is None:
                    tid = self._lbtru_data_template(session, member, topic, True)
                self.sink.emit(self.now, tid, tsqn, tsqn - RETENTION if tsqn >= RETENTION else 0,
                               sqn)
        for target in targets:
            target.lost.remove(tsqn)
            if target.party.up:
                self._deliver_later(target, topic, sqn, LAN)

    def _transport_gave_up(self, arg: tuple[Member, list[int]]) -> None:
        """The transport will not repair these: receivers ask a store, stores wait for the
        source's proactive retransmission (if the message is not stable without them)."""
        member, tsqns = arg
        session = member.session
        party = member.party
        for tsqn in tsqns:
            entry = session.history.get(tsqn)
            if entry is None:
                continue
            topic, sqn, sent_at = entry
            if isinstance(party, ReceiverCtx):
                sub = party.subs[topic.index]
                sub.wanted.append(sqn)
                self._pump_rxreq(party, sub)
            elif isinstance(party, StoreCtx):
                due = max(self.now, sent_at + _ns(self.sc.stability_timeout))
                self.at(due, self._stability_check, (topic, sqn, party))

    def _stability_check(self, arg: tuple[TopicState, int, StoreCtx]) -> None:
        topic, sqn, store = arg
        src = topic.source
        if sqn not in store.missing.get(topic.index, ()) or not src.up:
            return
        if self._stable(topic, sqn):
            return
        conn = src.store_conns.get(store.index)
        if conn is None or not conn.open:
            return
        self._tcp_template(conn, True, ("prorx", topic.index), self._build_data,
                           (topic, MessageType.PRORX), sqn)
        self.after(LAN + STORE_WORK, self._stores_got, ([store], topic, sqn))

    def _stable(self, topic: TopicState, sqn: int) -> bool:
        start = 0
        for size in self.sc.store_groups:
            have = sum(1 for k in range(start, start + size) if self._store_has(self.stores[k],
                                                                                 topic, sqn))
            start += size
            if have >= self._needed(size):
                return True
        return False

    def _store_has(self, store: StoreCtx, topic: TopicState, sqn: int) -> bool:
        if not store.up or sqn > store.high.get(topic.index, -1):
            return False
        if sqn in store.missing.get(topic.index, ()):
            return False
        return all(not lo <= sqn <= hi for lo, hi in store.gaps.get(topic.index, ()))

    # -- stores ----------------------------------------------------------------------------------

    def _stores_got(self, arg: tuple[list[StoreCtx], TopicState, int]) -> None:
        """Stores persisted a message and acknowledge it to the source."""
        stores, topic, sqn = arg
        src = topic.source
        tindex = topic.index
        for store in stores:
            if not store.up:
                continue
            missing = store.missing.get(tindex)
            if missing:
                missing.discard(sqn)
            if sqn > store.high.get(tindex, -1):
                store.high[tindex] = sqn
            conn = src.store_conns.get(store.index)
            if conn is not None:
                self._tcp_template(conn, False, ("stable", tindex), self._build_stable,
                                   (src, topic), sqn)

    def _build_stable(self, src: SourceCtx, topic: TopicState
                      ) -> tuple[LbmcMessage, list[tuple[int, int]]]:
        message = LbmcMessage(type=MessageType.CONTROL, headers=[UmeAck(
            type=AckType.STABLE, transport_idx=src.transport_idx, id_2=topic.tidx,
            rcv_reg_id=0, seqnum=1)])
        return message, [(header_member(message, 0, "seqnum"), 4)]

    def _store_saw_tir(self, store: StoreCtx, names: set[str]) -> None:
        for src in self.sources:
            session = src.session
            if session is None or not src.up or not session.open:
                continue
            if not any(t.name in names for t in src.topics):
                continue
            if not any((t.index, store.index) in src.registered for t in src.topics):
                continue
            member = store.members.get(id(session))
            if member is None:
                member = Member(party=store, session=session, loss=self.sc.store_loss,
                                is_store=True)
                store.members[id(session)] = member
                session.members.append(member)
                self._join(member)

    def _store_down(self, arg: tuple[StoreCtx, int]) -> None:
        store, downtime = arg
        if not store.up:
            return
        store.up = False
        stop = self.now
        for member in store.members.values():
            member.joined = False
            if member in member.session.members:
                member.session.members.remove(member)
            conn = member.session.conns.pop(id(store), None)
            if conn is not None:
                self.at(stop + CLOSE_DRAIN, lambda c: self._close(c, True), conn)
        store.members.clear()
        for conn in store.conns:
            self.at(stop + CLOSE_DRAIN, lambda c: self._close(c, False), conn)
        store.conns = []
        for src in self.sources:
            src.registered = {k for k in src.registered if k[1] != store.index}
            src.store_conns.pop(store.index, None)
            if src.up and not src.paused and not self._quorum(src):
                src.paused = True  # quorum lost: sends fail until a store comes back
        for rcv in self.receivers:
            rcv.store_conns.pop(store.index, None)
            for sub in rcv.subs.values():
                sub.registered.discard(store.index)
        self.at(stop + downtime, self._store_up, store)

    def _store_start(self, store: StoreCtx) -> None:
        store.up = True
        self._resolver_keepalive(store)

    def _store_up(self, store: StoreCtx) -> None:
        store.up = True
        store.incarnation += 1
        self._query(store, STORE_RESOLVER_PORT, self.topics)
        # the sources retry every registration interval; the first retry after the store is
        # back finds it listening
        for src in self.sources:
            if src.up:
                self.after(_ns(self.sc.registration_interval) // 2, lambda s: self._source_connect(
                    s, store), src)

    # -- receivers -------------------------------------------------------------------------------

    def _receiver_start(self, rcv: ReceiverCtx) -> None:
        rcv.up = True
        rcv.incarnation += 1
        if rcv.incarnation == 1:
            self._resolver_keepalive(rcv)
        self._query(rcv, RECEIVER_RESOLVER_PORT, self.topics)

    def _receiver_saw_tir(self, rcv: ReceiverCtx, names: set[str]) -> None:
        for src in self.sources:
            session = src.session
            if session is None or not session.open or not src.up:
                continue
            if not any(t.name in names for t in src.topics):
                continue
            member = rcv.members.get(id(session))
            if member is None:
                member = Member(party=rcv, session=session, loss=self.sc.receiver_loss)
                rcv.members[id(session)] = member
                session.members.append(member)
                self._join(member)

    def _join(self, member: Member) -> None:
        """Join a transport session: LBT-RU connection request, LBT-TCP connect, LBT-RM
        nothing (the member just listens to the group)."""
        session = member.session
        src = session.source
        party = member.party
        if session.kind == Transport.LBTRM:
            member.joined = True
            self._joined(member)
        elif session.kind == Transport.LBTRU:
            creq = lbtru.LbtruCreq(request=lbtru.CREQ_SYN,
                                   options=[lbtru.SidOption(session_id=session.session_id)])
            self._udp_once((party.ip, LBTRU_CLIENT_PORT), (src.ip, LBTRU_SOURCE_PORT), "lbtru",
                           creq, session.key)

            def accept(_: Any) -> None:
                if not session.open or not src.up:
                    return
                lead = max(0, session.next_tsqn - 1)
                self._lbtru_sm(session, member, session.sm_sqn, lead, 0, syn=True)
                session.sm_sqn += 1
                member.joined = True
                self.after(LAN, lambda _: self._joined(member))
            self.after(LAN + RECEIVER_WORK, accept)
        else:
            conn = self._new_conn(party, (src.ip, LBTTCP_SOURCE_PORT), transport=True)
            session.conns[id(party)] = conn
            if isinstance(party, StoreCtx):
                party.conns.append(conn)

            def hello(_: Any) -> None:
                self._tcp_once(conn, True, LbmcMessage(type=MessageType.CONTROL, headers=[
                    TcpSid(sid=session.session_id)]))
                member.joined = True
                self._joined(member)
            self._connect(conn, hello)

    def _joined(self, member: Member) -> None:
        """A store notes what it missed while away; a receiver that joins after the SRI
        burst asks the source for SRI."""
        party = member.party
        src = member.session.source
        if isinstance(party, StoreCtx):
            for topic in src.topics:
                high = party.high.get(topic.index, -1)
                if high >= 0 and topic.next_sqn - 1 > high:
                    party.gaps.setdefault(topic.index, []).append((high + 1, topic.next_sqn - 1))
                    party.high[topic.index] = topic.next_sqn - 1
            return
        if isinstance(party, ReceiverCtx) and party.up and src.advertised \
                and self.now > src.sri_burst_until:
            self._sri_request(party, src)

    def _sri_request(self, rcv: ReceiverCtx, src: SourceCtx) -> None:
        conn = self._new_conn(rcv, (src.ip, SOURCE_REQUEST_PORT))
        rcv.sri_conns[src.index] = conn

        def ask(_: Any) -> None:
            for topic in src.topics:
                self._tcp_once(conn, True, LbmcMessage(type=MessageType.CONTROL, headers=[
                    SriReq(transport_idx=src.transport_idx, topic_idx=topic.tidx)]))
            member = rcv.members.get(id(src.session))
            if member is not None:
                self.after(LAN + RECEIVER_WORK, self._send_sri,
                           (src, src.incarnation, member))
            self.after(4 * LAN, lambda c: self._close(c, True), conn)
        self._connect(conn, ask)

    def _sri_arrives(self, arg: tuple[Member, TopicState]) -> None:
        """A receiver (re-)registers with every store whose SRI version went up."""
        member, topic = arg
        party = member.party
        if not isinstance(party, ReceiverCtx) or not party.up:
            return
        sub = party.subs[topic.index]
        src = topic.source
        for store in self.stores:
            version = src.store_versions.get(store.index, 0)
            if version > sub.store_versions.get(store.index, 0) and store.up \
                    and (topic.index, store.index) in src.registered:
                sub.store_versions[store.index] = version
                self._receiver_register(party, store, topic)

    def _receiver_register(self, rcv: ReceiverCtx, store: StoreCtx, topic: TopicState) -> None:
        conn = rcv.store_conns.get(store.index)
        if conn is None:
            conn = self._new_conn(rcv, (store.ip, self.sc.store_port))
            rcv.store_conns[store.index] = conn
            store.conns.append(conn)
            rcv.pending_pregs[store.index] = [topic]

            def connected(_: Any) -> None:
                for waiting in rcv.pending_pregs.pop(store.index, []):
                    self._receiver_preg(rcv, store, conn, waiting)
            self._connect(conn, connected)
            self.after(2 * LAN + _ns(self.sc.keepalive_interval), self._keepalive,
                       (conn, rcv.incarnation))
            if self.sc.ack_batch_interval and not rcv.batching:
                rcv.batching = True
                self.after(_ns(self.sc.ack_batch_interval), self._ack_batch, rcv)
        elif conn.open:
            self._receiver_preg(rcv, store, conn, topic)
        else:
            rcv.pending_pregs.setdefault(store.index, []).append(topic)

    def _receiver_preg(self, rcv: ReceiverCtx, store: StoreCtx, conn: Conn,
                       topic: TopicState) -> None:
        if not rcv.up:
            return
        sub = rcv.subs[topic.index]
        src = topic.source
        regid = sub.regids.get(store.index, 0)
        headers: list[Any] = [
            UmePreg(s_flag=0, marker=1, reg_id=regid,
                    src_reg_id=src.regids.get((topic.index, store.index), 0),
                    transport_idx=src.transport_idx, topic_idx=topic.tidx,
                    resp_port=RECEIVER_REQUEST_PORT, resp_ip=rcv.ip),
            UmeCapability(client_lifetime_flag=1),
            UmeClientLifetime(activity_tmo=round(self.sc.activity_timeout * 1000),
                              lifetime=round(self.sc.activity_timeout * 4000), ttl=0)]
        if self.sc.session_ids:
            headers.append(UmeSid(sid=(0x5E55 << 48) | (1 << 40) | (rcv.index << 16) | 1))
        self._tcp_once(conn, True, LbmcMessage(type=MessageType.CONTROL, headers=headers))
        self.after(LAN + STORE_WORK, self._store_answers_receiver, (rcv, store, conn, topic))

    def _store_answers_receiver(self, arg: tuple[ReceiverCtx, StoreCtx, Conn, TopicState]
                                ) -> None:
        rcv, store, conn, topic = arg
        if not conn.open or not store.up:
            return
        sub = rcv.subs[topic.index]
        old = store.index in sub.regids
        if not old:
            sub.regids[store.index] = self.rng_ids.getrandbits(31) | 1
        regid = sub.regids[store.index]
        high = store.high.get(topic.index, -1)
        acked = store.cdelv.get((rcv.index, topic.index))
        low = acked + 1 if acked is not None else max(0, high + 1)
        resp = UmePregResp(reg_id=regid, s_flag=0, o_flag=int(old), marker=1,
                           transport_idx=topic.source.transport_idx, topic_idx=topic.tidx,
                           low_seqnum=low, high_seqnum=max(high, 0))
        self._tcp_once(conn, False, LbmcMessage(type=MessageType.CONTROL, headers=[resp]))
        self.after(LAN + RECEIVER_WORK, self._receiver_registered, (rcv, store, topic, low))

    def _receiver_registered(self, arg: tuple[ReceiverCtx, StoreCtx, TopicState, int]) -> None:
        rcv, store, topic, low = arg
        if not rcv.up:
            return
        sub = rcv.subs[topic.index]
        sub.registered.add(store.index)
        sub.acked.setdefault(store.index, low - 1)
        if sub.next_expected is None:
            # first registration: start at the store's low sequence number; later messages
            # already seen are held, earlier ones are recovered from the stores
            sub.next_expected = low
            live = [s for s in sub.held if s >= low]
            sub.held = set(live)
            first_live = min(live) if live else topic.next_sqn
            sub.wanted.extend(range(low, first_live))
            self._advance(rcv, sub)
            self._pump_rxreq(rcv, sub)

    def _receiver_got(self, rcv: ReceiverCtx, topic: TopicState, sqn: int, delay: int) -> None:
        sub = rcv.subs[topic.index]
        expected = sub.next_expected
        if expected is None:
            sub.held.add(sqn)  # before registration completes: hold it
            return
        if sqn == expected and not sub.held:
            sub.next_expected = sqn + 1
            if not self.sc.ack_batch_interval:
                self._cdelv_later(rcv, sub, sqn, delay)
            return
        if sqn >= expected:
            sub.held.add(sqn)
            self._advance(rcv, sub, delay)

    def _advance(self, rcv: ReceiverCtx, sub: RcvTopic, delay: int = RECEIVER_WORK) -> None:
        assert sub.next_expected is not None
        while sub.next_expected in sub.held:
            sub.held.discard(sub.next_expected)
            if not self.sc.ack_batch_interval:
                self._cdelv_later(rcv, sub, sub.next_expected, delay)
            sub.next_expected += 1

    def _cdelv_later(self, rcv: ReceiverCtx, sub: RcvTopic, sqn: int, delay: int) -> None:
        self.after(delay, self._cdelv, (rcv, sub, sqn))

    def _cdelv(self, arg: tuple[ReceiverCtx, RcvTopic, int]) -> None:
        rcv, sub, sqn = arg
        if not rcv.up:
            return
        topic = sub.topic
        for k in sub.registered:
            conn = rcv.store_conns.get(k)
            if conn is None or not conn.open or sub.acked.get(k, -1) >= sqn:
                continue
            sub.acked[k] = sqn
            self._tcp_template(conn, True, ("cdelv", topic.index), self._build_cdelv,
                               (topic, sub.regids[k]), sqn)
            store = self.stores[k]
            store.cdelv[(rcv.index, topic.index)] = sqn

    @staticmethod
    def _build_cdelv(topic: TopicState, regid: int) -> tuple[LbmcMessage, list[tuple[int, int]]]:
        message = LbmcMessage(type=MessageType.CONTROL, headers=[UmeAck(
            type=AckType.CDELV, transport_idx=topic.source.transport_idx, id_2=regid,
            rcv_reg_id=regid, seqnum=1)])
        return message, [(header_member(message, 0, "seqnum"), 4)]

    def _ack_batch(self, rcv: ReceiverCtx) -> None:
        if rcv.up:
            for sub in rcv.subs.values():
                if sub.next_expected is not None and sub.next_expected > 0:
                    self._cdelv((rcv, sub, sub.next_expected - 1))
        if self.finished_at is None:
            self.after(_ns(self.sc.ack_batch_interval), self._ack_batch, rcv)

    def _pump_rxreq(self, rcv: ReceiverCtx, sub: RcvTopic) -> None:
        topic = sub.topic
        while sub.wanted and sub.outstanding < RXREQ_OUTSTANDING and rcv.up:
            sqn = sub.wanted.pop(0)
            candidates = [k for k in sorted(sub.registered)
                          if (conn := rcv.store_conns.get(k)) is not None and conn.open
                          and self._store_has(self.stores[k], topic, sqn)]
            if not candidates:
                # no store holds it: unrecoverable, delivery goes on without it
                sub.held.add(sqn)
                self._advance(rcv, sub)
                continue
            k = candidates[sub.rr % len(candidates)]
            sub.rr += 1
            conn = rcv.store_conns[k]
            rcv.request_idx = (rcv.request_idx + 1) & MASK32
            self._tcp_template(conn, True, ("rxreq", topic.index), self._build_rxreq,
                               (rcv, topic, sub.regids[k]), rcv.request_idx, sqn)
            sub.outstanding += 1
            self.after(LAN + STORE_WORK, self._store_retransmits, (rcv, sub, k, sqn))

    @staticmethod
    def _build_rxreq(rcv: ReceiverCtx, topic: TopicState, regid: int
                     ) -> tuple[LbmcMessage, list[tuple[int, int]]]:
        message = LbmcMessage(type=MessageType.CONTROL, headers=[UmeRxreq(
            request_idx=1, transport_idx=topic.source.transport_idx, id_2=regid,
            seqnum=2, rx_port=RECEIVER_REQUEST_PORT, rx_ip=rcv.ip)])
        return message, [(header_member(message, 0, "request_idx"), 4),
                         (header_member(message, 0, "seqnum"), 4)]

    def _store_retransmits(self, arg: tuple[ReceiverCtx, RcvTopic, int, int]) -> None:
        rcv, sub, k, sqn = arg
        conn = rcv.store_conns.get(k)
        topic = sub.topic
        if conn is None or not conn.open or not self.stores[k].up:
            sub.outstanding -= 1
            sub.wanted.append(sqn)
            return
        self._tcp_template(conn, False, ("retrans", topic.index), self._build_data,
                           (topic, MessageType.RETRANS, [Topicname(topic=topic.name)]), sqn)

        def got(_: Any) -> None:
            sub.outstanding -= 1
            if rcv.up:
                self._receiver_got(rcv, topic, sqn, RECEIVER_WORK)
                self._pump_rxreq(rcv, sub)
        self.after(LAN, got)

    def _receiver_down(self, arg: tuple[ReceiverCtx, int]) -> None:
        rcv, downtime = arg
        if not rcv.up:
            return
        rcv.up = False
        for conn in [*rcv.store_conns.values(), *rcv.sri_conns.values()]:
            self._close(conn, True)
        rcv.store_conns.clear()
        rcv.sri_conns.clear()
        for member in rcv.members.values():
            member.joined = False
            member.lost.clear()
            if member in member.session.members:
                member.session.members.remove(member)
            tcp = member.session.conns.pop(id(rcv), None)
            if tcp is not None:
                self._close(tcp, True)
        rcv.members.clear()
        for sub in rcv.subs.values():
            # a restarted process has only its RegIDs (saved) left
            sub.next_expected = None
            sub.held.clear()
            sub.registered.clear()
            sub.acked.clear()
            sub.wanted.clear()
            sub.outstanding = 0
            sub.store_versions.clear()
        rcv.pending_pregs.clear()
        self.after(downtime, self._receiver_start, rcv)

    # -- source restarts and the rogue source ---------------------------------------------------

    def _source_down(self, arg: tuple[SourceCtx, int]) -> None:
        src, downtime = arg
        if not src.up:
            return
        src.paused = True
        src.last_active = self.now

        def stop(_: Any) -> None:
            src.up = False
            session = src.session
            if session is not None:
                session.open = False
                if self.sc.naks_to_dead_source and session.kind == Transport.LBTRM:
                    self._naks_to_closed_port(session)
                for member in session.members:
                    member.joined = False
                    member.lost.clear()
                    party = member.party
                    if isinstance(party, ReceiverCtx | StoreCtx):
                        party.members.pop(id(session), None)
                for conn in session.conns.values():
                    self._close(conn, False)
            for conn in src.store_conns.values():
                self._close(conn, True)
            src.store_conns.clear()
        self.after(CLOSE_DRAIN, stop)
        self.after(CLOSE_DRAIN + downtime, self._source_start, src)

    def _naks_to_closed_port(self, session: Session) -> None:
        """The source has closed its sockets: each receiver NAKs once more what it misses
        (or the last datagram, whose loss it learnt from the final SM), and the source's host
        answers each NAK with ICMP port unreachable quoting it."""
        src = session.source
        last = session.next_tsqn - 1
        for k, member in enumerate(m for m in session.members if not m.is_store):
            party = member.party
            if not member.joined or not party.up or last < 0:
                continue
            naks = sorted(set(member.lost)) or [last]
            packet = lbtrm.LbtrmNak(ucast_port=LBTRM_SOURCE_PORT, session_id=session.session_id,
                                    naks=naks)
            nak = udp_frame(party.ip, LBTRM_NAK_PORT, src.ip, LBTRM_SOURCE_PORT, packet.build())
            tally = udp_tally("lbtrm", packet, session.key)
            bounce = icmp_unreachable(src.ip, party.ip, nak[ETH.size:])
            # the dissector shows the quoted NAK: an LBT-RM frame, counted as a bounce
            bounced = (*_frame_tally("lbtrm"), (("icmp", "port-unreachable", session.key), 1))
            sent = self.now + LAN + (k + 1) * 100 * US
            self.at(sent, lambda f: self.sink.emit_frame(self.now, f[0], f[1]), (nak, tally))
            self.at(sent + LAN, lambda f: self.sink.emit_frame(self.now, f[0], f[1]),
                    (bounce, bounced))

    def _rogue_start(self, rogue: SourceCtx) -> None:
        victim = self.sources[0]
        topic = victim.topics[0]
        regid = victim.regids.get((topic.index, 0))
        if regid is None:
            return
        store = self.stores[0]
        conn = self._new_conn(rogue, (store.ip, self.sc.store_port))

        def attempt(n: int) -> None:
            if not conn.open:
                return
            self._tcp_once(conn, True, self._preg(rogue, topic, store, regid, n))

            def refuse(_: Any) -> None:
                resp = UmePregResp(e_flag=1, error_code=PregError.EACTIVE, s_flag=1, marker=n,
                                   reg_id=regid, transport_idx=rogue.transport_idx,
                                   topic_idx=topic.tidx)
                self._tcp_once(conn, False, LbmcMessage(type=MessageType.CONTROL,
                                                        headers=[resp]))
                if n < self.sc.collision_attempts:
                    self.after(_ns(self.sc.registration_interval), attempt, n + 1)
                else:
                    self.after(LAN, lambda _: self._close(conn, True))
            self.after(LAN + STORE_WORK, refuse)

        self._connect(conn, attempt, 1)

    # -- keepalives and the end ------------------------------------------------------------------

    def _keepalive(self, arg: tuple[Conn, int]) -> None:
        conn, _ = arg
        if not conn.open or self.finished_at is not None:
            return
        client = self._client_of(conn)
        regs = self._registrations_on(conn, client)
        for ktype, tidx, topic_idx, regid in regs:
            self._tcp_template(conn, True, ("ka", ktype, topic_idx, regid),
                               self._build_keepalive, (ktype, tidx, topic_idx, regid))

        def answer(_: Any) -> None:
            for _k, tidx, topic_idx, regid in regs:
                self._tcp_template(conn, False, ("ka-store", topic_idx, regid),
                                   self._build_keepalive,
                                   (KeepaliveType.STORE, tidx, topic_idx, regid))
        if regs:
            self.after(_ns(self.sc.keepalive_interval) // 2, answer)
        if self.finished_at is None:
            self.after(_ns(self.sc.keepalive_interval), self._keepalive, arg)

    @staticmethod
    def _build_keepalive(ktype: int, tidx: int, topic_idx: int, regid: int
                         ) -> tuple[LbmcMessage, list[tuple[int, int]]]:
        return LbmcMessage(type=MessageType.CONTROL, headers=[UmeKeepalive(
            type=ktype, transport_idx=tidx, topic_idx=topic_idx, reg_id=regid)]), []

    def _client_of(self, conn: Conn) -> Party | None:
        for party in [*self.sources, *self.receivers]:
            if party.ip == conn.client[0]:
                return party
        return None

    def _registrations_on(self, conn: Conn, client: Party | None
                          ) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        if isinstance(client, SourceCtx):
            for k, c in client.store_conns.items():
                if c is conn:
                    out += [(KeepaliveType.SOURCE, client.transport_idx, t.tidx,
                             client.regids[(t.index, k)]) for t in client.topics
                            if (t.index, k) in client.registered]
        elif isinstance(client, ReceiverCtx):
            for k, c in client.store_conns.items():
                if c is conn:
                    out += [(KeepaliveType.RECEIVER, sub.topic.source.transport_idx,
                             sub.topic.tidx, sub.regids[k]) for sub in client.subs.values()
                            if k in sub.registered]
        return out

    def _shutdown(self, _: Any) -> None:
        """Everything closes in order: receivers, then sources, then the stores' sessions."""
        self.finished_at = self.now
        step = 0
        for rcv in self.receivers:
            for conn in [*rcv.store_conns.values(), *rcv.sri_conns.values()]:
                self.after(step, lambda c: self._close(c, True), conn)
                step += 4 * LAN
        for src in self.sources:
            if src.session is not None:
                for conn in src.session.conns.values():
                    self.after(step, lambda c: self._close(c, False), conn)
                    step += 4 * LAN
                src.session.open = False
            for conn in src.store_conns.values():
                self.after(step, lambda c: self._close(c, True), conn)
                step += 4 * LAN


# =============================================================================================
# Running a scenario
# =============================================================================================


def port_map(scenario: Scenario) -> PortMap:
    """The tshark/``ump dissect`` port map a generated capture needs: defaults + store port."""
    return PortMap(store_ports=[scenario.store_port])


@dataclass
class GenerationResult:
    path: Path
    sidecar: Path
    frames: int
    messages: int
    seconds: float
    meta: dict[str, Any]


def _nest(flat: Counter[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(flat):
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = flat[key]
    return out


def calibrate(scenario: Scenario, seed: int, messages: int = 2000,
              backend: Backend | None = None) -> tuple[float, float]:
    """Frames per message and fixed frames of ``scenario``, from two short counting runs of
    ``backend`` (default: the wire backend)."""
    backend = backend or WireBackend()
    small = max(50, min(messages, 400))
    counts = []
    for m in (small, 2 * small):
        sink = FrameSink()
        backend.run(RunPlan(scenario.with_messages(m), m, m, seed), sink)
        counts.append(sink.frames)
    per_message = max(0.5, (counts[1] - counts[0]) / small)
    return per_message, max(0.0, counts[0] - per_message * small)


BACKENDS = ("auto", "cores", "wire")
"""Backend names ``generate`` and ``ump captures generate --backend`` accept."""


def select_backend(name: str, scenario: Scenario, *, lbttcp_fallback: bool = False) -> Backend:
    """The backend called ``name`` for ``scenario``.

    ``auto`` (the default) picks the reference cores (:class:`captures.cores.CoresBackend`)
    when they can play every feature of the scenario (LBT-TCP sources, no transport loss) and
    the wire backend otherwise: the cores are the behavioural reference, the wire backend is
    ~20x faster and models LBT-RM/LBT-RU, loss and repair.  ``cores`` refuses a scenario it
    cannot play unless ``lbttcp_fallback`` (then it plays it over LBT-TCP without loss).
    """
    from .cores import CoresBackend

    if name == "wire":
        return WireBackend()
    if name == "cores":
        return CoresBackend(lbttcp_fallback=lbttcp_fallback)
    if name == "auto":
        if CoresBackend.unsupported(scenario):
            return WireBackend()
        return CoresBackend()
    raise ScenarioError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")


def generate(scenario: Scenario, out: str | Path, *, seed: int = 0,
             packets: int | None = None, messages: int | None = None,
             fmt: CaptureFormat | None = None, progress: bool | None = None,
             backend: Backend | str | None = None, chunk_rows: int = 16384) -> GenerationResult:
    """Write ``scenario`` to ``out`` (and ``out.meta.json``); see the module docstring.

    ``packets`` and ``messages`` are exclusive; without either the scenario's own message
    count is used.  ``progress`` None shows a bar only on a terminal and for big runs.
    ``backend`` is a :class:`Backend` or a name of :data:`BACKENDS` (default ``auto``, see
    :func:`select_backend`).
    """
    import time

    scenario.validate()
    if packets is not None and messages is not None:
        raise ScenarioError("give either packets or messages, not both")
    if packets is not None and packets < 1:
        raise ScenarioError("packets must be >= 1")
    if messages is not None and messages < 0:
        raise ScenarioError("messages must be >= 0")
    fmt = fmt or CaptureFormat(scenario.pcapng, scenario.nanosecond, scenario.big_endian)
    if backend is None or isinstance(backend, str):
        backend = select_backend(backend or "auto", scenario)
    if packets is not None:
        per_message, fixed = calibrate(scenario, seed, backend=backend)
        planned = max(1, math.ceil((packets - fixed) / per_message))
        plan = RunPlan(scenario.with_messages(planned), None, planned, seed)
        total = packets
    else:
        count = scenario.messages if messages is None else messages
        plan = RunPlan(scenario.with_messages(count), count, count, seed)
        total = None
    path = Path(out)
    started = time.perf_counter()
    bar = None
    big_run = (packets >= 200_000 if packets is not None
               else (scenario.messages if messages is None else messages) >= 20_000)
    show = progress if progress is not None else (sys.stderr.isatty() and big_run)
    if show:
        from tqdm import tqdm

        bar = tqdm(total=total, unit=" frames", unit_scale=True, desc=f"generate {path.name}",
                   file=sys.stderr, leave=False)
    try:
        with open(path, "wb") as fh:
            writer = CaptureWriter(fh, fmt, scenario.ip_mtu)
            sink = FrameSink(writer, packets, chunk_rows=chunk_rows, progress=bar)
            described = backend.run(plan, sink)
            sink.flush()
    except BaseException:
        path.unlink(missing_ok=True)  # a half-written capture must not pass for a whole one
        raise
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - started
    tallies = sink.tallies()
    expected = _nest(tallies)
    link = writer.link
    expected["frames"] = sink.frames + (link.extra_frames if link is not None else 0)
    if link is not None and link.fragments:  # all but one fragment of each show no UM
        expected["ipv4_fragments"] = link.fragments
        by_transport = expected.setdefault("frames_by_transport", {})
        by_transport["none"] = by_transport.get("none", 0) + link.extra_frames
    meta = {
        "generator": {"backend": backend.name, "seed": seed, **fmt.describe(),
                      "packets": packets, "messages": plan.messages,
                      "planned_messages": plan.planned_messages},
        "scenario": plan.scenario.to_json(),
        "store_port": scenario.store_port,
        "dissect_args": ["--store-port", str(scenario.store_port)],
        "tshark_args": port_map(scenario).tshark_args(),
        "ports": {
            "store": scenario.store_port, "resolver": f"{RESOLVER_HOST}:{RESOLVER_PORT}",
            "resolver_clients": [SOURCE_RESOLVER_PORT, RECEIVER_RESOLVER_PORT,
                                 STORE_RESOLVER_PORT],
            "request": [SOURCE_REQUEST_PORT, RECEIVER_REQUEST_PORT],
            "lbtru": {"source": LBTRU_SOURCE_PORT, "client": LBTRU_CLIENT_PORT},
            "lbtrm": {"groups": list(LBTRM_GROUPS), "dest": LBTRM_DEST_PORT,
                      "source": LBTRM_SOURCE_PORT, "nak_from": LBTRM_NAK_PORT},
            "lbttcp": {"source": LBTTCP_SOURCE_PORT}},
        **described,
        "first_ts_ns": sink.first_ts, "last_ts_ns": sink.last_ts,
        "expected": expected,
    }
    sidecar = path.with_name(path.name + ".meta.json")
    sidecar.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return GenerationResult(path, sidecar, expected["frames"], described["messages_sent"], seconds,
                            meta)

