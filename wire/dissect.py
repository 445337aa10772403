"""``ump dissect``: decode every UM message of a capture with our decoders, optionally
cross-checked field by field against tshark.

Classification follows tshark's own rules so that both sides look at the same frames:

* which frames are UM is :mod:`wire.detect`'s decision (the one detector every tool uses):
  tshark's port rules (decode-as ports, LBMR resolver group and unicast ports, LBT-RU ranges,
  LBT-RM content test with its multicast range and ports), then, unless switched off, the
  content rules that find UM on any port (a clean decode with nothing left over);
* TCP: a connection with a port in the LBT-TCP source, request or store ranges (or a decode-as
  port) whose first data passes the LBMC entry test; each direction is reassembled in sequence
  order and framed by ``msglen``, and a message is reported in the frame that completes it, as
  tshark does;
* IPv4 fragments of a UDP datagram are reassembled (:mod:`wire.ipdefrag`, tshark's
  ``ip.defragment``): the datagram is decoded in the frame whose fragment completes it, and
  the other fragments are reported as not UM (:data:`wire.ipdefrag.HELD`).

Every frame gets a report: its UM messages, or ``not-um`` with the reason it was not taken as
UM, or ``malformed`` with the decoder's reason.  Nothing is skipped silently.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from . import lbmc, lbmr, lbtrm, lbtru
from .detect import CONTENT, PORT, Detector
from .errors import WireError
from .fields import text_bytes
from .ipdefrag import HELD, Defragmenter
from .lbmc import LbmcMessage
from .lbttcp import LbttcpStream, entry_test
from .pcap import TCP_SYN, CaptureRecord, Fragment, Segment, decode_ip, read_capture, udp_segment
from .tshark import Disagreement, PortMap, compare, read_frames, tshark_text


@dataclass
class Occurrence:
    """One protocol unit of a frame, in tshark's vocabulary.

    Attributes:
        protocol: ``lbmc``, ``lbtru``, ``lbtrm`` or ``lbmr`` (the JSON layer name in tshark).
        label: a short Info-style label (``PREG``, ``DATA``, ``TIR``...).
        fields: (display-filter name, value) pairs in wire order.
    """

    protocol: str
    label: str
    fields: list[tuple[str, Any]]


@dataclass
class FrameReport:
    """What we made of one captured frame."""

    number: int
    time: float
    status: str  # "um", "not-um", "malformed", "pending"
    transport: str | None = None  # lbttcp / lbtru / lbtrm / lbmr
    src: str | None = None
    dst: str | None = None
    sport: int | None = None
    dport: int | None = None
    reason: str | None = None
    occurrences: list[Occurrence] = field(default_factory=list)
    classified_by: str | None = None  # "port" or "content" (wire.detect) when UM
    icmp: tuple[int, int] | None = None  # (type, code) when the datagram is quoted in an ICMP
    # error (addresses and ports are then the quoted datagram's): a NAK to a closed port ...
    reassembled: list[int] = field(default_factory=list)  # frames of the IPv4 fragments this
    # frame's datagram was reassembled from (this frame last), as tshark lists them

    def to_json(self) -> dict[str, Any]:
        """Field values as tshark shows them; names with bytes outside ASCII are also given
        as text (UTF-8) under ``utf8``, since tshark's view of them loses those bytes."""
        messages = []
        for o in self.occurrences:
            message: dict[str, Any] = {"protocol": o.protocol, "label": o.label,
                                       "fields": _fields_json(o.fields)}
            texts = {name: value for name, value in o.fields
                     if isinstance(value, str) and tshark_text(value) != value}
            if texts:
                message["utf8"] = texts
            messages.append(message)
        return {
            "frame": self.number, "time": round(self.time, 9), "status": self.status,
            "transport": self.transport, "src": self.src, "sport": self.sport,
            "dst": self.dst, "dport": self.dport, "reason": self.reason,
            "classified_by": self.classified_by,
            "icmp": list(self.icmp) if self.icmp is not None else None,
            "reassembled": self.reassembled or None, "messages": messages,
        }


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return tshark_text(value)
    return value


def _fields_json(fields: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields:
        value = _json_value(value)
        if name in out:
            if not isinstance(out[name], list) or name not in _REPEATED:
                out[name] = [out[name]]
                _REPEATED.add(name)
            out[name].append(value)
        else:
            out[name] = value
    _REPEATED.clear()
    return out


_REPEATED: set[str] = set()


def lbmc_occurrence(message: LbmcMessage, transport_channel: bool = True) -> Occurrence:
    return Occurrence("lbmc", message.label(transport_channel), message.tshark_fields())


# UDP protocol decoders: payload -> occurrences (the carrier, then one per LBMC message).
UdpDecoder = Callable[[bytes], list[Occurrence]]


def _transport_occurrences(packet: lbtru.LbtruPacket | lbtrm.LbtrmPacket) -> list[Occurrence]:
    out = [Occurrence(packet.protocol, packet.info(), packet.tshark_fields())]
    for message in packet.messages():
        thrown = lbmc.tshark_exception(message)
        if thrown is not None:  # tshark marks the datagram Malformed, as we do
            raise WireError("lbmc.extopt", 0, thrown)
        out.append(lbmc_occurrence(message, True))
    return out


def _lbmr_occurrences(payload: bytes) -> list[Occurrence]:
    packet = lbmr.parse_packet(payload)
    return [Occurrence("lbmr", packet.info(), packet.tshark_fields())]


UDP_DECODERS: dict[str, UdpDecoder] = {
    "lbtru": lambda payload: _transport_occurrences(lbtru.parse_packet(payload)),
    "lbtrm": lambda payload: _transport_occurrences(lbtrm.parse_packet(payload)),
    "lbmr": _lbmr_occurrences,
}


def _in(port: int, rng: tuple[int, int]) -> bool:
    return rng[0] <= port <= rng[1]


def classify_udp(seg: Segment, ports: PortMap) -> str | None:
    """Which UM protocol tshark would hand this datagram to (None: not UM): the port rules
    of :mod:`wire.detect` alone, as tshark applies them with the same preferences."""
    found = Detector(ports, content=False).udp(seg)
    return found.protocol if found is not None else None


def tcp_candidate(seg: Segment, ports: PortMap) -> bool:
    """Whether a TCP segment is on a candidate LBT-TCP connection (:mod:`wire.detect`)."""
    return Detector(ports).tcp(seg)


@dataclass
class _Flow:
    stream: LbttcpStream
    next_seq: int | None = None
    accepted: bool = False


class Dissector:
    """Stateful decoder of a capture, frame by frame (TCP streams need the earlier frames).

    Which frames are UM is :class:`wire.detect.Detector`'s decision (port rules, then content
    rules unless ``content`` is false), the same rules ``ump analyze`` applies column-wise."""

    def __init__(self, ports: PortMap | None = None, content: bool = True) -> None:
        self.ports = ports or PortMap()
        self.detector = Detector(self.ports, content)
        self.flows: dict[tuple[str, int, str, int], _Flow] = {}
        self.udp = UDP_DECODERS
        self.fragments: Defragmenter[int] = Defragmenter()

    def frame(self, record: CaptureRecord) -> FrameReport:
        report = FrameReport(record.number, record.ts, "not-um")
        try:
            found = decode_ip(record.linktype, record.data)
            seg = found if isinstance(found, Segment) else self._fragment(found, report)
        except WireError as exc:
            report.reason = exc.reason
            return report
        if seg is None:
            report.reason = HELD
            return report
        report.src, report.dst, report.sport, report.dport = (seg.src, seg.dst, seg.sport,
                                                              seg.dport)
        report.icmp = seg.icmp
        if seg.proto == "udp":
            return self._udp(seg, report)
        return self._tcp(seg, report)

    def _fragment(self, fragment: Fragment, report: FrameReport) -> Segment | None:
        """The whole datagram when this fragment completes it (:mod:`wire.ipdefrag`), in
        this frame as tshark shows it; None while it is incomplete."""
        whole = self.fragments.add(fragment, report.number)
        if whole is None:
            return None
        report.reassembled = whole.tags
        return udp_segment(fragment.src, fragment.dst, whole.payload)

    def _udp(self, seg: Segment, report: FrameReport) -> FrameReport:
        found = self.detector.udp(seg)
        if found is None:
            report.reason = (f"UDP {seg.sport}->{seg.dport} matches no UM port rule"
                             + (" and decodes as no UM protocol" if self.detector.content
                                else ""))
            return report
        proto = report.transport = found.protocol
        report.classified_by = found.how
        decoder = self.udp.get(proto)
        if decoder is None:
            report.status, report.reason = "malformed", f"no {proto} decoder available"
            return report
        try:
            report.occurrences = decoder(seg.payload)
            report.status = "um"
        except WireError as exc:
            report.status, report.reason = "malformed", str(exc)
        return report

    def _tcp(self, seg: Segment, report: FrameReport) -> FrameReport:
        if not self.detector.tcp(seg):
            report.reason = f"TCP {seg.sport}->{seg.dport} matches no LBT-TCP port range"
            return report
        if seg.payload:  # what the detector says: a segment with payload on a candidate
            report.transport, report.classified_by = "lbttcp", PORT
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        flow = self.flows.get(key)
        if flow is None or seg.flags & TCP_SYN:
            flow = self.flows[key] = _Flow(LbttcpStream())
        if seg.flags & TCP_SYN:
            flow.next_seq = (seg.seq + 1) & 0xFFFFFFFF
        data = seg.payload
        if not data:
            report.reason = "TCP segment without payload"
            return report
        if flow.next_seq is None:
            flow.next_seq = seg.seq
        delta = (seg.seq - flow.next_seq) & 0xFFFFFFFF
        if delta >= 0x80000000:  # retransmission of bytes already seen
            overlap = (flow.next_seq - seg.seq) & 0xFFFFFFFF
            if overlap >= len(data):
                report.reason = "TCP retransmission of data already seen"
                return report
            data = data[overlap:]
        elif delta:
            report.status = "malformed"
            report.reason = f"{delta} bytes missing from the capture before this segment"
            flow.stream, flow.accepted = LbttcpStream(), False
        flow.next_seq = (seg.seq + len(seg.payload)) & 0xFFFFFFFF
        report.transport = "lbttcp"
        if not flow.accepted and flow.stream.pending == 0:
            why = entry_test(data)
            if why is not None:
                report.status, report.reason = "not-um", f"LBT-TCP entry test fails: {why}"
                return report
            flow.accepted = True
        try:
            items = flow.stream.feed(data)
        except WireError as exc:
            report.status, report.reason = "malformed", str(exc)
            flow.stream, flow.accepted = LbttcpStream(), False
            return report
        problems = []
        for item in items:
            if item.message is not None:
                transport = _in(seg.sport, self.ports.lbttcp_source) or _in(
                    seg.dport, self.ports.lbttcp_source)
                report.occurrences.append(lbmc_occurrence(item.message, transport))
                thrown = lbmc.tshark_exception(item.message)
                if thrown is not None:
                    problems.append(thrown)
            elif item.error is not None:
                problems.append(str(item.error.shifted(item.offset)))
        if problems:
            report.status, report.reason = "malformed", "; ".join(problems)
        elif report.occurrences:
            report.status = "um"
        elif report.status != "malformed":
            report.status, report.reason = "pending", "part of a message completed later"
        return report

    def run(self, records: Iterable[CaptureRecord]) -> Iterator[FrameReport]:
        for record in records:
            yield self.frame(record)


def dissect_file(path: str | Path, ports: PortMap | None = None, content: bool = True,
                 ) -> Iterator[FrameReport]:
    return Dissector(ports, content).run(read_capture(path))


def check_against_tshark(path: str | Path, reports: list[FrameReport],
                         ports: PortMap | None = None) -> list[Disagreement]:
    """Every field where our reports and tshark's dissection of ``path`` differ.

    Raises :class:`~wire.tshark.TsharkRefused` when tshark cannot read ``path`` at all (``ump
    dissect`` then keeps its own report and says so in one line, exit status 2).

    tshark finds UM by its port preferences only; frames :mod:`wire.detect` found by content
    are shown to it with decode-as rules for their ports (:func:`content_ports`), so they
    are compared too.  So are the LBT-TCP connections tshark gives to another protocol:
    its LBT-TCP dissector is a heuristic, tried only after the dissectors registered on
    either TCP port, so a connection whose client's ephemeral port is registered to another
    protocol (44321, PCP) is dissected as that protocol; ``--check-tshark`` decodes both
    ports of every LBT-TCP connection we call UM as LBT-TCP, and compares its values."""
    theirs = {f.number: f for f in read_frames(path, content_ports(ports or PortMap(),
                                                                   reports))}
    problems: list[Disagreement] = []
    for report in reports:
        frame = theirs.get(report.number)
        if frame is None:
            problems.append(Disagreement(report.number, "frame", "present", None))
            continue
        if frame.malformed and report.status == "um":
            problems.append(Disagreement(report.number, "_ws.malformed", None,
                                         "; ".join(frame.malformed)))
        for proto in ("lbmc", "lbtru", "lbtrm", "lbmr"):
            ours = [o for o in report.occurrences if o.protocol == proto]
            their = frame.occurrences(proto)
            if report.status != "um" and not ours:
                continue
            if len(ours) != len(their):
                problems.append(Disagreement(report.number, f"{proto} (occurrences)",
                                             str(len(ours)), str(len(their))))
                continue
            for mine, other in zip(ours, their, strict=True):
                problems += compare(report.number, mine.fields, other)
    return problems


def content_ports(ports: PortMap, reports: Iterable[FrameReport]) -> PortMap:
    """``ports`` plus decode-as ports for what tshark would not dissect as we do: per UDP
    protocol, the destination port of each frame classified by content (tshark's ``-d
    udp.port==P,proto`` then decodes them as we did); and both ports of each LBT-TCP
    segment we call UM (:func:`check_against_tshark`: a dissector registered on the other
    port would take it first).  Frames on those ports we call not UM are not compared."""
    extra: dict[str, set[int]] = {"lbtrm": set(), "lbtru": set(), "lbmr": set(),
                                  "lbttcp": set()}
    for report in reports:
        if report.transport == "lbttcp" and report.status == "um":
            extra["lbttcp"].update(p for p in (report.sport, report.dport) if p)
        elif report.classified_by == CONTENT and report.transport in extra and report.dport:
            extra[report.transport].add(report.dport)
    if not any(extra.values()):
        return ports
    return replace(ports, lbtrm_ports=sorted({*ports.lbtrm_ports, *extra["lbtrm"]}),
                   lbtru_ports=sorted({*ports.lbtru_ports, *extra["lbtru"]}),
                   lbmr_ports=sorted({*ports.lbmr_ports, *extra["lbmr"]}),
                   lbttcp_ports=sorted({*ports.lbttcp_ports, *extra["lbttcp"]}))


# --- text output -----------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    """A field value for the text output.  A name is shown as tshark shows it (a byte outside
    ASCII is U+FFFD there), followed, when that lost bytes, by its UTF-8 reading (or its bytes
    in hex if they are not UTF-8)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex() or '""'
    if isinstance(value, str):
        shown = tshark_text(value)
        if shown == value:
            return repr(value)
        raw = text_bytes(value)
        try:
            return f"{shown!r}(utf-8:{raw.decode('utf-8')!r})"
        except UnicodeDecodeError:
            return f"{shown!r}(bytes:{raw.hex()})"
    return str(int(value)) if isinstance(value, int) else str(value)


DISPLAY_NAMES = {"lbttcp": "LBT-TCP", "lbtru": "LBT-RU", "lbtrm": "LBT-RM", "lbmr": "LBMR"}
"""tshark's protocol column names."""


def _frame_ranges(numbers: list[int]) -> str:
    """Frame numbers as tshark lists them, runs of consecutive ones shortened: ``#9-#12, #15``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"#{a}" if a == b else f"#{a}-#{b}" for a, b in runs)


def print_report(report: FrameReport, out: TextIO, verbose: bool = True) -> None:
    where = ""
    if report.src is not None:
        where = f"{report.src}:{report.sport} -> {report.dst}:{report.dport} "
    labels = " ".join(o.label for o in report.occurrences if o.label)
    proto = DISPLAY_NAMES.get(report.transport or "", "")
    if report.icmp is not None:
        where = f"ICMP type {report.icmp[0]} code {report.icmp[1]} quoting {where}"
    if report.reassembled:
        where = (f"{where}[{len(report.reassembled)} IPv4 fragments: "
                 f"{_frame_ranges(report.reassembled)}] ")
    head = f"{report.number:6d} {report.time:14.6f} {where}{proto}"
    if report.status == "um":
        out.write(f"{head} {labels}\n")
    else:
        out.write(f"{head} [{report.status}] {report.reason or ''}\n")
        if report.status != "malformed" or not report.occurrences:
            return
    if not verbose:
        return
    for occ in report.occurrences:
        out.write(f"         {occ.protocol} {occ.label}\n")
        line = "           "
        for name, value in occ.fields:
            item = f"{name}={_fmt(value)} "
            if len(line) + len(item) > 110:
                out.write(line.rstrip() + "\n")
                line = "           "
            line += item
        if line.strip():
            out.write(line.rstrip() + "\n")


def write_json(reports: Iterable[FrameReport], out: TextIO) -> None:
    out.write("[\n")
    first = True
    for report in reports:
        if not first:
            out.write(",\n")
        out.write(json.dumps(report.to_json()))
        first = False
    out.write("\n]\n")


def summary(reports: list[FrameReport]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.status] = counts.get(r.status, 0) + 1
    counts["messages"] = sum(len(r.occurrences) for r in reports)
    counts["content"] = sum(r.classified_by == CONTENT for r in reports)
    return counts


def main_stream() -> TextIO:
    return sys.stdout
